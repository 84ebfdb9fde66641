"""CPU runs without most of spaCy's padding: the rows of a batch grouped by length.

spaCy pads every span of a batch to the longest one. With strided windows
(128 pieces, stride 96 in ``en_core_web_trf``) each document's last window
is short, so much of a batch made from real text is padding (measured:
``padded_share`` in ``benchmarks/results/length_groups-*.json``). On a CPU
the encoder's cost grows with the positions it runs, so the rows are sorted
by length and run in a few groups, each cut to the length of its longest
row.

What spaCy reads does not change: the attention mask already keeps padding
out of every real piece's attention, and positions count from the row's
start, so a row's real pieces get the same states up to float rounding
(ONNX Runtime's dynamic int8 scales each call's activations, so there the
states change within the int8 gate; the parity gate measures this path).
Positions past a group's length come back as zeros where PyTorch has the
padding tokens' states. No component reads them; spacy-transformers does
keep them in ``doc._.trf_data`` (``model_output``, ``tensors``), padded
rows and all, so code that reads padding there sees zeros. A row ends after
its last unmasked piece: a piece encoder that emitted the padding id from
text as a span's last piece would get a zero state there (the piece
encoders of spaCy's transformer packages do not emit it from text).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: Group lengths are rounded up to a multiple of this: fewer distinct shapes for the
#: runtimes' per-shape kernel caches, at most 15 padded positions per row.
LENGTH_MULTIPLE = 16

#: What one more group costs, in positions: a call's fixed work and smaller matrix
#: products. Two groups are only made where they save more padding than this.
GROUP_COST = 64

MASK = "attention_mask"

#: A runtime's call: feeds and output names in, one array per name out.
ArrayRun = Callable[[Mapping[str, np.ndarray], Sequence[str]], list[np.ndarray]]


@dataclass(frozen=True)
class RowGroup:
    """Rows of the batch (indices) run together, cut to ``length`` positions."""

    rows: np.ndarray
    length: int


def row_lengths(mask: np.ndarray) -> np.ndarray:
    """Per row, one past its last real position (masked positions inside a row stay
    inside: a piece encoder may emit the padding piece from text)."""
    real = np.asarray(mask) != 0
    width = real.shape[1]
    last = width - np.argmax(real[:, ::-1], axis=1)
    return np.where(real.any(axis=1), last, 1)  # a row of nothing still runs one position


def plan_groups(lengths: np.ndarray, width: int) -> list[RowGroup]:
    """The grouping of rows by length that runs the fewest positions, counting
    :data:`GROUP_COST` per group (an exact search over the distinct rounded lengths)."""
    rounded = np.minimum(-(-np.asarray(lengths) // LENGTH_MULTIPLE) * LENGTH_MULTIPLE, width)
    order = np.argsort(rounded, kind="stable")
    sizes = rounded[order]
    # Candidate cuts: after the last row of each distinct rounded length.
    ends = [int(i) + 1 for i in np.flatnonzero(np.diff(sizes))] + [len(sizes)]
    best = [0.0] + [np.inf] * len(ends)
    cut_from = [0] * (len(ends) + 1)
    for j, end in enumerate(ends, start=1):
        for i in range(j):
            start = ends[i - 1] if i else 0
            cost = best[i] + (end - start) * int(sizes[end - 1]) + GROUP_COST
            if cost < best[j]:
                best[j], cut_from[j] = cost, i
    groups: list[RowGroup] = []
    j = len(ends)
    while j:
        i = cut_from[j]
        start, end = (ends[i - 1] if i else 0), ends[j - 1]
        groups.append(RowGroup(rows=order[start:end], length=int(sizes[end - 1])))
        j = i
    return groups[::-1]


def run_by_length(
    run: ArrayRun,
    feeds: Mapping[str, np.ndarray],
    names: Sequence[str],
    *,
    borrowed: bool,
) -> list[np.ndarray]:
    """``run`` over the batch in groups of rows of similar length; the outputs put back
    in the batch's order and shape, zeros at the positions no group ran.

    ``borrowed``: ``run`` returns buffers it reuses on its next call (OpenVINO's
    infer request); they are copied before the next group runs."""
    mask = feeds.get(MASK)
    if mask is None or mask.ndim != 2 or 0 in mask.shape:
        return _owned(run(feeds, names), borrowed)
    rows, width = mask.shape
    groups = plan_groups(row_lengths(mask), width)
    if len(groups) == 1 and groups[0].length == width:
        return _owned(run(feeds, names), borrowed)
    outputs: list[np.ndarray] = []
    for group in groups:
        sub = {name: array[group.rows, : group.length] for name, array in feeds.items()}
        for index, result in enumerate(run(sub, names)):
            if index == len(outputs):  # shaped after the first group's result
                tail = (width, *result.shape[2:]) if result.ndim >= 3 else result.shape[1:]
                outputs.append(np.zeros((rows, *tail), result.dtype))
            if result.ndim >= 3:  # (rows, positions, width): hidden states
                outputs[index][group.rows, : group.length] = result
            else:  # (rows, width): a pooled output
                outputs[index][group.rows] = result
    return outputs


def _owned(arrays: list[np.ndarray], borrowed: bool) -> list[np.ndarray]:
    return [np.array(array, copy=True) for array in arrays] if borrowed else arrays
