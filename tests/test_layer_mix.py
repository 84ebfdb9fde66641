"""All-layer listeners of a served transformer mix each document's layers unpadded.

The mix must equal the listener's own weighting (max abs difference <= 1e-5 at fp32) on
every sample pipeline with scalar-weighting listeners, leave the annotations as they are,
train through spaCy's own path, and be gone after ``restore()``; nothing of it is saved.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import spacy
from annotations import annotations, run
from spacy.language import Language
from spacy_accelerate_samples.trained import ensure_trained_sample
from thinc.api import Model
from thinc.types import Ragged

import spacy_accelerate
from spacy_accelerate.bench import where_time_goes
from spacy_accelerate.bench.baselines import Accelerated
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.layer_mix import (
    UnpaddedLayerMix,
    install_layer_mixes,
    listeners_own_weighting,
    remove_layer_mixes,
    weighting_layers,
)

#: The sample pipelines whose heads weight every layer.
ALL_LAYER_SAMPLES = ("roberta-scalar", "minilm-ewt")


@pytest.fixture(params=ALL_LAYER_SAMPLES)
def all_layer_pipeline(
    request: pytest.FixtureRequest, sample_path: Callable[[str], Path], samples_root: Path
) -> Language:
    if request.param == "minilm-ewt":
        return spacy.load(ensure_trained_sample(samples_root))
    return spacy.load(sample_path(request.param))


def _listener_outputs(nlp: Language, docs: list) -> list[list[np.ndarray]]:
    """Each scalar-weighting listener's output (one array a document) on ``docs``."""
    listeners = [
        listener
        for name, pipe in nlp.pipeline
        if name == "transformer"
        for listener in pipe.listeners
        if listener.layers[0] in list(weighting_layers(nlp))
    ]
    assert listeners, "the sample must have scalar-weighting listeners"
    return [[np.asarray(y) for y in listener.predict(docs)] for listener in listeners]


def _transformed(nlp: Language, texts: list[str]) -> list:
    return list(nlp.get_pipe("transformer").pipe(nlp.make_doc(t) for t in texts))


def test_the_unpadded_mix_equals_the_listeners_weighting(
    all_layer_pipeline: Language, ewt_texts: list[str]
) -> None:
    nlp = all_layer_pipeline
    docs = _transformed(nlp, ewt_texts[:40])
    padded = _listener_outputs(nlp, docs)
    install_layer_mixes(transformer_components(nlp))
    layers = list(weighting_layers(nlp))
    assert layers and all(isinstance(layer._func, UnpaddedLayerMix) for layer in layers)
    unpadded = _listener_outputs(nlp, docs)
    worst = max(
        float(np.max(np.abs(a - b)))
        for listener_a, listener_b in zip(padded, unpadded, strict=True)
        for a, b in zip(listener_a, listener_b, strict=True)
    )
    assert worst <= 1e-5
    assert all(
        a.shape == b.shape
        for la, lb in zip(padded, unpadded, strict=True)
        for a, b in zip(la, lb, strict=True)
    )


def test_a_mix_with_other_weights_differs(
    all_layer_pipeline: Language, ewt_texts: list[str]
) -> None:
    """The comparison above can fail: the mix reads the listener's own weights."""
    nlp = all_layer_pipeline
    docs = _transformed(nlp, ewt_texts[:8])
    install_layer_mixes(transformer_components(nlp))
    before = _listener_outputs(nlp, docs)
    module = next(iter(weighting_layers(nlp))).shims[0]._model
    module.layer_weights.data = module.layer_weights.data.flip(0)
    after = _listener_outputs(nlp, docs)
    assert not np.allclose(before[0][0], after[0][0], atol=1e-5)


def test_optimize_mixes_unpadded_with_the_same_annotations_and_restore_undoes_it(
    all_layer_pipeline: Language, ewt_texts: list[str], cache_dir: Path, tmp_path: Path
) -> None:
    nlp = all_layer_pipeline
    originals = {id(layer): layer._func for layer in weighting_layers(nlp)}
    run(nlp, ewt_texts[:2], 2)  # spaCy's parser sets its dropout to 0 when it first predicts
    nlp.to_disk(tmp_path / "before")
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    layers = list(weighting_layers(nlp))
    assert all(isinstance(layer._func, UnpaddedLayerMix) for layer in layers)
    mixed = [annotations(doc) for doc in run(nlp, ewt_texts[:60], 16)]
    remove_layer_mixes(nlp)  # the same runtime, the listeners' own padded weighting
    padded = [annotations(doc) for doc in run(nlp, ewt_texts[:60], 16)]
    assert mixed == padded
    nlp.to_disk(tmp_path / "unmixed")
    install_layer_mixes(transformer_components(nlp))
    nlp.to_disk(tmp_path / "after")
    for head in ("tagger", "parser", "ner"):
        saved = (tmp_path / "after" / head / "model").read_bytes()
        assert saved == (tmp_path / "before" / head / "model").read_bytes()
    config = (tmp_path / "after" / "config.cfg").read_text()
    assert config == (tmp_path / "unmixed" / "config.cfg").read_text()
    spacy_accelerate.restore(nlp)
    assert {id(layer): layer._func for layer in weighting_layers(nlp)} == originals


def test_a_loaded_pipeline_mixes_unpadded(
    sample_path: Callable[[str], Path], cache_dir: Path, tmp_path: Path
) -> None:
    nlp = spacy.load(sample_path("roberta-scalar"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    nlp.to_disk(tmp_path / "saved")
    loaded = spacy.load(tmp_path / "saved")
    assert spacy_accelerate.is_optimized(loaded)
    assert all(isinstance(layer._func, UnpaddedLayerMix) for layer in weighting_layers(loaded))
    unpickled = pickle.loads(pickle.dumps(loaded))
    assert all(isinstance(layer._func, UnpaddedLayerMix) for layer in weighting_layers(unpickled))


def _weighting_inputs(nlp: Language, texts: list[str]) -> tuple[Model, list[list[Ragged]]]:
    docs = _transformed(nlp, texts)
    return next(iter(weighting_layers(nlp))), [doc._.trf_data.all_outputs for doc in docs]


def test_training_runs_the_listeners_own_gradient_path(
    sample_path: Callable[[str], Path], ewt_texts: list[str]
) -> None:
    nlp = spacy.load(sample_path("roberta-scalar"))
    layer, inputs = _weighting_inputs(nlp, ewt_texts[:4])
    install_layer_mixes(transformer_components(nlp))
    outputs, backprop = layer.begin_update(inputs)
    gradients = backprop([Ragged(np.ones_like(y.dataXd), y.lengths) for y in outputs])
    assert len(gradients) == len(inputs)
    assert all(len(doc) == len(layers) for doc, layers in zip(gradients, inputs, strict=True))


def test_another_number_of_layers_is_refused_as_the_listener_refuses_it(
    sample_path: Callable[[str], Path], ewt_texts: list[str]
) -> None:
    nlp = spacy.load(sample_path("roberta-scalar"))
    layer, inputs = _weighting_inputs(nlp, ewt_texts[:2])
    extra = [[*layers, layers[-1]] for layers in inputs]
    with pytest.raises(ValueError) as original:
        layer.predict(extra)
    install_layer_mixes(transformer_components(nlp))
    with pytest.raises(ValueError) as mixed:
        layer.predict(extra)
    assert str(mixed.value) == str(original.value)


def test_stage_times_show_the_heads_with_the_padded_weighting_beside(
    sample_path: Callable[[str], Path], ewt_texts: list[str], cache_dir: Path
) -> None:
    nlp = spacy.load(sample_path("roberta-scalar"))
    variant = Accelerated({"provider": "cpu", "precision": "fp32", "cache_dir": cache_dir})
    stages = where_time_goes.measure(nlp, ewt_texts[:16], "fp32", variant, batch_size=8)
    padded = where_time_goes.PADDED_LISTENERS.format("fp32")
    assert set(stages.found) == {"pytorch fp32", "fp32", padded}
    assert {"tagger", "parser", "ner"} <= set(stages.found[padded].as_dict())
    # Measured with the listeners' own weighting, then served unpadded again.
    variant.apply(nlp)
    with listeners_own_weighting(nlp) as compared:
        assert compared
        assert not any(isinstance(layer._func, UnpaddedLayerMix) for layer in weighting_layers(nlp))
    assert all(isinstance(layer._func, UnpaddedLayerMix) for layer in weighting_layers(nlp))
    spacy_accelerate.restore(nlp)
    with listeners_own_weighting(nlp) as compared:
        assert not compared
