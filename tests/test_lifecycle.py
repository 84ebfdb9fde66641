"""A pipeline's life after optimize(): saved and loaded, reconfigured at load, guarded
against training, restored, and run in several processes."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
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
from spacy_accelerate.pipeline.persist import CALLBACK_NAME
from spacy_accelerate.pipeline.training_guard import TRAINING_METHODS
from spacy_accelerate.provision import exports as shared_export

TOLERANCE = 1e-4


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
    spacy_accelerate.optimize(roberta, provider="cpu", cache_dir=cache_dir, bundle=False)
    roberta.to_disk(tmp_path / "saved")

    saved_config = (tmp_path / "saved" / "config.cfg").read_text()
    assert f'@callbacks = "{CALLBACK_NAME}"' in saved_config
    # bundle=False: only options go to disk: no ONNX file, no session, no pickle.
    written = [p.name for p in (tmp_path / "saved").rglob("*") if p.is_file()]
    assert not [name for name in written if name.endswith((".onnx", ".pkl", ".pickle"))]

    monkeypatch.setattr(shared_export, "export_onnx", _fail_export)
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


#: Run in a fresh interpreter: forking pytest's own process (threads of every runtime the
#: suite has loaded) would put the whole run at risk, not only this test.
FORKED_WORKERS = """
import json, multiprocessing, os, sys
sys.path.insert(0, sys.argv[3])
import spacy, spacy_accelerate
from annotations import annotations

nlp = spacy.load(sys.argv[1])
texts = json.loads(sys.stdin.read())
spacy_accelerate.optimize(nlp, provider="cpu", cache_dir=sys.argv[2])
proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
inherited = proxy.session

def work(part):
    docs = [annotations(doc) for doc in nlp.pipe(part, batch_size=4)]
    return docs, proxy.session is not inherited, proxy.served.opened_in == os.getpid()

single = [annotations(doc) for doc in nlp.pipe(texts, batch_size=4)]
double = [annotations(doc) for doc in nlp.pipe(texts, batch_size=4, n_process=2)]
with multiprocessing.get_context("fork").Pool(2) as pool:
    forked = pool.map(work, [texts[::2], texts[1::2]])
print(json.dumps({
    "single": single,
    "double": double,
    "forked": [docs for docs, _, _ in forked],
    "reopened": [fresh and own for _, fresh, own in forked],
    "parent_kept": proxy.session is inherited and proxy.served.opened_in == os.getpid(),
}))
"""


def test_forked_workers_open_their_own_session_and_annotate_like_one_process(
    sample_path: Callable[[str], Path], cache_dir: Path, texts: list[str]
):
    # spaCy's n_process (fork on Linux) and a Pool of forked workers: each child opens
    # the cache entry again instead of running the parent's session, whose runtime
    # threads stayed in the parent.
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            FORKED_WORKERS,
            str(sample_path("roberta")),
            str(cache_dir),
            str(Path(__file__).parent),
        ],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert found["double"] == found["single"]
    assert found["forked"][0] == found["single"][::2]
    assert found["forked"][1] == found["single"][1::2]
    assert found["reopened"] == [True, True]
    assert found["parent_kept"]


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
