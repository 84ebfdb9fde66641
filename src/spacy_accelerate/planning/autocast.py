"""PyTorch's own autocast around a pipeline's transformer: what bf16 is held to.

A bf16 plan is served only if it annotates the calibration texts at least as faithfully
as PyTorch's bf16 autocast of the same pipeline (within
:data:`~spacy_accelerate.verify.agreement.AUTOCAST_MARGIN`); the benchmarks run the same
module as the autocast baseline.
"""

from __future__ import annotations

from functools import singledispatch
from typing import Any

import torch
from curated_transformers.models.output import PyTorchTransformerOutput
from transformers.utils import ModelOutput

from spacy_accelerate.pipeline.patch import StandIn


@singledispatch
def _as_float32(output: Any) -> Any:
    return output.float() if isinstance(output, torch.Tensor) else output


@_as_float32.register
def _(output: PyTorchTransformerOutput) -> PyTorchTransformerOutput:
    first, *layers = output.all_outputs
    return PyTorchTransformerOutput(
        embedding_output=first.float(), layer_hidden_states=[layer.float() for layer in layers]
    )


@_as_float32.register
def _(output: ModelOutput) -> ModelOutput:
    fields = {
        key: tuple(v.float() for v in value) if isinstance(value, tuple) else value.float()
        for key, value in output.items()
    }
    return type(output)(**fields)


class AutocastModule(StandIn):
    """Runs the wrapped transformer under ``torch.autocast``; hands spaCy float32, as usual."""

    def __init__(self, inner: torch.nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner = inner
        self.device_type = device_type
        self.dtype = dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return _as_float32(self.inner(*args, **kwargs))
