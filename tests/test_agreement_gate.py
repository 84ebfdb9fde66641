"""One accuracy contract for every lossy plan: per-annotation agreement with PyTorch fp32 on
calibration texts, judged by the lower end of a 95% Wilson interval, and ``precision="auto"``."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
from spacy.language import Language
from spacy.tokens import Doc

import spacy_accelerate
from spacy_accelerate.architectures import detect_architecture
from spacy_accelerate.cpu_features import CpuFeatures, cpu_features, simulated
from spacy_accelerate.errors import Advice, AgreementError, PrecisionUnavailableError, spelled
from spacy_accelerate.options.agreement import DEFAULT_BOUNDS, Annotation, parse_min_agreement
from spacy_accelerate.options.config import texts_digest
from spacy_accelerate.options.request import OptimizeRequest, build_config
from spacy_accelerate.pipeline.components import find_transformer_components
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.planning import auto_precision, auto_search, judging
from spacy_accelerate.planning.annotating import annotate
from spacy_accelerate.planning.judging import check_agreement
from spacy_accelerate.planning.recording import builtin_texts, record_calibration
from spacy_accelerate.verify.agreement import (
    AUTOCAST_MARGIN,
    AgreementReport,
    Rate,
    RunningAgreement,
    compare,
    wilson_lower,
)
from spacy_accelerate.verify.speed import LOSSY_MARGIN


def _interval_by_search(same: int, total: int, z: float = 1.959963984540054) -> float:
    """The Wilson lower bound found the long way: the smallest p whose score test does
    not reject the observed rate (bisection), independent of the closed form."""
    observed = same / total
    low, high = 0.0, observed
    for _ in range(200):
        middle = (low + high) / 2
        if observed - middle > z * math.sqrt(middle * (1 - middle) / total):
            low = middle
        else:
            high = middle
    return high


@pytest.mark.parametrize(("same", "total"), [(996, 1000), (4890, 4913), (7, 10), (99, 100)])
def test_the_wilson_lower_bound_is_the_score_interval(same: int, total: int):
    assert wilson_lower(same, total) == pytest.approx(_interval_by_search(same, total), abs=1e-9)
    assert wilson_lower(same, total) < same / total
    # More evidence at the same rate narrows the interval.
    assert wilson_lower(same * 10, total * 10) > wilson_lower(same, total)


def test_the_wilson_rule_refuses_a_plan_that_passes_on_point_estimate_only():
    bounds = parse_min_agreement(None)
    small = AgreementReport(((Annotation.TAG, Rate(996, 1000)),))
    assert small.rate(Annotation.TAG).rate >= bounds.bound(Annotation.TAG)  # 99.6% >= 99.5%
    finding = spelled(small.refusal(bounds) or ())
    assert finding.startswith("tag agree with PyTorch's on 99.60%")
    assert "95% lower bound 98.98% < min_agreement 99.50%" in finding
    # The same rate on a hundred times the tokens clears the bound.
    assert AgreementReport(((Annotation.TAG, Rate(99600, 100000)),)).refusal(bounds) is None


def test_bf16_is_held_to_pytorch_autocast_within_the_margin():
    bounds = parse_min_agreement(0.9)
    autocast = AgreementReport(((Annotation.DEP, Rate(9990, 10000)),))
    close = AgreementReport(((Annotation.DEP, Rate(9986, 10000)),))
    far = AgreementReport(((Annotation.DEP, Rate(9980, 10000)),))
    assert AUTOCAST_MARGIN == 0.0005
    assert close.refusal(bounds, autocast) is None
    finding = spelled(far.refusal(bounds, autocast) or ())
    assert "below PyTorch's own bf16 autocast (99.90%)" in finding


@pytest.fixture()
def calibrated(bert: Language):
    """The bert sample's calibration on the first built-in texts (about 1,500 tokens)."""
    component = find_transformer_components(bert)[0]
    location = find_shim(component)
    spec = detect_architecture(location.read_pytorch_module()).spec
    texts = builtin_texts()[:40]
    return record_calibration(bert, location, spec, texts)


def _perturb_deps(every: int) -> Callable[[Doc], Doc]:
    """A parser that changes the label of one token in ``every`` (counted over the texts)."""
    seen = [0]

    def perturb(doc: Doc) -> Doc:
        for token in doc:
            seen[0] += 1
            if seen[0] % every == 0 and token.dep_ != "ROOT":
                token.dep_ = "dep" if token.dep_ != "dep" else "amod"
        return doc

    return perturb


def _add_perturbation(nlp: Language, every: int) -> None:
    name = f"perturb_deps_{every}"
    Language.component(name, func=_perturb_deps(every))
    nlp.add_pipe(name, after="parser")


def test_a_perturbed_parser_is_refused_by_the_dependency_bound_alone(bert: Language, calibrated):
    _add_perturbation(bert, 20)
    with pytest.raises(AgreementError) as refused:
        check_agreement(bert, calibrated, parse_min_agreement(None))
    assert spelled(refused.value.finding).startswith("dep agree with PyTorch's on ")
    bound = DEFAULT_BOUNDS[Annotation.DEP]
    assert f"min_agreement {bound:.2%}" in spelled(refused.value.finding)
    # Says what to change, naming the annotation's bound as data (spelled per interface).
    assert "lower the bound of that annotation (min_agreement['dep'])" in str(refused.value)
    assert Advice("min_agreement", item="dep") in refused.value.parts
    # Only the dependencies changed: every other annotation agrees on every token.
    report = compare(calibrated.docs, list(bert.pipe(calibrated.texts)))
    assert report.rate(Annotation.DEP).rate < 0.99
    others = [rate for annotation, rate in report.rates if annotation is not Annotation.DEP]
    assert others and all(rate.same == rate.total for rate in others)


def test_judging_stops_once_the_texts_left_cannot_save_the_plan(bert: Language, calibrated):
    _add_perturbation(bert, 20)
    bounds = parse_min_agreement(None)
    candidate = annotate(bert, calibrated.texts)
    whole = compare(calibrated.docs, candidate)
    assert whole.refusal(bounds) is not None  # the whole pass refuses it too
    with pytest.raises(AgreementError) as refused:
        check_agreement(bert, calibrated, bounds)
    stopped = re.search(r"in the first (\d+) of (\d+) texts", spelled(refused.value.finding))
    assert stopped is not None, spelled(refused.value.finding)
    assert int(stopped[1]) < int(stopped[2]) == len(calibrated.texts)
    # The stop is exact: once hopeless, every prefix after it stays hopeless, and the
    # counts of a whole pass are compare()'s.
    running = RunningAgreement(calibrated.docs)
    verdicts = []
    for index, doc in enumerate(candidate):
        running.add(index, doc)
        verdicts.append(running.hopeless(bounds) is not None)
    assert any(verdicts) and verdicts == sorted(verdicts)
    token_rates = [(a, r) for a, r in whole.rates if a is not Annotation.SPANS]
    assert list(running.so_far().rates) == token_rates


def test_a_plan_that_passes_is_judged_on_every_text(bert: Language, calibrated):
    report = check_agreement(bert, calibrated, parse_min_agreement(None))
    running = RunningAgreement(calibrated.docs)
    assert running.hopeless(parse_min_agreement(None)) is None
    tokens = sum(len(doc) for doc in calibrated.docs)
    assert report.rates and all(rate.total == tokens for _, rate in report.rates)


def test_a_mapping_of_bounds_is_honoured(bert: Language, calibrated):
    _add_perturbation(bert, 20)
    report = check_agreement(bert, calibrated, parse_min_agreement({"dep": 0.8}))
    assert 0.8 < report.rate(Annotation.DEP).rate < 0.99
    # A mapping that names another annotation leaves the dependencies at their default.
    with pytest.raises(AgreementError, match="dep agree"):
        check_agreement(bert, calibrated, parse_min_agreement({"tag": 0.8}))
    config = build_config("cpu", "int8", min_agreement={"DEP": 0.8})
    assert config.min_agreement.bound(Annotation.DEP) == 0.8
    assert config.min_agreement.bound(Annotation.TAG) == 0.995
    saved = OptimizeRequest.from_config(config, threads=None).saved()
    assert saved["min_agreement"] == {"dep": 0.8}


def test_a_few_changed_dependencies_pass_on_point_estimate_and_are_refused(
    bert: Language, calibrated
):
    tokens = sum(len(doc) for doc in calibrated.docs)
    bound = DEFAULT_BOUNDS[Annotation.DEP]
    # About four fifths of the changes the bound allows: under it on point estimate.
    _add_perturbation(bert, round(1 / (0.8 * (1 - bound))))
    report = compare(calibrated.docs, list(bert.pipe(calibrated.texts)))
    dep = report.rate(Annotation.DEP)
    assert dep.total == tokens and bound <= dep.rate < 1 - 0.5 * (1 - bound), dep
    assert dep.lower < bound
    with pytest.raises(AgreementError, match="95% lower bound"):
        check_agreement(bert, calibrated, parse_min_agreement(None))


def test_the_manifest_records_the_plan_its_agreement_and_the_calibration(
    bert: Language, cache_dir: Path
):
    spacy_accelerate.optimize(bert, "cpu", "int8", cache_dir=cache_dir)
    proxy = spacy_accelerate.accelerated_components(bert)["transformer"]
    agreement = proxy.exported.record.agreement
    assert agreement is not None
    assert {a.value for a, _ in agreement.rates} == {"tag", "dep", "sent_start", "ent"}
    for _, rate in agreement.rates:
        assert rate.lower >= parse_min_agreement(None).bound(_)
    manifest = json.loads((proxy.exported.path / "manifest.json").read_text())
    built = manifest["built"]
    assert built["plan"] == proxy.exported.record.plan
    assert built["calibration_sha256"] == texts_digest(builtin_texts())
    assert built["agreement"] == agreement.as_dict()
    options = manifest["key_inputs"]["export"]
    assert options["accuracy_control"]["min_agreement"]["dep"] == DEFAULT_BOUNDS[Annotation.DEP]
    (listed,) = spacy_accelerate.list_cached(cache_dir)
    assert listed.plan == proxy.exported.record.plan
    assert listed.agreement == {a.value: r.rate for a, r in agreement.rates}


def test_bf16_is_refused_when_pytorch_autocast_is_more_faithful(
    bert: Language, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    if not cpu_features().bf16:  # this CPU: OpenVINO's bf16 is refused before any export
        with pytest.raises(PrecisionUnavailableError):
            spacy_accelerate.optimize(bert, "openvino", "bf16", cache_dir=cache_dir)
        return
    measured: list[AgreementReport] = []

    def perfect_autocast(source):
        report = compare(source.full.docs, source.full.docs)
        measured.append(report)
        return report

    monkeypatch.setattr(judging, "autocast_agreement", perfect_autocast)
    try:
        spacy_accelerate.optimize(bert, "openvino", "bf16", cache_dir=cache_dir)
    except AgreementError as error:
        assert "below PyTorch's own bf16 autocast (100.00%)" in spelled(error.finding)
    else:  # this CPU's bf16 kept every annotation within the margin of a perfect autocast
        proxy = spacy_accelerate.accelerated_components(bert)["transformer"]
        for _, rate in proxy.exported.record.agreement.rates:
            assert rate.rate >= 1.0 - AUTOCAST_MARGIN
    assert len(measured) == 1  # the floor is measured once, for bf16 only


class _Searches:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        search = auto_search.AutoSearch.run

        def counted(*args, **kwargs):
            self.count += 1
            return search(*args, **kwargs)

        monkeypatch.setattr(auto_search.AutoSearch, "run", counted)


def _stored_choice(cache_dir: Path) -> dict:
    (choice,) = [
        json.loads((entry.path / auto_precision.CHOICE_FILE).read_text())
        for entry in spacy_accelerate.list_cached(cache_dir)
        if (entry.path / auto_precision.CHOICE_FILE).exists()
    ]
    return choice


def test_auto_serves_the_fastest_passing_plan_and_a_warm_start_reuses_it(
    bert: Language, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog
):
    searches = _Searches(monkeypatch)
    with caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        spacy_accelerate.optimize(bert, "cpu", "auto", cache_dir=cache_dir)
    assert searches.count == 1
    choice = _stored_choice(cache_dir)
    seconds = choice["seconds"]
    assert set(seconds) | set(choice["refused"]) == {"cpu fp32", "cpu int8"}
    chosen = f"{choice['chosen']['provider']} {choice['chosen']['precision']}"
    ranks = {"cpu fp32": 0, "cpu int8": 2}  # int8 must beat fp32 by the margin to win
    assert chosen == auto_search.fastest(seconds, ranks)
    proxy = spacy_accelerate.accelerated_components(bert)["transformer"]
    assert proxy.session.config.precision.value == choice["chosen"]["precision"]
    assert f"precision='auto' chose {chosen}" in caplog.text
    spacy_accelerate.restore(bert)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        spacy_accelerate.optimize(bert, "cpu", "auto", cache_dir=cache_dir)
    assert searches.count == 1  # no search on a warm start
    assert "the stored choice was reused" in caplog.text
    again = spacy_accelerate.accelerated_components(bert)["transformer"]
    assert again.session.config.precision.value == choice["chosen"]["precision"]
    assert again.exported.cache_hit


def test_the_auto_choice_is_not_reused_on_a_cpu_with_other_features(
    bert: Language, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    searches = _Searches(monkeypatch)
    spacy_accelerate.optimize(bert, "cpu", "auto", cache_dir=cache_dir)
    here = cpu_features()
    other = CpuFeatures(
        vendor=here.vendor,
        flags=here.flags ^ {"avx512_bf16"},  # one feature more or less
        machine=here.machine,
    )
    spacy_accelerate.restore(bert)
    with simulated(other):
        spacy_accelerate.optimize(bert, "cpu", "auto", cache_dir=cache_dir)
    assert searches.count == 2
    spacy_accelerate.restore(bert)
    spacy_accelerate.optimize(bert, "cpu", "auto", cache_dir=cache_dir)  # back here: stored
    assert searches.count == 2


def test_auto_says_why_a_refused_plan_lost(
    bert: Language, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog
):
    # 99.99% cannot be shown on the built-in sample's 9,015 tokens: every lossy plan loses.
    with caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        spacy_accelerate.optimize(bert, "cpu", "auto", cache_dir=cache_dir, min_agreement=0.9999)
    choice = _stored_choice(cache_dir)
    assert choice["chosen"]["precision"] == "fp32"
    assert "cannot show min_agreement 99.99%" in choice["refused"]["cpu int8"]
    assert "refused: cpu int8:" in caplog.text
    # The same request by name gets the same verdict, as an AgreementError naming the
    # annotation, the count and the bound.
    with pytest.raises(AgreementError) as refused:
        spacy_accelerate.optimize(bert, "cpu", "int8", cache_dir=cache_dir, min_agreement=0.9999)
    assert re.match(
        r"11 of 12 MatMuls kept float: \S.*: tag: 9,015 calibration tokens cannot show "
        r"min_agreement "
        r"99.99% \(even with none changed, the 95% lower bound is 99.96%; it takes at least "
        r"38,411\)",
        spelled(refused.value.finding),
    ), spelled(refused.value.finding)


def test_min_agreement_one_allows_no_change_at_all():
    bounds = parse_min_agreement(1.0)
    perfect = AgreementReport(((Annotation.ENT, Rate(500, 500)),))
    assert perfect.refusal(bounds) is None  # its Wilson bound is below 1, and still it passes
    one = AgreementReport(((Annotation.ENT, Rate(499, 500)),))
    assert "1 changed; min_agreement 100% allows none" in spelled(one.refusal(bounds) or ())


def test_text_categories_are_judged_per_document_and_label():
    import spacy as spacy_module

    nlp = spacy_module.blank("en")
    reference = [nlp.make_doc(f"text {i}") for i in range(300)]
    candidate = [nlp.make_doc(f"text {i}") for i in range(300)]
    for i, (a, b) in enumerate(zip(reference, candidate, strict=True)):
        a.cats = {"POS": 0.9, "NEG": 0.1, "URGENT": 0.7}
        b.cats = {"POS": 0.8, "NEG": 0.2, "URGENT": 0.4 if i == 0 else 0.6}
    report = compare(reference, candidate)
    cats = report.rate(Annotation.CATS)
    assert (cats.same, cats.total) == (899, 900)
    # A candidate that invents spans where the reference has none disagrees.
    candidate[0].spans["sc"] = [candidate[0][0:1]]
    spans = compare(reference, candidate).rate(Annotation.SPANS)
    assert (spans.same, spans.total) == (0, 1)


def test_too_few_units_are_refused_with_how_many_it_takes():
    report = AgreementReport(((Annotation.CATS, Rate(208, 208)),))
    finding = spelled(report.refusal(parse_min_agreement(None)) or ())
    assert "208 calibration document-label decisions cannot show" in finding
    assert "it takes at least 381" in finding


def test_a_saved_pipeline_keeps_its_bounds_and_its_auto_choice(
    bert: Language, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    searches = _Searches(monkeypatch)
    bounds = {"dep": 0.9, "tag": 0.95}
    spacy_accelerate.optimize(bert, "cpu", "auto", cache_dir=cache_dir, min_agreement=bounds)
    chosen = spacy_accelerate.accelerated_components(bert)["transformer"].session.config
    bert.to_disk(tmp_path / "saved")
    loaded = spacy.load(tmp_path / "saved")
    assert spacy_accelerate.is_optimized(loaded)
    assert searches.count == 1  # loading read the stored choice
    served = spacy_accelerate.accelerated_components(loaded)["transformer"].session.config
    assert (served.provider, served.precision) == (chosen.provider, chosen.precision)
    assert served.min_agreement == build_config("cpu", "auto", min_agreement=bounds).min_agreement
    assert "auto" in (tmp_path / "saved" / "config.cfg").read_text()


@pytest.mark.slow
def test_the_reference_is_pytorch_fp32_even_where_another_transformer_is_accelerated(
    samples_root: Path, cache_dir: Path, ewt_texts: list[str]
):
    from spacy_accelerate_samples import load_sample

    nlp = load_sample("roberta-two", samples_root)
    texts = ewt_texts[:12]
    reference = list(nlp.pipe(texts, batch_size=32))
    component = find_transformer_components(nlp)[1]
    location = find_shim(component)
    spec = detect_architecture(location.read_pytorch_module()).spec
    # The first transformer runs int8 (its entities change); the second one's calibration
    # must still compare with the pipeline on PyTorch fp32.
    spacy_accelerate.optimize(nlp, "cpu", "int8", cache_dir=cache_dir, min_agreement=0.5)
    changed = compare(reference, list(nlp.pipe(texts, batch_size=32)))
    assert any(rate.same < rate.total for _, rate in changed.rates)
    recorded = record_calibration(nlp, location, spec, texts)
    again = compare(reference, list(recorded.docs))
    assert all(rate.same == rate.total for _, rate in again.rates), again.describe()
    assert spacy_accelerate.is_optimized(nlp)  # and the pipeline itself stays accelerated


def test_a_lossier_plan_must_beat_a_less_lossy_one_by_the_margin():
    fastest = auto_search.fastest
    ranks = {"cpu fp32": 0, "openvino fp32": 0, "openvino bf16": 1, "cpu int8": 2}
    ranks["openvino int8"] = 2
    assert LOSSY_MARGIN == 0.05
    assert fastest({"cpu fp32": 1.0, "cpu int8": 0.97}, ranks) == "cpu fp32"
    assert fastest({"cpu fp32": 1.0, "cpu int8": 0.90}, ranks) == "cpu int8"
    assert fastest({"cpu fp32": 1.0, "openvino bf16": 0.5, "cpu int8": 0.6}, ranks) == (
        "openvino bf16"
    )
    # int8 against bf16 is lossier against lossy: the margin holds there too
    assert fastest({"openvino bf16": 0.5, "openvino int8": 0.49}, ranks) == "openvino bf16"
    assert fastest({"openvino bf16": 0.5, "openvino int8": 0.45}, ranks) == "openvino int8"
    # bf16 within the margin of fp32 is not served, but int8 beyond it still is
    seconds = {"cpu fp32": 1.0, "openvino bf16": 0.97, "openvino int8": 0.9}
    assert fastest(seconds, ranks) == "openvino int8"
    # as lossy as each other: the faster one, by any amount
    assert fastest({"cpu fp32": 1.0, "openvino fp32": 0.99}, ranks) == "openvino fp32"
    assert fastest({"cpu int8": 0.6, "openvino int8": 0.59}, ranks) == "openvino int8"


@pytest.mark.parametrize("shortest_first", [True, False])
def test_annotate_runs_the_texts_shortest_first_and_keeps_their_order(shortest_first: bool):
    nlp = spacy.blank("en")
    seen: list[str] = []
    tokenize = nlp.tokenizer

    def recording(text: str) -> Doc:  # the order the pipeline meets the texts in
        seen.append(text)
        return tokenize(text)

    nlp.tokenizer = recording
    texts = ["a much longer text than the others", "short", "a middle text", "tiny one"]
    docs = annotate(nlp, texts, shortest_first=shortest_first)
    assert [doc.text for doc in docs] == texts
    assert seen == (sorted(texts, key=len) if shortest_first else texts)
