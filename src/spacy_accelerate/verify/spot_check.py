"""The spot check of a cached calibrated model: a few of the calibration items it was
proven on, kept in its cache entry.

A warm start cannot afford to run the pipeline over the calibration texts
again; the entry was built and judged on all of them under the same texts,
bounds and heads (all in the key). Re-running the live PyTorch module and the session
on a few stored items still catches a runtime that computes differently
than the one the model was proven with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.cache.untrusted import CorruptEntry, read_int_arrays
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


def recorded_mean(parity: Mapping[str, Any], name: str) -> float | None:
    """The stored items' mean cosine recorded in ``parity`` (the file ``name``) when the
    model was built; None where none is recorded. :class:`CorruptEntry` where it is not a
    cosine: a lower figure would loosen the spot check's gate."""
    mean = parity.get("spot_check_mean_cosine")
    if mean is not None and not (isinstance(mean, float) and -1.0 <= mean <= 1.0):
        raise CorruptEntry(f"{name} records a mean cosine of {str(mean)[:40]}")
    return mean


#: The most numbers one stored array may hold (this release keeps a few batches).
MAX_ITEM_VALUES = 1024 * 1024


#: The arrays of one stored item, in :meth:`EncoderInputs.feeds`' names.
ITEM_ARRAYS = ("input_ids", "attention_mask", "token_type_ids")


def save_spot_check(items: Sequence[EncoderInputs], folder: Path) -> list[EncoderInputs]:
    """Keep the first items in ``folder`` (which becomes the cache entry); returns them."""
    kept = list(items[:SPOT_CHECK_ITEMS])
    arrays = {
        f"{index}.{name}": array
        for index, item in enumerate(kept)
        for name, array in item.feeds(ITEM_ARRAYS).items()
    }
    np.savez(folder / SPOT_CHECK_FILE, **arrays)  # type: ignore[arg-type]  # numpy's stub
    return kept


def load_spot_check(path: Path) -> list[EncoderInputs]:
    """The items :func:`save_spot_check` kept, or
    :class:`~spacy_accelerate.cache.untrusted.CorruptEntry` where the file holds anything
    else (it may come with a pipeline from elsewhere)."""
    arrays = read_int_arrays(path, SPOT_CHECK_FILE)
    count = len(arrays) // len(ITEM_ARRAYS)
    names = [[f"{index}.{name}" for name in ITEM_ARRAYS] for index in range(count)]
    if not 0 < count <= SPOT_CHECK_ITEMS or set(arrays) != {n for item in names for n in item}:
        raise CorruptEntry(f"{SPOT_CHECK_FILE} does not hold the items this release keeps")
    items = []
    for item in names:
        ids, mask, types = (arrays[name] for name in item)
        if not ids.shape == mask.shape == types.shape or not 0 < ids.size <= MAX_ITEM_VALUES:
            raise CorruptEntry(f"{SPOT_CHECK_FILE} holds arrays of unequal, empty or huge shapes")
        items.append(EncoderInputs(*(array.astype(np.int64) for array in (ids, mask, types))))
    return items


def check_items(items: Sequence[EncoderInputs], spec: EncoderSpec) -> None:
    """:class:`~spacy_accelerate.cache.untrusted.CorruptEntry` unless every stored item is
    one ``spec``'s encoder can take: ids in its vocabulary, a 0/1 mask, token types it
    has, rows no longer than it allows."""
    for item in items:
        fits = (
            item.shape[1] <= spec.longest_input
            and _within(item.input_ids, spec.vocab_size)
            and _within(item.attention_mask, 2)
            and _within(item.token_type_ids, max(1, spec.type_vocab_size))
        )
        if not fits:
            raise CorruptEntry(f"{SPOT_CHECK_FILE} holds items this model cannot take")


def _within(array: np.ndarray, bound: int) -> bool:
    return bool(((array >= 0) & (array < bound)).all())
