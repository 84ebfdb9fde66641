"""All-layer listeners of a served transformer weight each document's layers unpadded.

spacy-curated-transformers' ``ScalarWeightingListener`` mixes the embedding output and every
layer of its transformer with learned weights (a softmax over one weight a layer, times a
scale). Its ``ScalarWeight`` torch module takes one tensor of [documents, longest document,
layers, width], so thinc's wrapper first copies every document's layers into a zero-padded
array of that shape: 180 MB for a 64-document batch of minilm-ewt, written and read by each of
its three listeners. Once the encoder is fast, that copy is most of a head's time.

The mix is a weighted sum, so each document can be mixed on its own layers with the same
weights: the same output (within float rounding: the sums run in another order) without the
padding. From ``optimize()`` (and a load that serves the pipeline again) until ``restore()``,
the weighting layer of every such listener of a served transformer is an
:class:`UnpaddedLayerMix`, which keeps the original forward for training (``is_train``:
spaCy's own gradient path) and to put back. Like the guard of :mod:`.swap`, it lives on the
layer itself, so copies and pickles of the pipeline carry it and ``to_disk`` writes nothing
new. spacy-transformers' listeners have no layer weighting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import singledispatch
from typing import Any

import numpy
import torch
from curated_transformers.models.scalar_weight import ScalarWeight
from spacy.language import Language
from spacy.pipeline import TrainablePipe
from spacy_curated_transformers.models.listeners import scalar_weighting_listener_forward
from spacy_curated_transformers.pipeline.transformer import CuratedTransformer
from thinc.api import Model
from thinc.shims import PyTorchShim
from thinc.types import Ragged

from spacy_accelerate.pipeline.components import TransformerComponent, transformer_components

LayerOutputs = list[list[Ragged]]


def _no_gradient(d_outputs: Any) -> list[Any]:
    return []


def _scalar_weight(layer: Model) -> ScalarWeight | None:
    """The ``ScalarWeight`` module ``layer`` runs, if that is what it runs."""
    for shim in layer.shims:
        if isinstance(shim, PyTorchShim) and isinstance(shim._model, ScalarWeight):
            return shim._model
    return None


@dataclass(frozen=True)
class MixingWeights:
    """What ``ScalarWeight`` multiplies the layers by at inference, as float32 numbers."""

    probabilities: tuple[numpy.float32, ...]
    scale: numpy.float32

    @classmethod
    def of(cls, module: ScalarWeight) -> MixingWeights:
        with torch.no_grad():
            weights = module.layer_weights.detach().float().softmax(dim=-1).cpu().numpy()
            scale = module.scale.detach().float().cpu().numpy()
        return cls(tuple(weights), numpy.float32(scale[0]))

    def mix(self, layers: list[Ragged]) -> Ragged:
        """One document's layers weighted and summed, then scaled (the module's order).

        Document by document: mixing a whole batch at once (each layer's rows of every
        document concatenated) took three times as long on minilm-ewt, its arrays too large
        for the allocator to reuse (docs/performance.md, issue 55).
        """
        arrays: list[Any] = [layer.dataXd for layer in layers]
        mixed = arrays[0] * self.probabilities[0]
        for array, probability in zip(arrays[1:], self.probabilities[1:], strict=True):
            mixed += array * probability
        mixed *= self.scale
        return Ragged(mixed, layers[0].lengths)


@dataclass(frozen=True)
class UnpaddedLayerMix:
    """A ``ScalarWeight`` layer's forward that mixes each document's layers on their own at
    inference; ``inner`` (the original forward) trains, and refuses what the module refuses
    (another number of layers than it has weights for)."""

    inner: Callable[..., Any]

    def __call__(
        self, model: Model, X: LayerOutputs, is_train: bool = False
    ) -> tuple[list[Ragged], Callable[[Any], list[Any]]]:
        module = _scalar_weight(model)
        if is_train or module is None or not X:
            return self.inner(model, X, is_train)  # type: ignore[no-any-return]
        weights = MixingWeights.of(module)
        if any(len(layers) != len(weights.probabilities) for layers in X):
            return self.inner(model, X, is_train)  # type: ignore[no-any-return]
        return [weights.mix(layers) for layers in X], _no_gradient


@singledispatch
def _listeners(pipe: TrainablePipe) -> list[Model]:
    """The listener models bound to a transformer component (spacy-transformers': none
    that weight layers)."""
    return []


@_listeners.register
def _(pipe: CuratedTransformer) -> list[Model]:
    return list(pipe.listeners)


def weighting_layers(nlp: Language) -> Iterator[Model]:
    """The layer-weighting layer of every scalar-weighting listener of ``nlp``'s
    transformers."""
    return _weighting_layers(transformer_components(nlp))


def _weighting_layers(components: Iterable[TransformerComponent]) -> Iterator[Model]:
    for component in components:
        for listener in _listeners(component.pipe):
            if listener._func is scalar_weighting_listener_forward:
                yield listener.layers[0]


def install_layer_mixes(components: Iterable[TransformerComponent]) -> None:
    """Mix the layers of every scalar-weighting listener of ``components`` per document
    (idempotent)."""
    for layer in _weighting_layers(components):
        if not isinstance(layer._func, UnpaddedLayerMix):
            layer._func = UnpaddedLayerMix(layer._func)


def _mixing(nlp: Language) -> list[tuple[Model, UnpaddedLayerMix]]:
    """The weighting layers that mix unpadded now, each with its mix."""
    return [
        (layer, layer._func)
        for layer in weighting_layers(nlp)
        if isinstance(layer._func, UnpaddedLayerMix)
    ]


def remove_layer_mixes(nlp: Language) -> None:
    """Put the listeners' own forward back (a no-op where there is nothing to undo)."""
    for layer, mix in _mixing(nlp):
        layer._func = mix.inner


@contextmanager
def listeners_own_weighting(nlp: Language) -> Iterator[bool]:
    """Run the listeners' own (padded) weighting meanwhile, as before ``optimize()``: what
    the stage times compare the unpadded mix with. Yields whether any listener mixes
    unpadded now (whether there is anything to compare)."""
    mixed = _mixing(nlp)
    remove_layer_mixes(nlp)
    try:
        yield bool(mixed)
    finally:
        for layer, mix in mixed:
            layer._func = mix
