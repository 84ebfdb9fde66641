"""The runtime's share of the CPUs under overlap (``spacy_accelerate.pipeline.thread_split``)
and the stage timings it is chosen from (``spacy_accelerate.pipeline.stage_times``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
from spacy.language import Language

import spacy_accelerate
from spacy_accelerate.pipeline import pipe as pipe_module
from spacy_accelerate.pipeline import thread_split
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.pipeline.stage_times import Breakdown, Stage, StageKind, breakdown
from spacy_accelerate.pipeline.thread_split import runtime_threads, sample_texts

#: Per-word seconds measured on the Xeon (2 CPUs): minilm-ewt's light encoder and heavy
#: heads, trf-base's heavy encoder and light heads (benchmarks/results/overlap-*.json).
HEAVY_HEADS = (65e-6, 13e-6, 103e-6)
HEAVY_ENCODER = (270e-6, 9e-6, 35e-6)


def test_one_thread_fewer_where_the_components_take_about_as_long_as_the_encoder():
    assert runtime_threads(2, *HEAVY_HEADS) == 1
    assert runtime_threads(2, *HEAVY_ENCODER) == 2  # the encoder would run twice as long
    assert runtime_threads(16, *HEAVY_ENCODER) == 15  # one core of 16 costs it little
    assert runtime_threads(1, *HEAVY_HEADS) == 1


def test_the_sample_holds_about_the_words_asked_for():
    texts = sample_texts(300)
    words = sum(len(text.split()) for text in texts)
    assert 300 <= words < 300 + max(len(text.split()) for text in texts)
    assert sample_texts(10**9) == sample_texts(10**8)  # the whole sample at most


def _times(encoder: float, around: float, components: float) -> Breakdown:
    return Breakdown(
        words=1,
        stages=(
            Stage("tokenizer", StageKind.TOKENIZER, 0.0),
            Stage("transformer encoder call", StageKind.ENCODER_CALL, encoder),
            Stage("transformer around the call", StageKind.AROUND_CALL, around),
            Stage("tagger", StageKind.COMPONENT, components),
        ),
    )


@pytest.fixture()
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Overlap can run (whatever this machine has), and the runtime's default is 2."""
    monkeypatch.setattr(pipe_module, "default_threads", lambda: 2)
    from spacy_accelerate.options import request

    monkeypatch.setattr(request, "default_threads", lambda: 2)
    monkeypatch.setattr(thread_split, "_MEASURED", {})


def _served_threads(nlp: Language) -> int:
    (proxy,) = spacy_accelerate.accelerated_components(nlp).values()
    return proxy.session.config.intra_op_threads


@pytest.mark.usefixtures("two_cpus")
def test_optimize_serves_on_the_measured_split_once_per_served_pipeline(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    measured: list[int] = []

    def timed(nlp: Language, texts: list[str], batch_size: int = 64) -> Breakdown:
        measured.append(len(texts))
        return _times(*HEAVY_HEADS)

    monkeypatch.setattr(thread_split, "breakdown", timed)
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    assert _served_threads(nlp) == 1 and len(measured) == 2  # a warm-up pass, then timed
    docs = list(nlp.pipe(["One text.", "Another one."] * 4, batch_size=2))
    assert len(docs) == 8
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    assert _served_threads(nlp) == 1 and len(measured) == 2  # remembered, not timed again
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, threads=2)
    assert _served_threads(nlp) == 2  # threads given: the caller's
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, overlap=False)
    assert _served_threads(nlp) == 2 and len(measured) == 2


@pytest.mark.usefixtures("two_cpus")
def test_a_heavy_encoder_keeps_every_thread(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(thread_split, "breakdown", lambda *a, **k: _times(*HEAVY_ENCODER))
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    assert _served_threads(nlp) == 2


def test_the_breakdown_times_each_stage_and_leaves_the_module_in_place(
    sample_path: Callable[[str], Path], cache_dir: Path, ewt_texts: list[str]
):
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, overlap=False)
    (component,) = transformer_components(nlp)
    module = find_shim(component).module
    found = breakdown(nlp, ewt_texts[:12], batch_size=4)
    names = [stage.name for stage in found.stages]
    expected = [n for name in nlp.pipe_names for n in _rows(name)]
    assert names == ["tokenizer", *expected]
    assert all(stage.seconds >= 0 for stage in found.stages)
    assert found.seconds(StageKind.ENCODER_CALL) > 0
    assert found.words == sum(len(nlp.make_doc(text)) for text in ewt_texts[:12])
    assert find_shim(component).module is module  # timed in scope only
    assert sum(row["share"] for row in found.as_dict().values()) == pytest.approx(1, abs=0.01)


def _rows(component: str) -> list[str]:
    if component != "transformer":
        return [component]
    return [
        f"transformer {StageKind.ENCODER_CALL.value}",
        f"transformer {StageKind.AROUND_CALL.value}",
    ]
