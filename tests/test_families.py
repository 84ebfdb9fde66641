"""Acceptance for breadth: every supported family, through both spaCy transformer packages.

Each sample (tiny random weights with locally trained piece vocabularies, and
the real MiniLM weights through spacy-transformers) annotates UD-EWT test
documents longer than its span window, first with PyTorch, then accelerated:
the hidden states must agree within 1e-4 and every annotation must be
identical. spacy-transformers keeps the whole model output on the doc, so
its fields (pooled output included) are compared as well.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import spacy
import torch
from annotations import all_hidden, disagreements, last_hidden, max_abs_diff, run
from spacy.language import Language
from spacy.training import Example
from spacy_accelerate_samples import load_sample
from spacy_transformers.data_classes import TransformerData

import spacy_accelerate
from spacy_accelerate import InferenceOnlyError
from spacy_accelerate.provision.get_or_export import Origin
from spacy_accelerate.serving.proxy import AcceleratedEncoder, AcceleratedHFModel

TOLERANCE = 1e-4
DOCUMENTS = 40
BATCH_SIZE = 8

#: sample -> (proxy class, family recorded in the spec, takes token types)
FAMILIES = {
    "xlmr": (AcceleratedEncoder, "roberta"),
    "camembert": (AcceleratedEncoder, "roberta"),
    "albert": (AcceleratedEncoder, "albert"),
    "st-bert": (AcceleratedHFModel, "bert"),
    "st-roberta": (AcceleratedHFModel, "roberta"),
    "st-xlmr": (AcceleratedHFModel, "xlm-roberta"),
    "st-distilbert": (AcceleratedHFModel, "distilbert"),
    "st-electra": (AcceleratedHFModel, "electra"),
    "st-minilm": (AcceleratedHFModel, "bert"),
}


class Outcome:
    def __init__(self, nlp: Language, texts: list[str], cache_dir: Path) -> None:
        self.nlp = nlp
        self.reference = run(nlp, texts, BATCH_SIZE)
        spacy_accelerate.optimize(nlp, provider="cpu", cache_dir=cache_dir)
        self.accelerated = run(nlp, texts, BATCH_SIZE)


#: Built for this test alone, and the largest: the slow tier's (BERT is covered by st-bert).
SLOW_FAMILIES = {"st-minilm"}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=pytest.mark.slow) if name in SLOW_FAMILIES else name
        for name in FAMILIES
    ],
)
def outcome(
    request: pytest.FixtureRequest,
    samples_root: Path,
    ewt_texts: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, Outcome]:
    name = request.param
    nlp = load_sample(name, samples_root)
    return name, Outcome(nlp, ewt_texts[:DOCUMENTS], tmp_path_factory.mktemp(f"cache-{name}"))


def test_runs_with_the_right_proxy_and_family(outcome: tuple[str, Outcome]):
    name, result = outcome
    proxy_type, family = FAMILIES[name]
    (proxy,) = spacy_accelerate.accelerated_components(result.nlp).values()
    assert type(proxy) is proxy_type
    assert proxy.spec.family == family
    assert proxy.exported.parity.worst <= TOLERANCE


def test_hidden_states_match_pytorch(outcome: tuple[str, Outcome]):
    _, result = outcome
    assert max_abs_diff(result.reference, result.accelerated) <= TOLERANCE
    pieces = sum(last_hidden(doc).shape[0] for doc in result.reference)
    assert pieces > 2_000


def test_annotations_identical(outcome: tuple[str, Outcome]):
    _, result = outcome
    tokens = sum(len(doc) for doc in result.reference)
    differing = disagreements(result.reference, result.accelerated, result.nlp)
    assert differing == [], f"{len(differing)} of {tokens} tokens differ: {differing[:5]}"
    assert len({t.tag_ for doc in result.reference for t in doc}) > 3


def test_the_doc_keeps_the_same_transformer_fields(outcome: tuple[str, Outcome]):
    _, result = outcome
    for before, after in zip(result.reference, result.accelerated, strict=True):
        expected, actual = before._.trf_data, after._.trf_data
        assert type(actual) is type(expected)
        if not isinstance(expected, TransformerData):  # curated: hidden states only
            assert len(actual.all_outputs) == len(expected.all_outputs)
            continue
        assert list(actual.model_output.keys()) == list(expected.model_output.keys())
        if "pooler_output" in expected.model_output:
            pooled = expected.model_output.pooler_output, actual.model_output.pooler_output
            assert np.max(np.abs(pooled[0] - pooled[1])) <= TOLERANCE
        assert len(actual.tensors) == len(expected.tensors)


@pytest.fixture()
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _every_layer_matches(reference: list, accelerated: list) -> None:
    for before, after in zip(reference, accelerated, strict=True):
        expected, actual = all_hidden(before), all_hidden(after)
        assert len(expected) == len(actual) >= 3
        for want, got in zip(expected, actual, strict=True):
            assert want.shape == got.shape
            if want.size:
                assert np.max(np.abs(want - got)) <= TOLERANCE
    layers = all_hidden(reference[0])
    for lower, upper in zip(layers, layers[1:], strict=False):
        assert np.max(np.abs(lower - upper)) > 1e-2, "layers must be distinct computations"


@pytest.mark.parametrize(
    "name",
    [
        "roberta-scalar",  # curated: ScalarWeightingListener heads, all_layer_outputs = true
        "st-bert-hidden",  # spacy-transformers: output_hidden_states = true in the model config
    ],
)
def test_every_layer_is_the_true_layer_where_all_layers_are_read(
    name: str, samples_root: Path, ewt_texts: list[str], cache: Path
):
    nlp = load_sample(name, samples_root)
    texts = ewt_texts[:12]
    reference = run(nlp, texts, BATCH_SIZE)
    spacy_accelerate.optimize(nlp, provider="cpu", cache_dir=cache)
    accelerated = run(nlp, texts, BATCH_SIZE)
    _every_layer_matches(reference, accelerated)
    assert disagreements(reference, accelerated, nlp) == []


def test_the_scalar_weighting_sample_reads_all_layers(samples_root: Path):
    assert load_sample("roberta-scalar", samples_root).get_pipe("transformer").all_layer_outputs


def test_two_transformer_components_each_accelerated_at_parity(
    samples_root: Path, ewt_texts: list[str], cache: Path
):
    nlp = load_sample("roberta-two", samples_root)
    texts = ewt_texts[:12]
    reference = run(nlp, texts, BATCH_SIZE)
    spacy_accelerate.optimize(nlp, provider="cpu", cache_dir=cache)
    proxies = spacy_accelerate.accelerated_components(nlp)
    assert sorted(proxies) == ["transformer", "transformer_ner"]
    assert len({proxy.exported.key for proxy in proxies.values()}) == 2
    assert len(spacy_accelerate.list_cached(cache)) == 2
    accelerated = run(nlp, texts, BATCH_SIZE)
    assert disagreements(reference, accelerated, nlp) == []
    for name, proxy in proxies.items():
        assert proxy.exported.parity.worst <= TOLERANCE, name
    ner_tokens = [(t.ent_iob_, t.ent_type_) for d in accelerated for t in d if t.ent_iob_ != "O"]
    assert ner_tokens, "the second transformer's listener (ner) must produce entities"


def test_spacy_transformers_training_works_again_after_restore(samples_root: Path, cache: Path):
    nlp = load_sample("st-bert", samples_root)
    doc = nlp.make_doc("Training works again .")
    gold = {
        "tags": ["NN", "VBZ", "RB", "."],
        "heads": [1, 1, 1, 1],
        "deps": ["nsubj", "ROOT", "advmod", "punct"],
        "entities": ["O", "O", "O", "O"],
    }
    example = Example.from_dict(doc, gold)
    spacy_accelerate.optimize(nlp, provider="cpu", cache_dir=cache)
    with pytest.raises(InferenceOnlyError, match="restore"):
        nlp.update([example])
    spacy_accelerate.restore(nlp)
    optimizer = nlp.resume_training()
    module = nlp.get_pipe("transformer").model.layers[0].shims[0]._model
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    for _ in range(2):  # spacy-transformers applies the transformer's first gradients late
        losses = nlp.update([example], sgd=optimizer)
    assert losses["tagger"] > 0 and losses["transformer"] > 0
    after = module.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_spacy_transformers_pipeline_round_trips_accelerated(
    sample_path: Callable[[str], Path], ewt_texts: list[str], cache: Path, tmp_path: Path
):
    nlp = spacy.load(sample_path("st-distilbert"))
    texts = ewt_texts[:6]
    reference = run(nlp, texts, BATCH_SIZE)
    spacy_accelerate.optimize(nlp, provider="cpu", cache_dir=cache)
    nlp.to_disk(tmp_path / "saved")
    loaded = spacy.load(tmp_path / "saved")
    assert spacy_accelerate.is_optimized(loaded)
    (proxy,) = spacy_accelerate.accelerated_components(loaded).values()
    assert proxy.exported.origin is Origin.BUNDLED  # served from the models saved with it
    accelerated = run(loaded, texts, BATCH_SIZE)
    assert max_abs_diff(reference, accelerated) <= TOLERANCE
    assert disagreements(reference, accelerated, loaded) == []
