"""What was served is easy to see: one INFO line per accelerated component, the proxy's
repr, and ``cache list``'s data (plan, source pipeline, component, last use)."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
from spacy.language import Language

import spacy_accelerate
from spacy_accelerate.backends.onnxruntime.quantize import plan_label
from spacy_accelerate.cache.provenance import PipelineSource, last_used
from spacy_accelerate.cache.store import MANIFEST_NAME, ModelCache
from spacy_accelerate.options.agreement import Annotation
from spacy_accelerate.provision.listing import CachedModel, list_cached
from spacy_accelerate.verify.agreement import AgreementReport, Rate
from spacy_accelerate.verify.record import RECORD_VERSION, BuildRecord

KEY = re.compile(r"key [0-9a-f]{12}")


@pytest.fixture()
def load(sample_path: Callable[[str], Path]) -> Callable[..., Language]:
    def loaded(name: str = "roberta", *, pipeline: str | None = None, version: str = "1.0.0"):
        nlp = spacy.load(sample_path(name))
        if pipeline is not None:
            nlp.meta["name"], nlp.meta["version"] = pipeline, version
        return nlp

    return loaded


def _served_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "spacy_accelerate"
        and record.levelno == logging.INFO
        and " runs " in record.getMessage()
    ]


def test_the_plan_labels_read_naturally() -> None:
    assert plan_label(()) == "every MatMul int8"
    assert plan_label(("a", "b"), 12) == "2 of 12 MatMuls kept float: a, b"
    assert plan_label(("a",)) == "1 MatMuls kept float: a"


def test_optimize_logs_one_line_per_component_and_the_repr_shows_it(
    load: Callable[..., Language], cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nlp = load("roberta-two")
    with caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, warmup=False)
    lines = _served_lines(caplog)
    assert len(lines) == 2, lines
    for name, line in zip(("transformer", "transformer_ner"), sorted(lines), strict=True):
        assert re.fullmatch(
            rf"spacy-accelerate: {name} runs cpu fp32, exported, {KEY.pattern}", line
        )
    proxies = spacy_accelerate.accelerated_components(nlp)
    for name, proxy in proxies.items():
        assert f"{name} runs {proxy.exported.summary}" in "\n".join(lines)
        assert proxy.exported.summary in repr(proxy)
        assert "family=roberta" in repr(proxy)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, warmup=False)
    again = _served_lines(caplog)
    assert len(again) == 2 and all("cpu fp32, cache hit, key " in line for line in again)


def test_provider_auto_names_the_provider_it_chose(
    load: Callable[..., Language], cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nlp = load()
    with caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        spacy_accelerate.optimize(nlp, "auto", "fp32", cache_dir=cache_dir, warmup=False)
    (line,) = _served_lines(caplog)
    chosen = spacy_accelerate.accelerated_components(nlp)["transformer"].session.provider
    assert f"transformer runs {chosen.provider.value} fp32, exported, key " in line
    assert "auto" not in line


def test_int8_entries_say_their_plan_source_and_last_use(
    load: Callable[..., Language], cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = load(pipeline="alpha", version="1.2.3")
    with caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        spacy_accelerate.optimize(first, "cpu", "int8", cache_dir=cache_dir, min_agreement=0.9)
    (line,) = _served_lines(caplog)
    assert re.match(
        r"spacy-accelerate: transformer runs cpu int8 \(every MatMul int8\), exported, "
        r"key [0-9a-f]{12}; agreement with PyTorch fp32",
        line,
    )
    # A second pipeline of the same family, provider and precision: another entry.
    second = load(pipeline="beta", version="2.0.0")
    spacy_accelerate.optimize(second, "cpu", "int8", cache_dir=cache_dir, min_agreement=0.85)
    entries = {entry.source: entry for entry in list_cached(cache_dir)}
    assert set(entries) == {"en_alpha 1.2.3", "en_beta 2.0.0"}
    alpha, beta = entries["en_alpha 1.2.3"], entries["en_beta 2.0.0"]
    assert alpha.key != beta.key
    for entry in (alpha, beta):
        assert (entry.family, entry.provider, entry.precision) == ("roberta", "cpu", "int8")
        assert entry.component == "transformer"
        assert entry.plan == "every MatMul int8"
        assert entry.last_used is not None and entry.last_used >= entry.created
        assert entry.summary == (
            f"cpu int8 (every MatMul int8), {entry.source} transformer, key {entry.key[:12]}"
        )
        listed = json.loads(json.dumps(entry.as_dict()))
        assert listed["source"] == entry.source and listed["last_used"] == entry.last_used
        assert listed["plan"] == "every MatMul int8" and listed["path"] == str(entry.path)
        assert set(listed["agreement"]) >= {"tag", "dep"}
    # A hit is a use; the source is not in the key: the same weights elsewhere hit it.
    manifest = alpha.path / MANIFEST_NAME
    os.utime(manifest, (946684800, 946684800))  # 2000-01-01
    assert last_used(alpha.path) == "2000-01-01T00:00:00+00:00"
    elsewhere = load(pipeline="gamma", version="9.9.9")
    spacy_accelerate.optimize(elsewhere, "cpu", "int8", cache_dir=cache_dir, min_agreement=0.9)
    proxy = spacy_accelerate.accelerated_components(elsewhere)["transformer"]
    assert proxy.exported.cache_hit and proxy.exported.key == alpha.key
    (again,) = [entry for entry in list_cached(cache_dir) if entry.key == alpha.key]
    assert again.source == "en_alpha 1.2.3"
    assert again.last_used is not None and again.last_used > "2001"
    assert again.created == alpha.created


def test_precision_auto_logs_the_plan_it_chose_once(
    load: Callable[..., Language], cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nlp = load()
    with caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        spacy_accelerate.optimize(nlp, "cpu", "auto", cache_dir=cache_dir, min_agreement=0.9)
    (line,) = _served_lines(caplog)
    served = spacy_accelerate.accelerated_components(nlp)["transformer"].session.config
    assert served.precision.value in ("fp32", "int8")
    assert f"transformer runs cpu {served.precision.value}" in line


def _entry(cache: ModelCache, key: str, export: dict, built: dict | None) -> CachedModel:
    def build(folder: Path) -> dict | None:
        (folder / "model.onnx").write_bytes(b"not a model")
        return built

    inputs = {"encoder": {"family": "roberta"}, "export": export}
    cache.get_or_build(key, inputs, build)
    (listed,) = [entry for entry in list_cached(cache.root) if entry.key == key]
    return listed


def test_entries_of_earlier_releases_still_list(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "cache")
    fp32 = _entry(cache, "a" * 64, {"provider": "cpu", "precision": "fp32"}, None)
    assert (fp32.plan, fp32.source, fp32.component) == ("whole model fp32", None, None)
    assert (
        fp32.last_used is not None
        and fp32.summary == f"cpu fp32 (whole model fp32), key {'a' * 12}"
    )
    json.dumps(fp32.as_dict())
    old = _entry(
        cache, "b" * 64, {"provider": "cpu", "precision": "int8"}, {"plan": "all MatMuls int8"}
    )
    assert old.plan == "every MatMul int8"
    kept = _entry(
        cache, "c" * 64, {"provider": "cpu", "precision": "int8"}, {"plan": "2 MatMuls float: x, y"}
    )
    assert kept.plan == "2 MatMuls kept float: x, y"
    openvino = {"plan": "layers 1, 2 float (bf16)"}
    ov = _entry(cache, "d" * 64, {"provider": "openvino", "precision": "int8"}, openvino)
    assert ov.plan == "layers 1, 2 float (bf16)"
    refusal = _entry(
        cache, "e" * 64, {"provider": "cpu", "precision": "int8"}, {"refusal": "accuracy"}
    )
    assert refusal.plan is None and refusal.note is not None
    broken = {"source": {"pipeline": 3}}
    odd = _entry(cache, "f" * 64, {"provider": "cpu", "precision": "fp32"}, broken)
    assert odd.source is None and odd.plan == "whole model fp32"
    earlier_choice = {"auto_precision": {"chosen": {"provider": "openvino", "precision": "bf16"}}}
    choice = _entry(cache, "9" * 64, {"provider": "cpu", "precision": "auto"}, earlier_choice)
    assert choice.note == "precision='auto' choice: openvino bf16" and choice.plan is None


def test_a_build_record_makes_the_round_trip_through_the_manifest() -> None:
    rates = ((Annotation.TAG, Rate(990, 1000)), (Annotation.DEP, Rate(97, 100)))
    record = BuildRecord(
        plan="2 of 72 MatMuls kept float: a, b",
        refused=("every MatMul int8: tag changed",),
        compiled_as="int8",
        agreement=AgreementReport(rates),
        calibration_sha256="c" * 64,
        source=PipelineSource("en_core_web_trf", "3.8.0", "transformer"),
    )
    stored = json.loads(json.dumps(record.as_dict()))
    assert stored["record_version"] == RECORD_VERSION
    assert BuildRecord.from_dict(stored) == record and record.holds_model
    for other in (BuildRecord(), BuildRecord(refusal="speed"), BuildRecord(chosen="cpu int8")):
        assert BuildRecord.from_dict(json.loads(json.dumps(other.as_dict()))) == other
    assert not BuildRecord(chosen="cpu int8").holds_model
    # What cannot be read is left empty: the entry is verified by its hashes, not its record.
    assert BuildRecord.from_dict({"plan": 3, "agreement": {"tag": "?"}, "refused": "x"}) == (
        BuildRecord()
    )
    assert BuildRecord.from_dict(None) == BuildRecord()


def test_the_source_is_read_from_spacys_meta() -> None:
    source = PipelineSource.of({"lang": "en", "name": "core_web_trf", "version": "3.8.0"}, "trf")
    assert source.describe() == "en_core_web_trf 3.8.0" and source.component == "trf"
    assert PipelineSource.from_dict(source.as_dict()) == source
    assert PipelineSource.of({}, "transformer").describe() == "xx_pipeline 0.0.0"
