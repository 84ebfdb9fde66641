"""Step 8: swap the proxy into the shim, and undo it.

Two attributes change: the shim's module becomes the proxy, and the thinc
wrapper's ``convert_inputs`` is wrapped so that every call tells the module
whether the listeners read all layers. Passing the flag per call (instead of
the proxy reading it from a layer it holds) keeps copies of the model
(``Model.copy()``, ``copy.deepcopy``) correct: each copy's own layer decides.
The originals are kept on the proxy and the wrapper, so ``restore()`` needs no
registry that could drift from the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from thinc.api import Model
from thinc.types import ArgsKwargs

from .proxy import ALL_LAYERS_KWARG, AcceleratedEncoder, AcceleratedModule
from .shim import ShimLocation

#: Set by spacy-curated-transformers on the wrapper before every call: whether
#: the listeners read every layer or only the last one.
ALL_LAYERS_ATTR = "_all_layer_outputs"
CONVERT_INPUTS = "convert_inputs"


@dataclass(frozen=True)
class PassLayerFlag:
    """A ``convert_inputs`` that also passes the wrapper's all-layers flag."""

    inner: Callable[..., tuple[ArgsKwargs, Callable[..., Any]]]

    def __call__(self, model: Model, X: Any, is_train: bool) -> tuple[ArgsKwargs, Callable]:
        inputs, backprop = self.inner(model, X, is_train)
        flag = bool(model.attrs.get(ALL_LAYERS_ATTR, True))
        kwargs = {**inputs.kwargs, ALL_LAYERS_KWARG: flag}
        return ArgsKwargs(args=inputs.args, kwargs=kwargs), backprop


def patch(location: ShimLocation, proxy: AcceleratedModule) -> None:
    # Only curated encoders take the flag; spacy-transformers' models read
    # output_hidden_states from their own config.
    convert = location.layer.attrs[CONVERT_INPUTS]
    if isinstance(proxy, AcceleratedEncoder) and not isinstance(convert, PassLayerFlag):
        location.layer.attrs[CONVERT_INPUTS] = PassLayerFlag(convert)
    location.shim._model = proxy


def reads_all_layers(location: ShimLocation) -> bool:
    """Whether the pipeline reads every layer of this transformer (what warm-up runs)."""
    proxy = location.shim._model
    if isinstance(proxy, AcceleratedEncoder):
        return bool(location.layer.attrs.get(ALL_LAYERS_ATTR, True))
    config = getattr(location.pytorch_module, "config", None)
    return bool(getattr(config, "output_hidden_states", False))


def is_patched(location: ShimLocation) -> bool:
    return isinstance(location.shim._model, AcceleratedModule)


def unpatch(location: ShimLocation) -> bool:
    """Put the original module back; return whether there was anything to undo."""
    convert = location.layer.attrs.get(CONVERT_INPUTS)
    if isinstance(convert, PassLayerFlag):
        location.layer.attrs[CONVERT_INPUTS] = convert.inner
    proxy = location.shim._model
    if not isinstance(proxy, AcceleratedModule):
        return False
    location.shim._model = proxy.original
    return True


def revert(location: ShimLocation, previous: torch.nn.Module) -> None:
    """Return ``location`` to the module it held before this call (proxy or original)."""
    if isinstance(previous, AcceleratedModule):
        patch(location, previous)
    else:
        unpatch(location)
