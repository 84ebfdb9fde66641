"""The spot check of a cached calibrated model: a few of the calibration items it was
proven on, kept in its cache entry.

A warm start cannot afford to run the pipeline over the calibration texts
again; the entry was built and judged on all of them under the same texts and
bounds (both in the key). Re-running the live PyTorch module and the session
on a few stored items still catches a runtime that computes differently
than the one the model was proven with.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .encoder_inputs import EncoderInputs

#: How many calibration items are kept, and where.
SPOT_CHECK_ITEMS = 2
SPOT_CHECK_FILE = "spot_check.npz"


def save_spot_check(items: Sequence[EncoderInputs], folder: Path) -> None:
    """Keep the first items in ``folder`` (which becomes the cache entry)."""
    arrays = {
        f"{index}.{name}": array
        for index, item in enumerate(items[:SPOT_CHECK_ITEMS])
        for name, array in item.feeds(("input_ids", "attention_mask", "token_type_ids")).items()
    }
    np.savez(folder / SPOT_CHECK_FILE, **arrays)


def load_spot_check(path: Path) -> list[EncoderInputs]:
    with np.load(path, allow_pickle=False) as stored:
        count = len(stored.files) // 3
        return [
            EncoderInputs(
                stored[f"{index}.input_ids"],
                stored[f"{index}.attention_mask"],
                stored[f"{index}.token_type_ids"],
            )
            for index in range(count)
        ]
