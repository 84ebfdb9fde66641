"""The one int8 search (verify/plan_search.py): plans raced first, judged fastest first,
ladders only where they can win; both backends go through it; a CPU without bf16 races
int8 against fp32. Timings and verdicts are injected: the search's order is what is
tested, not this machine's speed."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from unittest.mock import Mock

import numpy as np
import pytest
import spacy
from cpus import AMX_XEON, AVX512_EPYC
from hypothesis import given
from hypothesis import strategies as st

import spacy_accelerate
from spacy_accelerate import cpu_features as cpu_features_module
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.backends.onnxruntime.quantize import OnnxRuntimeQuantizer
from spacy_accelerate.backends.openvino.quantize import OpenVINOQuantizer
from spacy_accelerate.errors import (
    AccuracyError,
    AgreementError,
    NoFasterPlanError,
    OutpacedError,
    spelled,
)
from spacy_accelerate.options.config import Precision, Provider
from spacy_accelerate.options.gate import Gate
from spacy_accelerate.options.request import build_config
from spacy_accelerate.planning import auto_search
from spacy_accelerate.serving.proxy import AcceleratedModule
from spacy_accelerate.verify import speed
from spacy_accelerate.verify.parity import ParityReport
from spacy_accelerate.verify.plan_search import Built, Int8Search, Quantizer
from spacy_accelerate.verify.speed import NO_LIMITS, Limits, Resumed, Rival

ITEMS = [EncoderInputs.from_ids(np.ones((1, 4), dtype=np.int64), 0)]


def _report() -> ParityReport:
    return ParityReport(("h",), (0.0,), (1.0,), Gate(), (1, 4))


@dataclass
class FakeQuantizer(Quantizer[str, str]):  # type: ignore[type-var]
    """Plans are names; a plan's session is its name; ``ladder`` is the one ladder."""

    whole: Sequence[str]
    ladder: Sequence[str] = ()
    #: Whole plans faster by construction than others: ``{slower: faster}``.
    faster: dict[str, str] = field(default_factory=dict)
    built: list[str] = field(default_factory=list)
    measured: list[str] = field(default_factory=list)
    harm_measured: bool = False
    served: str | None = None
    #: What it hands a second round (its models, in a real backend).
    made: object | None = None

    def whole_plans(self) -> Sequence[str]:
        return self.whole

    def label(self, plan: str) -> str:
        return plan

    def faster_plan(self, plan: str) -> str | None:
        return self.faster.get(plan)

    def build(self, plan: str) -> Built[str, str]:  # type: ignore[type-var]
        self.built.append(plan)

        def measure() -> ParityReport:
            self.measured.append(plan)
            return _report()

        return Built(plan, plan, plan, measure)  # type: ignore[arg-type]

    def baseline(self) -> Rival:
        return Rival("fp32", "fp32")  # type: ignore[arg-type]

    def ladder_base(self) -> str:
        return self.whole[0]

    def ladders(self, base: Built[str, str]) -> Iterator[Sequence[str]]:  # type: ignore[type-var]
        self.harm_measured = True  # what ONNX Runtime's per-MatMul harm costs
        yield self.ladder

    def serve(self, built: Built[str, str]) -> None:  # type: ignore[type-var]
        self.served = built.label

    def discard(self) -> None:
        pass

    def carry(self) -> object | None:
        return self.made


def _timed(seconds: dict[str, float]) -> Callable[..., speed.Race]:
    """Races where each session (named as its plan) takes ``seconds[name]``; rivals 1 s."""

    def race(candidate, baseline, items, name, margin=0.0):
        return speed.Race(seconds[candidate], seconds.get(baseline, 1.0), name, 1, margin)

    return race


def _judge(passing: set[str], judged: list[str]) -> Callable[[str], object]:
    def judge(session: str) -> object:
        judged.append(session)
        if session not in passing:
            raise AgreementError("changed", finding=(f"tag changed by {session}",))
        return None

    return judge


def _search(
    quantizer: FakeQuantizer, passing: set[str], judged: list[str], limits: Limits = NO_LIMITS
) -> Int8Search:
    return Int8Search(
        quantizer,
        gate=Gate(),
        judge=_judge(passing, judged),  # type: ignore[arg-type]
        items=ITEMS,
        limits=limits,
    )


@pytest.mark.real_speed
def test_the_fastest_passing_whole_plan_is_served_and_slower_ones_are_never_judged(
    monkeypatch: pytest.MonkeyPatch,
):
    # static is fastest but changes tags; dynamic passes; blockwise is slower still, and
    # the slowest does not beat fp32 by the margin at all.
    seconds = {"static": 0.4, "dynamic": 0.6, "blockwise": 0.7, "slow": 0.97}
    monkeypatch.setattr(speed, "race", _timed(seconds))
    quantizer = FakeQuantizer(whole=["static", "slow", "blockwise", "dynamic"], ladder=["l1"])
    judged: list[str] = []
    built = _search(quantizer, {"dynamic", "blockwise"}, judged).run()
    session, report = built.session, built.record
    assert session == "dynamic" and quantizer.served == "dynamic"
    assert judged == ["static", "dynamic"]  # in speed order, stopping at the first pass
    assert quantizer.measured == ["static", "dynamic"]  # no parity for plans not judged
    assert not quantizer.harm_measured  # a whole plan passed: no ladder
    assert report.plan == "dynamic"
    assert report.refused[0].startswith("slow: not faster than fp32 by 5%")
    assert report.refused[1] == "static: tag changed by static"


@pytest.mark.real_speed
@pytest.mark.parametrize("coarse", [0.97, 0.6], ids=["coarse-loses", "coarse-wins"])
def test_a_plan_slower_by_construction_is_built_only_where_the_faster_one_won(
    monkeypatch: pytest.MonkeyPatch, coarse: float
):
    seconds = {"dynamic": 0.98, "blocks-128": coarse, "blocks-32": 0.5}
    monkeypatch.setattr(speed, "race", _timed(seconds))
    quantizer = FakeQuantizer(
        whole=["dynamic", "blocks-128", "blocks-32"], faster={"blocks-32": "blocks-128"}
    )
    judged: list[str] = []
    search = _search(quantizer, {"blocks-128", "blocks-32"}, judged)
    if coarse > 0.95:  # blocks of 128 lost its race: blocks of 32 is never made
        with pytest.raises(NoFasterPlanError):
            search.run()
        assert quantizer.built == ["dynamic", "blocks-128"] and judged == []
        assert spelled(search.refused[2]).startswith("blocks-32: not tried (slower than blocks")
    else:  # both built and raced; the faster one that passes is served
        session = search.run().session
        assert quantizer.built == ["dynamic", "blocks-128", "blocks-32"]
        assert session == "blocks-32" and judged == ["blocks-32"]


@pytest.mark.real_speed
def test_a_ladder_whose_all_int8_plan_cannot_win_is_skipped_harm_and_all(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(speed, "race", _timed({"all-int8": 0.98, "l1": 0.5}))
    quantizer = FakeQuantizer(whole=["all-int8"], ladder=["l1"])
    with pytest.raises(NoFasterPlanError) as refused:
        _search(quantizer, {"l1"}, []).run()
    assert not quantizer.harm_measured and quantizer.built == ["all-int8"]
    assert "units back in float: not tried (all-int8, the fastest plan of its ladder" in str(
        refused.value
    )


@pytest.mark.real_speed
def test_a_ladder_finds_the_fewest_float_units_and_must_still_win(
    monkeypatch: pytest.MonkeyPatch,
):
    ladder = ["f1", "f2", "f3", "f4"]
    seconds = {"all-int8": 0.5, "f1": 0.6, "f2": 0.7, "f3": 0.8, "f4": 0.9}
    monkeypatch.setattr(speed, "race", _timed(seconds))
    judged: list[str] = []
    quantizer = FakeQuantizer(whole=["all-int8"], ladder=ladder)
    session = _search(quantizer, {"f2", "f3", "f4"}, judged).run().session
    assert session == "f2" and quantizer.harm_measured
    assert judged[:2] == ["all-int8", "f4"]  # the most careful plan first, then bisection
    # The same ladder where the plans from f2 on are too slow: they are raced, never judged,
    # and the refusal is for speed.
    monkeypatch.setattr(speed, "race", _timed({**seconds, "f2": 0.99, "f3": 0.99, "f4": 0.99}))
    judged.clear()
    slow = FakeQuantizer(whole=["all-int8"], ladder=ladder)
    with pytest.raises(NoFasterPlanError, match="f2: not faster than fp32"):
        _search(slow, {"f2", "f3", "f4"}, judged).run()
    assert judged == ["all-int8", "f1"]


@pytest.mark.real_speed
@pytest.mark.parametrize("curve", ["linear", "steep", "noisy", "all fast"])
def test_a_ladder_finds_its_fast_plans_in_few_races(monkeypatch: pytest.MonkeyPatch, curve: str):
    # Eleven nested plans, each slower than the one before; fp32 (1 s) to beat by 5%.
    times = {
        "linear": [0.6 + 0.04 * i for i in range(11)],
        "steep": [0.5] * 9 + [1.2, 1.3],
        "noisy": [0.6, 0.7, 0.65, 0.9, 0.8, 0.96, 0.94, 0.97, 1.0, 1.1, 1.05],
        "all fast": [0.5 + 0.01 * i for i in range(11)],
    }[curve]
    ladder = [f"f{i}" for i in range(11)]
    monkeypatch.setattr(speed, "race", _timed(dict(zip(ladder, times, strict=True))))
    quantizer = FakeQuantizer(whole=["all-int8"], ladder=ladder)
    search = _search(quantizer, set(), [])
    fast = search.fast_prefix(ladder)
    # The plans up to the last that wins its race, found by races alone...
    assert search.race(search.build(ladder[fast - 1])) is None
    assert fast == len(ladder) or search.race(search.build(ladder[fast])) is not None
    # ...with fewer races than bisection needs where time grows with the float units, as
    # it does, and never more than twice as many elsewhere.
    bisection = 2 + math.ceil(math.log2(len(ladder) - 1))
    if curve == "linear":  # the first plan, then two guesses; the last plan never raced
        assert len(search.races) == 3 < bisection, sorted(search.races)
        assert ladder[-1] not in search.races
    assert len(search.races) <= 2 * bisection - 2, sorted(search.races)
    if curve != "noisy":
        assert fast == sum(1 for t in times if t < 0.95)
    # Given the ladder's base (all-int8, raced and won), the same answer without racing
    # the first plan on its own, and never in more races.
    known = _search(FakeQuantizer(whole=["all-int8"], ladder=ladder), set(), [])
    monkeypatch.setattr(
        speed, "race", _timed({"all-int8": 0.5, **dict(zip(ladder, times, strict=True))})
    )
    base = known.build("all-int8")
    assert known.race(base) is None
    found = known.fast_prefix(ladder, base)
    assert found == fast or curve == "noisy"
    assert len(known.races) - 1 <= len(search.races), sorted(known.races)
    if curve == "linear":
        assert ladder[0] not in known.races


@dataclass
class SharedQuantizer(FakeQuantizer):
    """A FakeQuantizer whose ladder plans say their share of the float work."""

    shares: dict[str, float] = field(default_factory=dict)

    def float_share(self, plan: str) -> float | None:
        return self.shares.get(plan)


@pytest.mark.real_speed
def test_a_ladder_interpolates_by_float_work_where_the_backend_knows_it(
    monkeypatch: pytest.MonkeyPatch,
):
    # Units of unequal work, the four big ones first (as the most harmful MatMuls of a
    # BERT are its feed-forward ones): time grows with the work, not the count.
    work = [4, 4, 4, 4] + [1] * 16
    ladder = [f"f{i}" for i in range(len(work))]
    shares = {plan: sum(work[: i + 1]) / sum(work) for i, plan in enumerate(ladder)}
    seconds = {"all-int8": 0.5, **{plan: 0.5 + 0.5 * shares[plan] for plan in ladder}}
    monkeypatch.setattr(speed, "race", _timed(seconds))
    found: dict[str, tuple[int, int]] = {}
    for kind, quantizer in [
        ("by place", FakeQuantizer(whole=["all-int8"], ladder=ladder)),
        ("by work", SharedQuantizer(whole=["all-int8"], ladder=ladder, shares=shares)),
    ]:
        search = _search(quantizer, set(), [])
        base = search.build("all-int8")
        found[kind] = (search.fast_prefix(ladder, base), len(search.races))
    wins = sum(1 for plan in ladder if seconds[plan] < 0.95)
    assert found["by place"][0] == found["by work"][0] == wins
    assert found["by work"][1] < found["by place"][1], found


@pytest.mark.real_speed
def test_auto_rivals_outpace_without_storing_and_ladders_wait_their_turn(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(speed, "race", _timed({"all-int8": 0.5, "bf16": 0.45, "l1": 0.6}))
    bf16 = Limits(rivals=(Rival("openvino bf16", "bf16", 0.0),))  # type: ignore[arg-type]
    with pytest.raises(OutpacedError) as outpaced:
        _search(FakeQuantizer(whole=["all-int8"], ladder=["l1"]), {"l1"}, [], bf16).run()
    assert not outpaced.value.deferred
    # First round of auto: whole plans only; a ladder that could win waits for the second.
    later = Limits(ladders=False)
    quantizer = FakeQuantizer(whole=["all-int8"], ladder=["l1"], made="all-int8's model")
    with pytest.raises(OutpacedError) as waiting:
        _search(quantizer, {"l1"}, [], later).run()
    assert waiting.value.deferred and not quantizer.harm_measured
    # The second round takes up where the first left: no whole plan is built, raced or
    # judged again, the base's race against the bar since is not run again, the first
    # round's notes stay in the record, and what its quantizer made is handed on.
    resume = waiting.value.resume
    assert isinstance(resume, Resumed) and resume.base.label == "all-int8"
    assert resume.carried == "all-int8's model"
    # Each backend takes back only what is of its own kind.
    assert Limits(resumed=resume).carried(str) == "all-int8's model"
    assert Limits(resumed=resume).carried(bytes) is None and NO_LIMITS.carried(str) is None
    assert not any("left until" in note for note in resume.notes)
    # Its base's race is reused only against the rival it was run against.
    assert [race.baseline_name for race in resume.races] == ["fp32"]
    assert resume.races_against((quantizer.baseline(),)) == resume.races
    assert resume.races_against(bf16.rivals) is None
    assert resume.races_against((Rival("fp32", "fp32", 0.0),)) is None  # type: ignore[arg-type]
    timed = _timed({"all-int8": 0.5, "bf16": 0.8, "l1": 0.6})
    won = timed("all-int8", "bf16", ITEMS, "openvino bf16", 0.0)
    raced: list[str] = []
    monkeypatch.setattr(speed, "race", lambda *args: raced.append(args[0]) or timed(*args))
    second = FakeQuantizer(whole=["all-int8"], ladder=["l1"])
    judged: list[str] = []
    limits = Limits(rivals=bf16.rivals, resumed=replace(resume, races=(won,)))
    built = _search(second, {"l1"}, judged, limits).run()
    assert built.record.plan == "l1" and judged == ["l1"]
    assert second.built == ["l1"] and second.harm_measured and raced == ["l1"]
    assert built.record.refused == tuple(spelled(note) for note in resume.notes)


@pytest.mark.real_speed
def test_a_second_round_keeps_what_its_first_round_found(monkeypatch: pytest.MonkeyPatch):
    # Round one: blockwise loses to auto's rival (bf16), all-int8 beats it but changes tags.
    monkeypatch.setattr(
        speed, "race", _timed({"all-int8": 0.5, "blockwise": 0.9, "bf16": 0.8, "l1": 0.6})
    )
    bf16 = (Rival("openvino bf16", "bf16"),)  # type: ignore[arg-type]
    first = FakeQuantizer(whole=["all-int8", "blockwise"], ladder=["l1"])
    with pytest.raises(OutpacedError) as waiting:
        _search(first, set(), [], Limits(rivals=bf16, ladders=False)).run()
    resume = waiting.value.resume
    assert resume.outrun_from_outside
    assert [spelled(found) for found in resume.disagreements] == [
        "all-int8: tag changed by all-int8"
    ]
    # Round two: the ladder fails too. The refusal is still auto's own (a rival from
    # outside passed blockwise over), so it is not stored as the by-name verdict.
    second = FakeQuantizer(whole=["all-int8", "blockwise"], ladder=["l1"])
    with pytest.raises(OutpacedError) as refused:
        _search(second, set(), [], Limits(rivals=bf16, resumed=resume)).run()
    assert not refused.value.deferred
    assert "blockwise: not faster than openvino bf16" in str(refused.value)
    assert "l1: tag changed by l1" in str(refused.value)


def test_a_search_refused_on_accuracy_alone_says_the_annotation():
    quantizer = FakeQuantizer(whole=["all-int8"], ladder=["f1", "f2"])
    with pytest.raises(AgreementError) as refused:
        _search(quantizer, set(), []).run()
    assert spelled(refused.value.finding) == "f2: tag changed by f2"  # the plan, then its rates
    assert not isinstance(refused.value, NoFasterPlanError)
    assert isinstance(refused.value, AccuracyError)


@pytest.mark.slow
def test_both_backends_search_through_the_one_int8_search(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    searched: list[type] = []
    run = Int8Search.run

    def recorded(search: Int8Search):
        searched.append(type(search.quantizer))
        return run(search)

    monkeypatch.setattr(Int8Search, "run", recorded)
    for provider in ("cpu", "openvino"):
        nlp = spacy.load(sample_path("roberta"))
        spacy_accelerate.optimize(nlp, provider, "int8", cache_dir=cache_dir, min_agreement=0.5)
    assert searched == [OnnxRuntimeQuantizer, OpenVINOQuantizer]


@pytest.mark.parametrize("cpu", ["amx-xeon", "avx512-epyc-without-bf16"])
def test_a_cpu_without_bf16_races_int8_against_fp32_not_bf16(
    sample_path: Callable[[str], Path],
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    cpu: str,
):
    simulated = AMX_XEON if cpu == "amx-xeon" else AVX512_EPYC.without_bf16()
    monkeypatch.setattr(cpu_features_module, "_simulated", [simulated])
    rivals: list[str] = []
    race = speed.race  # the suite's stand-in: every candidate twice as fast

    def recorded(candidate, baseline, items, name, margin=0.0):
        rivals.append(name)
        return race(candidate, baseline, items, name, margin)

    monkeypatch.setattr(speed, "race", recorded)
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.5)
    expected = "openvino bf16" if simulated.bf16 else "openvino fp32"
    assert rivals and set(rivals) == {expected}
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    # What is not int8 runs in bf16 only where the CPU has it.
    hint = proxy.session.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
    assert hint == "f32" or simulated.bf16


class _Location:
    """Where a stand-in module sits, for :class:`AutoSearch` without a pipeline."""

    def __init__(self) -> None:
        self.component = "transformer"
        self.module: object = "pytorch"


def _module(label: str) -> AcceleratedModule:
    module = Mock(spec=AcceleratedModule)
    module.session = label  # a rival's session: the race stand-in reads it by name
    return module


@pytest.mark.parametrize("full", [False, True])
def test_auto_tries_cheap_plans_first_and_bounds_the_rest_by_the_fastest_that_passed(
    monkeypatch: pytest.MonkeyPatch, full: bool
):
    # Seconds of the pipeline per plan (a deferred int8 search's all-int8 plan is "base").
    seconds = {"cpu fp32": 1.0, "openvino bf16": 0.6, "cpu int8": 0.5, "openvino int8": 0.4}
    passing = {"cpu fp32", "openvino bf16", "openvino int8"}
    calls: list[tuple[str, tuple[tuple[str, float], ...], bool]] = []
    location = _Location()

    def accelerate(config, limits):
        label = f"{config.provider.value} {config.precision.value}"
        limit = limits.get("transformer", Limits())
        rivals = tuple((rival.name, rival.margin) for rival in limit.rivals)
        calls.append((label, rivals, limit.ladders))
        if label == "cpu int8" and not limit.ladders:
            base = Built("all-int8", "all-int8", "base", _report)
            raise OutpacedError("ladders later", resume=Resumed(("whole plans",), base))
        if label not in passing:
            raise AgreementError("changed", finding=(f"{label} changed tags",))
        location.module = _module(label)

    monkeypatch.setattr(auto_search, "revert", lambda location, module: None)
    monkeypatch.setattr(auto_search, "patch", lambda location, module: None)
    timed: list[str] = []

    def time_it(self, modules, texts=()):
        timed.append(modules[0].session)
        return seconds[modules[0].session]

    monkeypatch.setattr(auto_search.AutoSearch, "timed", time_it)
    # The deferred search's all-int8 plan ("base", 0.45) loses to openvino int8 (0.4), as
    # lossy as it, so raced without a margin.
    monkeypatch.setattr(speed, "race", _timed({"base": 0.45, "openvino int8": 0.4}))
    source = Mock(texts=("a text",), full=Mock(items=ITEMS))
    config = build_config("auto", "auto")
    search = auto_search.AutoSearch(Mock(), config, [location], source, accelerate)
    candidates = [
        auto_search.Candidate(Provider(p), Precision(q))
        for p, q in [("cpu", "int8"), ("openvino", "int8"), ("openvino", "bf16"), ("cpu", "fp32")]
    ]
    if full:
        with auto_search.full_search():
            search = auto_search.AutoSearch(Mock(), config, [location], source, accelerate)
            choice = search.run(candidates)
    else:
        choice = search.run(candidates)
    assert choice.chosen.label == "openvino int8"  # the same plan either way
    # Each passing plan is warmed up and timed once when served, then timed again in the
    # race, however slow its first turn (fp32's 1.0 s is 2.5 times int8's 0.4 s).
    assert {label: timed.count(label) for label in passing} == {
        "cpu fp32": 1 + auto_search.TURNS,
        "openvino bf16": 1 + auto_search.TURNS,
        "openvino int8": 1 + auto_search.TURNS,
    }
    if full:  # every candidate in full, no rivals
        assert all(not rivals and ladders for _, rivals, ladders in calls)
        return
    # fp32 first (exact), then bf16, then the int8 searches, whole plans first; each lossy
    # one bounded by the plan served so far, by the margin where that one is less lossy.
    margin = speed.LOSSY_MARGIN
    assert calls == [
        ("cpu fp32", (), True),
        ("openvino bf16", (("cpu fp32", margin),), True),
        ("cpu int8", (("openvino bf16", margin),), False),
        ("openvino int8", (("openvino bf16", margin),), True),  # the last: ladders at once
    ]
    # cpu int8's ladders were never searched: its all-int8 plan lost to openvino int8.
    assert "units back in float: not tried" in choice.refused["cpu int8"]


_PASSES = st.lists(st.floats(0.01, 10.0), min_size=speed.ROUNDS, max_size=speed.ROUNDS)


@given(mine=_PASSES, theirs=_PASSES, margin=st.sampled_from([0.0, speed.LOSSY_MARGIN]))
def test_a_race_stopped_early_gives_the_verdict_of_every_round(mine, theirs, margin):
    # Whatever the rounds left would have timed, a race that stops early says what all
    # the rounds would (and one that may not stop times them all).
    def verdict(done: int) -> bool:
        return speed.Race(
            statistics.median(mine[:done]), statistics.median(theirs[:done]), "r", 1, margin
        ).faster

    for done in range(1, speed.ROUNDS):
        if speed.decided(mine[:done], theirs[:done], margin):
            assert verdict(done) == verdict(speed.ROUNDS)


def test_a_second_round_races_its_base_again_only_against_another_bar(
    monkeypatch: pytest.MonkeyPatch,
):
    raced: list[str] = []

    def race(candidate, baseline, items, name, margin=0.0):
        raced.append(name)
        return speed.Race(0.3, 0.6, name, 1, margin)

    monkeypatch.setattr(speed, "race", race)
    source = Mock(texts=("a text",), full=Mock(items=ITEMS))
    config = build_config("auto", "auto")
    search = auto_search.AutoSearch(Mock(), config, [_Location()], source, Mock())
    bf16 = auto_search.Candidate(Provider.OPENVINO, Precision.BF16)
    search.served[bf16.label] = auto_search.Served(bf16, [_module(bf16.label)], [0.6])
    cpu_int8 = auto_search.Candidate(Provider.CPU, Precision.INT8)
    base = Built("all-int8", "all-int8", "base", _report)
    won = speed.Race(0.3, 0.6, bf16.label, 1, speed.LOSSY_MARGIN)
    first = Resumed(("whole plans",), base, races=(won,))
    # The bar is still the plan the first round raced: its race stands.
    assert search.can_win(cpu_int8, first) == first and raced == []
    # Another plan passed since and set a new bar: the base races that one.
    ov_int8 = auto_search.Candidate(Provider.OPENVINO, Precision.INT8)
    search.served[ov_int8.label] = auto_search.Served(ov_int8, [_module(ov_int8.label)], [0.4])
    resumed = search.can_win(cpu_int8, first)
    assert raced == [ov_int8.label]
    assert resumed is not None and resumed.races[0].baseline_name == ov_int8.label
