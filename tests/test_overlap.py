"""The transformer overlapping spaCy's components (``spacy_accelerate.serving.overlap``):
the same documents, in the same order, with the same annotations as one after the other;
errors on either side in the caller's thread; no thread outlives the ``pipe`` call."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import spacy
import torch
from annotations import annotations
from spacy.language import Language
from spacy.tokens import Doc
from spacy_accelerate_samples.pipelines import SAMPLE_NAMES

import spacy_accelerate
from spacy_accelerate import cpu_budget
from spacy_accelerate.pipeline.pipe import AcceleratedPipe
from spacy_accelerate.serving import overlap as overlap_module
from spacy_accelerate.serving.overlap import Stages

HELPER = "spacy-accelerate-transformer"


def _helpers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == HELPER]


def _everything(doc: Doc) -> tuple:
    """Every annotation, the transformer's output included."""
    data = doc._.trf_data if doc.has_extension("trf_data") else None
    hidden = getattr(data, "last_hidden_layer_state", None)
    return (
        doc.text,
        annotations(doc),
        [token.lemma_ for token in doc],
        hidden.dataXd.tobytes() if hidden is not None else None,
    )


@pytest.fixture(autouse=True)
def two_cpus_at_least(monkeypatch: pytest.MonkeyPatch) -> None:
    """Overlap needs a CPU for the helper beside the caller's: where this process has one
    (a pinned test worker), two are simulated; a test about one CPU sets it again."""
    real = cpu_budget.affinity_cpus()
    monkeypatch.setattr(cpu_budget, "affinity_cpus", lambda: max(2, real))


@pytest.fixture(scope="module")
def many_texts(ewt_texts: list[str]) -> list[str]:
    return ewt_texts[:40]


#: en_core_web_trf's shape: exporting its 125M random weights would cost the suite minutes,
#: so its stages overlap on PyTorch (the mechanism does not depend on the runtime).
ON_PYTORCH = {"trf-base"}


#: The larger samples' runs are left to the slow tier (the small ones cover every stage).
SLOW_SAMPLES = {"trf-base", "st-minilm"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.slow) if name in SLOW_SAMPLES else name
        for name in SAMPLE_NAMES
    ],
)
def test_overlap_gives_the_same_documents_in_the_same_order(
    name: str, sample_path: Callable[[str], Path], cache_dir: Path, many_texts: list[str]
):
    nlp = spacy.load(sample_path(name))
    texts = many_texts[:12] if name in ON_PYTORCH else many_texts
    if name not in ON_PYTORCH:
        spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, overlap=True)
    plain = [_everything(d) for d in AcceleratedPipe(nlp, overlap=False)(texts, batch_size=4)]
    seen: list[int] = []
    overlapped = []
    for doc in AcceleratedPipe(nlp, overlap=True)(texts, batch_size=4):
        seen.append(len(_helpers()))
        overlapped.append(_everything(doc))
    assert overlapped == plain
    assert max(seen) == 1  # the transformer ran in the helper thread
    assert _helpers() == []


@pytest.fixture()
def roberta(sample_path: Callable[[str], Path], cache_dir: Path) -> Language:
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, overlap=True)
    return nlp


class Boom(RuntimeError):
    pass


def test_an_error_behind_the_transformer_reaches_the_caller_and_stops_the_helper(
    roberta: Language, many_texts: list[str]
):
    calls = []

    @Language.component("fails_on_the_third_batch")
    def fails(doc: Doc) -> Doc:
        calls.append(doc)
        if len(calls) > 8:
            raise Boom("a downstream component failed")
        return doc

    roberta.add_pipe("fails_on_the_third_batch")
    with pytest.raises(Boom, match="downstream"):
        list(roberta.pipe(many_texts, batch_size=4))
    assert _helpers() == []


def test_an_error_in_the_transformer_reaches_the_caller(
    roberta: Language, many_texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    proxy = spacy_accelerate.accelerated_components(roberta)["transformer"]
    run = proxy._run
    calls = []

    def fails(*args, **kwargs):
        calls.append(threading.current_thread().name)
        if len(calls) > 2:
            raise Boom("the transformer failed")
        return run(*args, **kwargs)

    monkeypatch.setattr(proxy, "_run", fails)
    done = []
    with pytest.raises(Boom, match="transformer failed"):
        for doc in roberta.pipe(many_texts, batch_size=4):
            done.append(doc)
    assert set(calls) == {HELPER}
    assert 0 < len(done) < len(many_texts)
    assert _helpers() == []


def test_a_generator_closed_early_leaves_no_thread(roberta: Language, many_texts: list[str]):
    stream = roberta.pipe(many_texts, batch_size=4)
    first = [next(stream) for _ in range(3)]
    assert len(_helpers()) == 1
    stream.close()
    assert _helpers() == [] and len(first) == 3


class _SlowToDie:
    """Held by the helper thread in a thread-local, like OpenVINO's infer request: it is
    destroyed as the thread ends, after the helper's work returned, and takes a while."""

    def __init__(self, dying: threading.Event, dead: threading.Event) -> None:
        self.dying, self.dead = dying, dead

    def __del__(self) -> None:
        self.dying.set()
        time.sleep(0.5)
        self.dead.set()


def test_the_exit_waits_for_an_abandoned_helper_until_its_thread_has_ended(
    roberta: Language, many_texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    # An abandoned pipe stops its helper without waiting for it; the process's exit then
    # must, to the end of the thread (what the thread holds is destroyed as it ends): on
    # 619420a it stopped waiting once the helper's work had returned.
    proxy = spacy_accelerate.accelerated_components(roberta)["transformer"]
    run, local = proxy._run, threading.local()
    dying, dead = threading.Event(), threading.Event()

    def holding(*args: object, **kwargs: object) -> object:
        if threading.current_thread().name == HELPER and not hasattr(local, "held"):
            local.held = _SlowToDie(dying, dead)
        return run(*args, **kwargs)

    monkeypatch.setattr(proxy, "_run", holding)
    stream = roberta.pipe(many_texts, batch_size=4)
    next(stream)
    del stream  # abandoned: its finalizer stops the helper, and does not join it
    gc.collect()
    assert dying.wait(60)  # the helper's work has returned; its thread is ending
    overlap_module.HELPERS.stop_all()  # what the process's exit runs
    assert dead.is_set()
    assert _helpers() == []


def test_as_tuples_disable_and_component_cfg_are_spacys(roberta: Language, many_texts: list[str]):
    pairs = [(text, index) for index, text in enumerate(many_texts[:12])]
    plain = AcceleratedPipe(roberta, overlap=False)
    for options in ({"disable": ["ner"]}, {"component_cfg": {"tagger": {"batch_size": 3}}}):
        expected = [_everything(d) for d in plain(many_texts[:12], batch_size=4, **options)]
        got = [_everything(d) for d in roberta.pipe(many_texts[:12], batch_size=4, **options)]
        assert got == expected
    tupled = list(roberta.pipe(pairs, as_tuples=True, batch_size=4))
    assert [context for _, context in tupled] == list(range(12))
    assert [_everything(doc) for doc, _ in tupled] == [
        _everything(d) for d in plain(many_texts[:12], batch_size=4)
    ]


def test_the_stages_split_around_the_transformers():
    nlp = spacy.blank("en")
    for name in ("front", "trf", "middle", "back"):
        nlp.add_pipe("sentencizer", name=name)
    stages = Stages.of(nlp, ["trf", "middle"], disable=["back"])
    assert stages == Stages(("front",), ("trf", "middle"), ())
    assert not stages.overlaps  # nothing behind the transformers: one after the other
    stages = Stages.of(nlp, ["trf"], disable=[])
    assert stages.overlaps and stages.behind == ("middle", "back")
    assert stages.others(stages.helper) == ["front", "middle", "back"]


def test_overlap_false_and_one_cpu_run_spacys_pipe(
    roberta: Language, many_texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    def no_overlap(*args: object, **kwargs: object) -> Iterator[Doc]:
        raise AssertionError("overlap was used")

    monkeypatch.setattr(overlap_module.OverlappedPipe, "__next__", no_overlap)
    assert len(list(AcceleratedPipe(roberta, overlap=False)(many_texts[:4]))) == 4
    spacy_accelerate.optimize(roberta, "cpu", "fp32", overlap=False)
    assert len(list(roberta.pipe(many_texts[:4]))) == 4
    spacy_accelerate.optimize(roberta, "cpu", "fp32", overlap=True)
    monkeypatch.setattr(cpu_budget, "affinity_cpus", lambda: 1)
    assert len(list(roberta.pipe(many_texts[:4]))) == 4


def test_overlap_is_recorded_with_the_pipeline(roberta: Language, tmp_path: Path):
    roberta.to_disk(tmp_path / "saved")
    saved = (tmp_path / "saved" / "config.cfg").read_text()
    assert "overlap = true" in saved and "[nlp.after_pipeline_creation.overlap_plan]" in saved
    loaded = spacy.load(tmp_path / "saved")
    assert isinstance(loaded.pipe, AcceleratedPipe) and loaded.pipe.overlap
    off = spacy.load(tmp_path / "saved", config={"nlp.after_pipeline_creation.overlap": False})
    assert not off.pipe.overlap


def test_the_gate_judges_the_module_scoped_to_its_thread_not_the_served_one(
    roberta: Language, many_texts: list[str]
):
    # The agreement gate and calibration run a candidate in their own thread only: an
    # overlapped pass would run the served module in the helper thread instead.
    from spacy_accelerate.pipeline.components import transformer_components
    from spacy_accelerate.pipeline.patch import scoped
    from spacy_accelerate.pipeline.shim import find_shim
    from spacy_accelerate.planning.annotating import annotate

    (component,) = transformer_components(roberta)
    location = find_shim(component)
    calls: list[int] = []

    class Counted(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: object, **kwargs: object) -> object:
            calls.append(threading.get_ident())
            return self.inner(*args, **kwargs)

    with scoped(location, Counted(location.module)):
        docs = annotate(roberta, many_texts[:8])
    assert len(docs) == 8 and calls and set(calls) == {threading.get_ident()}
