"""The PyTorch transformer over a batch's rows grouped by length, as the served sessions run.

spaCy pads every span of a batch to its longest one, and the calibration reference (the
PyTorch pipeline over the calibration texts) would spend much of its time on padding. The
served models run a batch in groups of rows of similar length
(:mod:`~spacy_accelerate.runtime.length_groups`); :func:`call_in_row_groups` runs the
PyTorch module the same way and puts its outputs back in the batch's shape.

What spaCy reads does not change: the attention mask keeps padding out of every real
piece's attention, and positions count from each row's start, so the real pieces get the
same states up to float rounding. Positions past a group's length come back as zeros.
Where the call has no attention mask (the module would attend to the padding), or returns
something other than hidden states and pooled outputs (attention weights), the batch runs
whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import singledispatch
from typing import Any

import numpy as np
import torch
from curated_transformers.models.attention import AttentionMask
from curated_transformers.models.curated_transformer import CuratedTransformer
from curated_transformers.models.output import PyTorchTransformerOutput
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from spacy_accelerate.runtime.length_groups import RowGroup, plan_groups, row_lengths


class _Ungroupable(Exception):
    """An output :func:`_merged` cannot put back in the batch's shape."""


def call_in_row_groups(
    module: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any], mask: np.ndarray
) -> Any:
    """``module(*args, **kwargs)`` for a batch whose attention mask is ``mask`` (rows,
    positions), run in groups of rows of similar length (see the module's docstring)."""
    rows, width = mask.shape
    groups = plan_groups(row_lengths(mask), width)
    if not _masks_padding(module, kwargs) or (len(groups) == 1 and groups[0].length == width):
        return module(*args, **kwargs)
    parts = []
    for group in groups:
        index = torch.from_numpy(group.rows)
        sliced = [_sliced(value, index, group.length, rows, width) for value in args]
        named = {
            key: _sliced(value, index, group.length, rows, width) for key, value in kwargs.items()
        }
        parts.append(module(*sliced, **named))
    try:
        return _merged(parts[0], parts, groups, rows, width)
    except _Ungroupable:
        return module(*args, **kwargs)


@singledispatch
def _masks_padding(module: torch.nn.Module, kwargs: dict[str, Any]) -> bool:
    """Whether ``module`` called with ``kwargs`` keeps the padding out of the real pieces'
    attention: only then may a group drop the padding positions."""
    return False


@_masks_padding.register
def _(module: CuratedTransformer, kwargs: dict[str, Any]) -> bool:
    return True  # with no mask given, it masks the padding pieces itself


@_masks_padding.register
def _(module: PreTrainedModel, kwargs: dict[str, Any]) -> bool:
    return isinstance(kwargs.get("attention_mask"), torch.Tensor)  # else it attends to all


@singledispatch
def _sliced(value: Any, rows: torch.Tensor, length: int, batch: int, width: int) -> Any:
    """An argument of the call for ``rows`` cut to ``length`` positions (flags pass)."""
    return value


@_sliced.register
def _(value: torch.Tensor, rows: torch.Tensor, length: int, batch: int, width: int) -> Any:
    if value.ndim < 2 or value.shape[0] != batch or value.shape[-1] != width:
        return value
    return value[rows][..., :length]


@_sliced.register
def _(value: AttentionMask, rows: torch.Tensor, length: int, batch: int, width: int) -> Any:
    return AttentionMask(_sliced(value.bool_mask, rows, length, batch, width))


@singledispatch
def _merged(first: Any, parts: list[Any], groups: list[RowGroup], batch: int, width: int) -> Any:
    """The groups' outputs (``parts``, each like ``first``) as one batch's output."""
    raise _Ungroupable(type(first).__name__)


@_merged.register
def _(first: None, parts: list[Any], groups: list[RowGroup], batch: int, width: int) -> Any:
    return None


@_merged.register
def _(first: torch.Tensor, parts: list[Any], groups: list[RowGroup], batch: int, width: int) -> Any:
    if first.ndim == 3:  # (rows, positions, width): hidden states
        out = first.new_zeros((batch, width, first.shape[2]))
        for group, part in zip(groups, parts, strict=True):
            out[torch.from_numpy(group.rows), : group.length] = part
        return out
    if first.ndim == 2 and first.shape[0] == len(groups[0].rows):  # (rows, width): pooled
        out = first.new_zeros((batch, first.shape[1]))
        for group, part in zip(groups, parts, strict=True):
            out[torch.from_numpy(group.rows)] = part
        return out
    raise _Ungroupable(f"a tensor of shape {tuple(first.shape)}")


@_merged.register
def _(first: tuple, parts: list[Any], groups: list[RowGroup], batch: int, width: int) -> Any:
    return tuple(
        _merged(item, [part[k] for part in parts], groups, batch, width)
        for k, item in enumerate(first)
    )


@_merged.register
def _(
    first: PyTorchTransformerOutput,
    parts: list[Any],
    groups: list[RowGroup],
    batch: int,
    width: int,
) -> Any:
    layers = [
        _merged(layer, [part.all_outputs[k] for part in parts], groups, batch, width)
        for k, layer in enumerate(first.all_outputs)
    ]
    return PyTorchTransformerOutput(embedding_output=layers[0], layer_hidden_states=layers[1:])


@_merged.register
def _(first: ModelOutput, parts: list[Any], groups: list[RowGroup], batch: int, width: int) -> Any:
    fields = {
        key: _merged(value, [part[key] for part in parts], groups, batch, width)
        for key, value in first.items()
    }
    return type(first)(**fields)
