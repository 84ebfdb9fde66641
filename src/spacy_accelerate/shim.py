"""Step 2: walk a transformer component's thinc model to its PyTorch shim.

The torch module lives in ``PyTorchShim._model``; replacing that attribute is
the whole of the patch, so everything around it (span striding, padding,
unpadding, listeners) stays spaCy's own code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from spacy_curated_transformers.models.with_strided_spans import with_strided_spans_forward
from thinc.api import Model
from thinc.shims import PyTorchShim

from .errors import UnsupportedArchitectureError
from .proxy import AcceleratedEncoder
from .validate import TransformerComponent


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

    @property
    def pytorch_module(self) -> torch.nn.Module:
        """The PyTorch module, also when a proxy stands in for it."""
        module = self.shim._model
        return module.original if isinstance(module, AcceleratedEncoder) else module


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
            "model layout; please report the pipeline's config if it should be supported."
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


def find_span_settings(component: TransformerComponent) -> SpanSettings:
    """The strided-span settings of ``component``: the shapes its transformer will see."""
    for node in component.pipe.model.walk():
        if node._func is with_strided_spans_forward:
            return SpanSettings(
                window=int(node.attrs["window"]),
                stride=int(node.attrs["stride"]),
                batch_size=int(node.attrs["batch_size"]),
            )
    return DEFAULT_SPANS
