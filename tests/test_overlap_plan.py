"""The runtime's share of the CPUs under overlap (``spacy_accelerate.planning.overlap_plan``)
and the stage timings it is chosen from (``spacy_accelerate.planning.stage_times``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
from spacy.language import Language

import spacy_accelerate
from spacy_accelerate import cpu_budget
from spacy_accelerate.cpu_budget import OverlapCost
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.pipe import overlapped_stages
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.planning import overlap_plan
from spacy_accelerate.planning.overlap_plan import sample_texts
from spacy_accelerate.planning.stage_times import Breakdown, Stage, StageKind, breakdown

pytestmark = pytest.mark.real_overlap  # about the overlap timing itself

#: Per-word seconds measured on the Xeon (2 CPUs): minilm-ewt's light encoder and heavy
#: heads, trf-base's heavy encoder and light heads (benchmarks/results/overlap-*.json).
HEAVY_HEADS = (65e-6, 13e-6, 103e-6)
HEAVY_ENCODER = (270e-6, 9e-6, 35e-6)
#: The encoder nearly all the time (en_core_web_trf's shape on a slow CPU).
ENCODER_BOUND = (270e-6, 9e-6, 5e-6)


def _cost(threads: int, times: tuple[float, float, float]) -> OverlapCost:
    return OverlapCost(threads, *times)


def test_one_thread_fewer_where_the_components_take_about_as_long_as_the_encoder():
    assert _cost(2, HEAVY_HEADS).runtime_threads == 1
    assert _cost(2, HEAVY_ENCODER).runtime_threads == 2  # the encoder would run twice as long
    assert _cost(16, HEAVY_ENCODER).runtime_threads == 15  # one core of 16 costs it little
    assert _cost(1, HEAVY_HEADS).runtime_threads == 1


def test_overlap_is_predicted_to_pay_only_where_the_components_weigh():
    assert _cost(2, HEAVY_HEADS).pays and _cost(2, HEAVY_HEADS).gain > 1.2
    assert not _cost(2, ENCODER_BOUND).pays  # under MIN_OVERLAP_GAIN
    assert 1.0 < _cost(2, HEAVY_ENCODER).gain < 1.1  # the CPUs' work bounds it
    assert not _cost(1, HEAVY_HEADS).pays  # one CPU: nothing to overlap on


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
    monkeypatch.setattr(cpu_budget, "affinity_cpus", lambda: 2)


def _served_threads(nlp: Language) -> int:
    (proxy,) = spacy_accelerate.accelerated_components(nlp).values()
    return proxy.session.config.intra_op_threads


@pytest.mark.usefixtures("two_cpus")
def test_optimize_serves_on_the_measured_split_and_measures_a_predicted_gain(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    measured: list[int] = []
    gains: list[int] = []

    def timed(nlp: Language, texts: list[str], batch_size: int = 64) -> Breakdown:
        measured.append(len(texts))
        return _times(*HEAVY_HEADS)

    def gain(nlp: Language, stages, proxies: list, runtime: int, texts: list[str]) -> float:
        gains.append(runtime)
        return 1.01  # measured no gain, whatever the model predicted

    monkeypatch.setattr(overlap_plan, "breakdown", timed)
    monkeypatch.setattr(overlap_plan, "_measured_gain", gain)
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    assert len(measured) == 2 and gains == [1]  # a warm-up pass, timed, then both ways
    assert _served_threads(nlp) == 2 and not nlp.pipe.overlap  # no gain: off
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, overlap=True)
    assert _served_threads(nlp) == 1 and nlp.pipe.overlap  # forced, on the split
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, threads=2, overlap=True)
    assert _served_threads(nlp) == 2  # threads given: the caller's
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, overlap=False)
    assert _served_threads(nlp) == 2 and len(measured) == 6  # off: nothing timed
    docs = list(nlp.pipe(["One text.", "Another one."] * 4, batch_size=2))
    assert len(docs) == 8


@pytest.mark.usefixtures("two_cpus")
def test_the_measured_gain_times_both_ways_on_the_real_pipeline(
    sample_path: Callable[[str], Path], cache_dir: Path
):
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, overlap=False)
    proxies = list(spacy_accelerate.accelerated_components(nlp).values())
    before = [proxy.served.serving() for proxy in proxies]
    stages = overlapped_stages(nlp)
    assert stages is not None
    gain = overlap_plan._measured_gain(nlp, stages, proxies, 1, sample_texts(200))
    assert 0.1 < gain < 10
    assert [proxy.served.serving() for proxy in proxies] == before  # put back as it was


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


@pytest.mark.usefixtures("two_cpus")
def test_no_predicted_gain_means_overlap_off_by_default(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(overlap_plan, "breakdown", lambda *a, **k: _times(*ENCODER_BOUND))
    monkeypatch.setattr(overlap_plan, "_measured_gain", None)  # not timed both ways
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    assert not nlp.pipe.overlap and _served_threads(nlp) == 2
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, overlap=True)
    assert nlp.pipe.overlap  # forced


@pytest.mark.usefixtures("two_cpus")
def test_the_plan_is_measured_once_and_kept_by_saved_and_pickled_copies(
    sample_path: Callable[[str], Path],
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
):
    timed: list[int] = []

    def breakdown(nlp: Language, texts: list[str], batch_size: int = 64) -> Breakdown:
        timed.append(len(texts))
        return _times(*HEAVY_HEADS)

    monkeypatch.setattr(overlap_plan, "breakdown", breakdown)
    monkeypatch.setattr(overlap_plan, "_measured_gain", lambda *a: 1.3)
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    assert nlp.pipe.overlap and _served_threads(nlp) == 1 and len(timed) == 2
    for bundle in (True, False):
        spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, bundle=bundle)
        nlp.to_disk(tmp_path / f"saved-{bundle}")
        loaded = spacy.load(tmp_path / f"saved-{bundle}")
        assert loaded.pipe.overlap and _served_threads(loaded) == 1
    assert len(timed) == 6  # once per optimize(), never at load
    copied = spacy_accelerate.accelerated_components(pickle_round_trip(loaded))
    assert [m.session.config.intra_op_threads for m in copied.values()] == [1]
    assert len(timed) == 6


def pickle_round_trip(nlp: Language) -> Language:
    import pickle

    return pickle.loads(pickle.dumps(nlp))
