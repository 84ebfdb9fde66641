"""Step 2: walk a transformer component's thinc model to its PyTorch shim.

The torch module lives in ``PyTorchShim._model``; replacing that attribute is
the whole of the patch, so everything around it (span striding, padding,
unpadding, listeners) stays spaCy's own code.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import singledispatch
from typing import Any

import torch
from spacy.pipeline import TrainablePipe
from spacy_curated_transformers.models.with_strided_spans import with_strided_spans_forward
from thinc.api import Model
from thinc.shims import PyTorchShim

from spacy_accelerate.errors import UnsupportedArchitectureError
from spacy_accelerate.pipeline.components import (
    CuratedTransformerPipe,
    HFTransformerPipe,
    TransformerComponent,
)
from spacy_accelerate.serving.proxy import AcceleratedModule


@dataclass(frozen=True)
class ShimLocation:
    """The shim of one component and the thinc layer that owns it."""

    component: str
    layer: Model
    shim: PyTorchShim

    @property
    def module(self) -> torch.nn.Module:
        """What the shim runs now: the PyTorch module or an accelerated proxy."""
        return self.shim._model

    def read_pytorch_module(self) -> torch.nn.Module:
        """The PyTorch module, also when a proxy stands in for it, with its weights (read
        back where they were parked: :mod:`spacy_accelerate.serving.parked_weights`)."""
        module: torch.nn.Module = self.shim._model
        return module.read_original() if isinstance(module, AcceleratedModule) else module

    @property
    def pytorch_shell(self) -> torch.nn.Module:
        """The PyTorch module's structure and config, its weights not read back."""
        module: torch.nn.Module = self.shim._model
        return module.shell if isinstance(module, AcceleratedModule) else module


def find_shim(component: TransformerComponent) -> ShimLocation:
    """Return the single PyTorch shim inside ``component``'s model."""
    found = [
        ShimLocation(component=component.name, layer=node, shim=shim)
        for node in component.pipe.model.walk()
        for shim in node.shims
        if isinstance(shim, PyTorchShim)
    ]
    if len(found) != 1:
        raise UnsupportedArchitectureError(
            f"Expected exactly one PyTorch model inside component {component.name!r}, found "
            f"{len(found)}. spacy-accelerate supports the standard spacy-curated-transformers "
            "and spacy-transformers model layouts; please report the pipeline's config if it "
            "should be supported."
        )
    return found[0]


@dataclass(frozen=True)
class SpanSettings:
    """How the component cuts documents into spans for the transformer."""

    window: int
    stride: int
    batch_size: int


#: spacy-curated-transformers' defaults (``WithStridedSpans.v1``).
DEFAULT_SPANS = SpanSettings(window=128, stride=96, batch_size=384)

#: The longest piece sequence checked and warmed up for spacy-transformers,
#: whose spans are cut in spaCy tokens and so come out at any piece length up
#: to the tokenizer's limit.
LONGEST_CHECKED_PIECES = 512


def find_span_settings(component: TransformerComponent) -> SpanSettings:
    """The shapes the transformer of ``component`` will see."""
    return _span_settings(component.pipe)


@singledispatch
def _span_settings(pipe: TrainablePipe) -> SpanSettings:
    return DEFAULT_SPANS


@_span_settings.register
def _(pipe: CuratedTransformerPipe) -> SpanSettings:
    for node in pipe.model.walk():
        if node._func is with_strided_spans_forward:
            return SpanSettings(
                window=int(node.attrs["window"]),
                stride=int(node.attrs["stride"]),
                batch_size=int(node.attrs["batch_size"]),
            )
    return DEFAULT_SPANS


if HFTransformerPipe is not None:

    @_span_settings.register
    def _(pipe: HFTransformerPipe) -> SpanSettings:
        # Spans are truncated to the tokenizer's limit (often unset: a huge number).
        model: Any = pipe.model  # spacy-transformers sets .tokenizer on it; thinc types it not
        tokenizer = model.tokenizer
        limit = int(min(tokenizer.model_max_length, LONGEST_CHECKED_PIECES))
        return SpanSettings(window=limit, stride=limit, batch_size=DEFAULT_SPANS.batch_size)
