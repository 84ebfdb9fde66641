"""Pipelines beyond the plain one: all-layer outputs, two transformers, copies and pickles."""

from __future__ import annotations

import copy
import logging
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import spacy
from annotations import all_hidden, disagreements, last_hidden, run

import spacy_accelerate
from spacy_accelerate import AccuracyError, InvalidOptionError
from spacy_accelerate.architectures.bert import BertArchitecture

TEXTS_LIMIT = 60


@pytest.fixture()
def bert(sample_path: Callable[[str], Path]) -> spacy.language.Language:
    return spacy.load(sample_path("bert"))


def test_all_layer_outputs_are_every_true_layer(
    bert: spacy.language.Language, cache_dir: Path, ewt_texts: list[str]
):
    bert.get_pipe("transformer").all_layer_outputs = True
    texts = ewt_texts[:TEXTS_LIMIT]
    reference = run(bert, texts, 7)
    spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    accelerated = run(bert, texts, 7)
    for ref, acc in zip(reference, accelerated, strict=True):
        ref_layers, acc_layers = all_hidden(ref), all_hidden(acc)
        assert len(ref_layers) == len(acc_layers) == 3  # embeddings + 2 layers
        for expected, actual in zip(ref_layers, acc_layers, strict=True):
            assert expected.shape == actual.shape
            assert np.max(np.abs(expected - actual), initial=0.0) <= 1e-4
        if acc_layers[0].size:
            # Distinct layers, not copies of the last one.
            assert np.max(np.abs(acc_layers[-1] - acc_layers[-2])) > 1e-2
            assert np.max(np.abs(acc_layers[0] - acc_layers[-1])) > 1e-2
    assert disagreements(reference, accelerated) == []


def test_two_transformer_components_are_both_accelerated(
    bert: spacy.language.Language,
    sample_path: Callable[[str], Path],
    cache_dir: Path,
    ewt_texts: list[str],
):
    roberta = spacy.load(sample_path("roberta"))
    bert.add_pipe("transformer", name="second_transformer", source=roberta)
    texts = ewt_texts[:TEXTS_LIMIT]
    reference = run(bert, texts, 7)
    spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    accelerated = spacy_accelerate.accelerated_components(bert)
    assert set(accelerated) == {"transformer", "second_transformer"}
    assert accelerated["transformer"].spec.family == "bert"
    assert accelerated["second_transformer"].spec.family == "roberta"
    assert len({proxy.exported.key for proxy in accelerated.values()}) == 2
    assert len(spacy_accelerate.list_cached(cache_dir)) == 2
    docs = run(bert, texts, 7)
    assert disagreements(reference, docs) == []  # heads read the first transformer
    for ref, doc in zip(reference, docs, strict=True):  # trf_data is the second's
        assert np.max(np.abs(last_hidden(ref) - last_hidden(doc)), initial=0.0) <= 1e-4


@pytest.mark.parametrize(
    "clone",
    [copy.deepcopy, lambda nlp: pickle.loads(pickle.dumps(nlp))],
    ids=["deepcopy", "pickle"],
)
def test_copies_stay_accelerated_and_correct(
    bert: spacy.language.Language,
    cache_dir: Path,
    ewt_texts: list[str],
    clone: Callable[[spacy.language.Language], spacy.language.Language],
):
    texts = ewt_texts[:20]
    reference = run(bert, texts, 7)
    spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    copied = clone(bert)
    assert spacy_accelerate.is_optimized(copied)
    docs = run(copied, texts, 7)
    assert disagreements(reference, docs) == []
    spacy_accelerate.restore(copied)
    assert spacy_accelerate.is_optimized(bert)  # the original is untouched
    for ref, doc in zip(reference, run(copied, texts, 7), strict=True):
        assert np.array_equal(last_hidden(ref), last_hidden(doc))


def test_copied_transformer_model_reads_its_own_layer_flag(
    bert: spacy.language.Language, cache_dir: Path
):
    spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    pipe = bert.get_pipe("transformer")
    copied = pipe.model.copy()
    [wrapper] = [node for node in copied.walk() if node.shims]  # Model.copy() drops refs
    assert type(wrapper.shims[0]._model).__name__ == "AcceleratedEncoder"
    wrapper.attrs["_all_layer_outputs"] = True
    pipe.model.get_ref("transformer").attrs["_all_layer_outputs"] = False
    doc = bert.make_doc("A copy decides for itself .")
    output = copied.predict([doc])
    assert len(output.all_outputs[0]) == 3  # every layer, as the copy's flag asks


def test_rejected_reoptimize_keeps_the_working_acceleration(
    bert: spacy.language.Language, cache_dir: Path
):
    spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    before = spacy_accelerate.accelerated_components(bert)["transformer"]
    with pytest.raises(InvalidOptionError):
        spacy_accelerate.optimize(bert, provider="cpu", precision="fp16", cache_dir=cache_dir)
    assert spacy_accelerate.accelerated_components(bert)["transformer"] is before
    with pytest.raises(AccuracyError):  # fails after its export, at the gate
        spacy_accelerate.optimize(
            bert, provider="cpu", precision="int8", cache_dir=cache_dir, min_cosine=1.0
        )
    assert spacy_accelerate.accelerated_components(bert)["transformer"] is before
    assert before.session.config.precision.value == "fp32"


def test_entry_stored_under_a_looser_tolerance_is_checked_and_rebuilt_even_without_verify(
    bert: spacy.language.Language,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    convert = BertArchitecture.hf_state_dict.__func__

    def damaged(cls: type, encoder: object, spec: object) -> dict:
        state = convert(cls, encoder, spec)
        bias = state["encoder.layer.0.output.dense.bias"].clone()
        bias[1] += 0.05
        state["encoder.layer.0.output.dense.bias"] = bias
        return state

    with monkeypatch.context() as patched:
        patched.setattr(BertArchitecture, "hf_state_dict", classmethod(damaged))
        spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir, tolerance=0.5)
    spacy_accelerate.restore(bert)
    # The hit fails the stricter gate: it is rebuilt (as an empty cache would build it),
    # never served, and never an error that only clearing the cache would end.
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir, verify=False)
    assert "tolerance 0.0001" in caplog.text and "is rebuilt" in caplog.text
    proxy = spacy_accelerate.accelerated_components(bert)["transformer"]
    assert not proxy.exported.cache_hit and proxy.exported.parity.worst <= 1e-4


def test_verify_false_and_warmup_false_on_a_clean_hit(
    bert: spacy.language.Language, cache_dir: Path
):
    spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir, verify=False, warmup=False)
    proxy = spacy_accelerate.accelerated_components(bert)["transformer"]
    assert proxy.exported.cache_hit and proxy.exported.parity is None
    assert len(bert("Still works .")) == 3
