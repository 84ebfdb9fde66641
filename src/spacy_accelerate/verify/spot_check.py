"""The spot check of a cached calibrated model: a few of the calibration items it was
proven on, kept in its cache entry.

A warm start cannot afford to run the pipeline over the calibration texts
again; the entry was built and judged on all of them under the same texts,
bounds and heads (all in the key). Re-running the live PyTorch module and the session
on a few stored items still catches a runtime that computes differently
than the one the model was proven with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.options.gate import Gate

#: How many calibration items are kept, and where.
SPOT_CHECK_ITEMS = 2
SPOT_CHECK_FILE = "spot_check.npz"


#: How far the spot items' mean cosine may fall below what they had when the model was
#: built: the same runtime gives the same figure; a different one must not drift more.
SPOT_CHECK_MARGIN = 1e-3


def spot_check_gate(gate: Gate, recorded_mean: float | None) -> Gate:
    """The gate of a warm start's spot check. The mean bound was proven over every
    calibration item; the few stored ones may average lower, so they are held to their
    own figure at build time (less the margin), never to more than the full bound."""
    if gate.min_mean_cosine is None or recorded_mean is None:
        return gate
    bound = min(gate.min_mean_cosine, float(recorded_mean) - SPOT_CHECK_MARGIN)
    return replace(gate, min_mean_cosine=bound)


def save_spot_check(items: Sequence[EncoderInputs], folder: Path) -> list[EncoderInputs]:
    """Keep the first items in ``folder`` (which becomes the cache entry); returns them."""
    kept = list(items[:SPOT_CHECK_ITEMS])
    arrays = {
        f"{index}.{name}": array
        for index, item in enumerate(kept)
        for name, array in item.feeds(("input_ids", "attention_mask", "token_type_ids")).items()
    }
    np.savez(folder / SPOT_CHECK_FILE, **arrays)  # type: ignore[arg-type]  # numpy's stub
    return kept


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
