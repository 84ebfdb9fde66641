"""A pipeline's life after optimize(): saved and loaded, reconfigured at load, guarded
against training, restored, and run in several processes."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import spacy
import torch
from annotations import annotations, disagreements, last_hidden, max_abs_diff, run
from curated_transformers.models.curated_transformer import CuratedTransformer
from spacy.language import Language
from spacy.training import Example
from spacy.util import registry

import spacy_accelerate
from spacy_accelerate import InferenceOnlyError
from spacy_accelerate.build import get_or_export as exported
from spacy_accelerate.pipeline.persist import CALLBACK_NAME
from spacy_accelerate.pipeline.training_guard import TRAINING_METHODS

TOLERANCE = 1e-4


@pytest.fixture()
def roberta(sample_path: Callable[[str], Path]) -> Language:
    return spacy.load(sample_path("roberta"))


@pytest.fixture()
def texts(ewt_texts: list[str]) -> list[str]:
    return ewt_texts[:24]


def _fail_export(*args: object, **kwargs: object) -> None:
    raise AssertionError("the model should have come from the cache")


def test_saved_pipeline_loads_accelerated_from_the_cache(
    roberta: Language,
    cache_dir: Path,
    tmp_path: Path,
    texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
):
    reference = run(roberta, texts, 8)
    spacy_accelerate.optimize(roberta, provider="cpu", cache_dir=cache_dir)
    roberta.to_disk(tmp_path / "saved")

    saved_config = (tmp_path / "saved" / "config.cfg").read_text()
    assert f'@callbacks = "{CALLBACK_NAME}"' in saved_config
    # Only options go to disk: no ONNX file, no session, no pickle.
    written = [p.name for p in (tmp_path / "saved").rglob("*") if p.is_file()]
    assert not [name for name in written if name.endswith((".onnx", ".pkl", ".pickle"))]

    monkeypatch.setattr(exported, "export_onnx", _fail_export)
    loaded = spacy.load(tmp_path / "saved")
    assert spacy_accelerate.is_optimized(loaded)
    proxy = spacy_accelerate.accelerated_components(loaded)["transformer"]
    assert proxy.exported.cache_hit and proxy.exported.path.parent == cache_dir
    accelerated = run(loaded, texts, 8)
    assert max_abs_diff(reference, accelerated) <= TOLERANCE
    assert disagreements(reference, accelerated) == []


def test_load_config_switches_precision_or_turns_acceleration_off(
    roberta: Language, cache_dir: Path, tmp_path: Path, texts: list[str]
):
    reference = run(roberta, texts[:6], 8)
    spacy_accelerate.optimize(roberta, provider="cpu", cache_dir=cache_dir)
    roberta.to_disk(tmp_path / "saved")

    plain = spacy.load(
        tmp_path / "saved", config={"nlp": {"after_pipeline_creation": {"enabled": False}}}
    )
    assert not spacy_accelerate.is_optimized(plain)
    for before, after in zip(reference, run(plain, texts[:6], 8), strict=True):
        assert np.array_equal(last_hidden(before), last_hidden(after))

    int8 = spacy.load(tmp_path / "saved", config={"nlp.after_pipeline_creation.precision": "int8"})
    proxy = spacy_accelerate.accelerated_components(int8)["transformer"]
    assert proxy.session.config.precision.value == "int8"
    assert proxy.exported.parity.worst_cosine >= 0.99


def test_restore_takes_the_record_out_of_the_config(
    roberta: Language, cache_dir: Path, tmp_path: Path
):
    spacy_accelerate.optimize(roberta, provider="cpu", cache_dir=cache_dir)
    spacy_accelerate.restore(roberta)
    assert roberta.config["nlp"]["after_pipeline_creation"] is None
    roberta.to_disk(tmp_path / "saved")
    assert not spacy_accelerate.is_optimized(spacy.load(tmp_path / "saved"))


@registry.callbacks("test_spacy_accelerate.mark.v1")
def make_marker(label: str = "marked") -> Callable[[Language], Language]:
    def mark(nlp: Language) -> Language:
        nlp.meta["marker"] = label
        return nlp

    return mark


def test_an_existing_after_creation_callback_is_kept(
    roberta: Language, cache_dir: Path, tmp_path: Path
):
    callback = {"@callbacks": "test_spacy_accelerate.mark.v1", "label": "kept"}
    roberta.config["nlp"]["after_pipeline_creation"] = callback
    spacy_accelerate.optimize(roberta, provider="cpu", cache_dir=cache_dir)
    spacy_accelerate.optimize(roberta, provider="cpu", cache_dir=cache_dir)  # no nesting twice
    assert roberta.config["nlp"]["after_pipeline_creation"]["previous"] == callback
    roberta.to_disk(tmp_path / "saved")
    loaded = spacy.load(tmp_path / "saved")
    assert loaded.meta["marker"] == "kept"
    assert spacy_accelerate.is_optimized(loaded)
    spacy_accelerate.restore(loaded)
    assert loaded.config["nlp"]["after_pipeline_creation"] == callback


def test_loading_new_weights_into_an_optimized_pipeline_reoptimizes_it(
    roberta: Language, cache_dir: Path, tmp_path: Path, sample_path: Callable[[str], Path]
):
    spacy_accelerate.optimize(roberta, provider="cpu", cache_dir=cache_dir)
    first_key = spacy_accelerate.accelerated_components(roberta)["transformer"].exported.key
    other = spacy.load(sample_path("roberta"))
    module = other.get_pipe("transformer").model.get_ref("transformer").shims[0]._model
    with torch.no_grad():
        next(module.parameters()).add_(0.01)
    other.to_disk(tmp_path / "other")
    roberta.from_disk(tmp_path / "other")
    proxy = spacy_accelerate.accelerated_components(roberta)["transformer"]
    assert proxy.exported.key != first_key
    text = "New weights are served, not the old export."
    expected = last_hidden(other(text))
    assert np.max(np.abs(last_hidden(roberta(text)) - expected)) <= TOLERANCE


@pytest.mark.parametrize("method", TRAINING_METHODS)
def test_training_calls_name_restore(roberta: Language, cache_dir: Path, method: str):
    spacy_accelerate.optimize(roberta, provider="cpu", cache_dir=cache_dir)
    with pytest.raises(InferenceOnlyError, match=r"spacy_accelerate.restore\(nlp\)"):
        getattr(roberta, method)()


def test_training_works_again_after_restore(roberta: Language, cache_dir: Path):
    # Tags only: with parser and entity gold as well, spacy-curated-transformers 0.3.1
    # itself fails under numpy >= 2.4 (float() of a one-element array in its loss
    # bookkeeping), accelerated or not. The spacy-transformers test below trains
    # the transformer too.
    doc = roberta.make_doc("Training works again .")
    example = Example.from_dict(doc, {"tags": ["NN", "VBZ", "RB", "."]})
    spacy_accelerate.optimize(roberta, provider="cpu", cache_dir=cache_dir)
    with pytest.raises(InferenceOnlyError):
        roberta.update([example])
    spacy_accelerate.restore(roberta)
    assert isinstance(_torch_module(roberta), CuratedTransformer)
    optimizer = roberta.resume_training()
    tagger = roberta.get_pipe("tagger").model
    before = [tagger.get_param("W").copy() for tagger in tagger.walk() if tagger.has_param("W")]
    losses = roberta.update([example], sgd=optimizer)
    after = [tagger.get_param("W") for tagger in tagger.walk() if tagger.has_param("W")]
    assert losses["tagger"] > 0
    assert any(not np.array_equal(b, a) for b, a in zip(before, after, strict=True))


def _torch_module(nlp: Language, name: str = "transformer") -> torch.nn.Module:
    return nlp.get_pipe(name).model.get_ref("transformer").shims[0]._model


def test_two_processes_annotate_like_one(roberta: Language, cache_dir: Path, texts: list[str]):
    spacy_accelerate.optimize(roberta, provider="cpu", cache_dir=cache_dir)
    single = [annotations(doc) for doc in roberta.pipe(texts, batch_size=4)]
    double = [annotations(doc) for doc in roberta.pipe(texts, batch_size=4, n_process=2)]
    assert double == single


def test_a_pickled_pipeline_reopens_its_cache_entry(
    roberta: Language, cache_dir: Path, texts: list[str]
):
    # What a spawned worker process receives: no session travels in the pickle.
    spacy_accelerate.optimize(roberta, provider="cpu", cache_dir=cache_dir)
    copy = pickle.loads(pickle.dumps(roberta))
    original = spacy_accelerate.accelerated_components(roberta)["transformer"]
    reopened = spacy_accelerate.accelerated_components(copy)["transformer"]
    assert reopened.session is not original.session
    assert reopened.exported.key == original.exported.key
    assert [annotations(d) for d in copy.pipe(texts[:6])] == [
        annotations(d) for d in roberta.pipe(texts[:6])
    ]
    with pytest.raises(InferenceOnlyError):
        copy.update([])
