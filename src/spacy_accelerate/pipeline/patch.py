"""Steps 8 and 9: swap the proxy into the shim (and warm it up), and undo it.

Two attributes change: the shim's module becomes the proxy, and the thinc
wrapper's ``convert_inputs`` is wrapped so that every call tells the module
whether the listeners read all layers. Passing the flag per call (instead of
the proxy reading it from a layer it holds) keeps copies of the model
(``Model.copy()``, ``copy.deepcopy``) correct: each copy's own layer decides.
The flag goes only to an accelerated encoder, read from the shim in the same
batch (:mod:`.swap` keeps the module fixed for a batch in flight), so a PyTorch
module put back while another thread annotates never receives it. ``restore()``
takes the wrapper and the guard off again (:func:`unguard`), once no batch is in
flight. The originals are kept on the proxy and the wrapper.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from spacy.language import Language
from thinc.api import Model
from thinc.shims import PyTorchShim
from thinc.types import ArgsKwargs

from spacy_accelerate.cpu_budget import BUDGET
from spacy_accelerate.pipeline.components import TransformerComponent, transformer_components
from spacy_accelerate.pipeline.shim import ShimLocation, SpanSettings, find_shim
from spacy_accelerate.pipeline.swap import (
    held_exclusively,
    install_guard,
    remove_guard,
    scoped_module,
    swap_module,
)
from spacy_accelerate.pipeline.warmup import warm_up
from spacy_accelerate.serving.proxy import ALL_LAYERS_KWARG, AcceleratedEncoder, AcceleratedModule

#: Set by spacy-curated-transformers on the wrapper before every call: whether
#: the listeners read every layer or only the last one.
ALL_LAYERS_ATTR = "_all_layer_outputs"
CONVERT_INPUTS = "convert_inputs"


@dataclass(frozen=True)
class PassLayerFlag:
    """A ``convert_inputs`` that also passes the wrapper's all-layers flag to an
    accelerated encoder."""

    inner: Callable[..., tuple[ArgsKwargs, Callable[..., Any]]]

    def __call__(self, model: Model, X: Any, is_train: bool) -> tuple[ArgsKwargs, Callable]:
        inputs, backprop = self.inner(model, X, is_train)
        shims = [shim for shim in model.shims if isinstance(shim, PyTorchShim)]
        if not shims or not isinstance(shims[0]._model, AcceleratedEncoder):
            return inputs, backprop
        flag = bool(model.attrs.get(ALL_LAYERS_ATTR, True))
        kwargs = {**inputs.kwargs, ALL_LAYERS_KWARG: flag}
        return ArgsKwargs(args=inputs.args, kwargs=kwargs), backprop


def guard(location: ShimLocation) -> None:
    """Make ``location``'s layer safe to swap while other threads run it (idempotent)."""
    install_guard(location.layer)
    convert = location.layer.attrs.get(CONVERT_INPUTS)
    if convert is not None and not isinstance(convert, PassLayerFlag):
        location.layer.attrs[CONVERT_INPUTS] = PassLayerFlag(convert)


class StandIn(torch.nn.Module):
    """A module run in a shim in place of its PyTorch module ``inner`` for a comparison
    (PyTorch's autocast, a PyTorch user's compiled encoder: ``bench``), put in with
    :func:`stand_in` and taken out by :func:`remove_stand_ins` (``restore()`` too)."""

    inner: torch.nn.Module


def stand_in(location: ShimLocation, module: StandIn) -> None:
    """Run ``module`` in ``location``'s shim, once no batch is in flight there."""
    swap_module(location.layer, module)


def remove_stand_ins(nlp: Language) -> None:
    """Every shim's PyTorch module back where a :class:`StandIn` runs."""
    for component in transformer_components(nlp):
        location = find_shim(component)
        module = location.shim._model
        if isinstance(module, StandIn):
            swap_module(location.layer, module.inner)


def unguard_all(nlp: Language) -> None:
    """:func:`unguard` every transformer of ``nlp``."""
    for component in transformer_components(nlp):
        unguard(find_shim(component))


def unguard(location: ShimLocation) -> None:
    """Undo :func:`guard`: thinc's own forward and ``convert_inputs`` back, once no batch
    is in flight on the layer. A later ``optimize()`` guards it again; only batches already
    running then are not covered, as at the first (:mod:`.swap`)."""
    convert = location.layer.attrs.get(CONVERT_INPUTS)
    with held_exclusively(location.layer):
        if isinstance(convert, PassLayerFlag):
            location.layer.attrs[CONVERT_INPUTS] = convert.inner
        remove_guard(location.layer)


def patch(location: ShimLocation, proxy: AcceleratedModule) -> None:
    guard(location)
    previous = location.shim._model
    swap_module(location.layer, proxy)
    BUDGET.stop_serving(previous)
    BUDGET.serve(proxy)


def serve_in(
    location: ShimLocation, proxy: AcceleratedModule, spans: SpanSettings, warm: bool
) -> None:
    """Steps 8-9: ``proxy`` swapped in at ``location`` and, where ``warm``, run once on
    the shapes ``spans`` cuts (every layer where the pipeline reads every layer)."""
    patch(location, proxy)  # 8. patch
    if warm:
        warm_up(proxy, spans, reads_all_layers(location))  # 9. warm up


def reads_all_layers(location: ShimLocation) -> bool:
    """Whether the pipeline reads every layer of this transformer (what warm-up runs)."""
    proxy = location.shim._model
    if isinstance(proxy, AcceleratedEncoder):
        return bool(location.layer.attrs.get(ALL_LAYERS_ATTR, True))
    config = getattr(location.pytorch_shell, "config", None)
    return bool(getattr(config, "output_hidden_states", False))


def is_patched(location: ShimLocation) -> bool:
    return isinstance(location.shim._model, AcceleratedModule)


def unpatch(location: ShimLocation) -> bool:
    """Put the original module back; return whether there was anything to undo. The guard
    stays (``restore()`` takes it off: :func:`unguard`)."""
    proxy = location.shim._model
    if isinstance(proxy, AcceleratedModule):
        swap_module(location.layer, proxy.read_original())
        BUDGET.stop_serving(proxy)
    return isinstance(proxy, AcceleratedModule)


def revert(location: ShimLocation, previous: torch.nn.Module) -> None:
    """Return ``location`` to the module it held before this call (proxy or original)."""
    if isinstance(previous, AcceleratedModule):
        patch(location, previous)
    else:
        unpatch(location)


def scoped(location: ShimLocation, module: torch.nn.Module) -> Any:
    """Run ``location``'s layer with ``module`` in this thread only (calibration, the
    agreement gate): other threads keep the module they run."""
    return scoped_module(location.layer, module)


def exclusive(location: ShimLocation) -> Any:
    """Hold ``location``'s layer for this thread alone (no batch runs on it meanwhile)."""
    return held_exclusively(location.layer)


@dataclass(frozen=True)
class ServedTransformer:
    """One transformer component that runs accelerated: the component, its shim and the
    module serving it. ``optimize()`` and a load find them once, after steps 5-9, and pass
    them on to steps 10-12."""

    component: TransformerComponent
    location: ShimLocation
    proxy: AcceleratedModule


def served_transformers(nlp: Language) -> tuple[ServedTransformer, ...]:
    """The transformer components of ``nlp`` that run accelerated, in pipeline order."""
    served = []
    for component in transformer_components(nlp):
        location = find_shim(component)
        if isinstance(location.module, AcceleratedModule):
            served.append(ServedTransformer(component, location, location.module))
    return tuple(served)


def accelerated_components(nlp: Language) -> dict[str, AcceleratedModule]:
    """The accelerated transformer modules of ``nlp``, by component name."""
    return {served.component.name: served.proxy for served in served_transformers(nlp)}


def is_optimized(nlp: Language) -> bool:
    """Whether every transformer component of ``nlp`` runs accelerated."""
    locations = [find_shim(component) for component in transformer_components(nlp)]
    return bool(locations) and all(is_patched(location) for location in locations)
