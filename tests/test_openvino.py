"""``provider="openvino"``: the OpenVINO runtime on the CPU, fp32 and bf16."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import spacy
from annotations import disagreements, max_abs_diff, run

import spacy_accelerate
from spacy_accelerate import exported, openvino_runtime
from spacy_accelerate.benchmark import agreement
from spacy_accelerate.doc_outputs import token_cosines
from spacy_accelerate.errors import AccuracyError, InvalidOptionError, ProviderUnavailableError
from spacy_accelerate.openvino_runtime import IR_FILE, IR_WEIGHTS, OpenVINORunner

TEXTS = 32


@pytest.fixture(scope="module")
def texts(ewt_texts: list[str]) -> list[str]:
    return ewt_texts[:TEXTS]


@pytest.mark.parametrize("sample", ["roberta", "minilm", "st-bert"])
def test_fp32_matches_pytorch(
    sample: str, sample_path: Callable[[str], Path], texts: list[str], cache_dir: Path
):
    nlp = spacy.load(sample_path(sample))
    expected = run(nlp, texts, batch_size=8)
    spacy_accelerate.optimize(nlp, "openvino", "fp32", cache_dir=cache_dir)
    proxy = next(iter(spacy_accelerate.accelerated_components(nlp).values()))
    assert isinstance(proxy.session.runner, OpenVINORunner)
    assert proxy.exported.parity.worst <= 1e-4
    # The entry serves OpenVINO's IR, not the ONNX file it was converted from.
    files = {path.name for path in proxy.exported.path.iterdir()}
    assert {IR_FILE, IR_WEIGHTS} <= files and "model.onnx" not in files
    actual = run(nlp, texts, batch_size=8)
    assert max_abs_diff(expected, actual) <= 1e-4
    assert disagreements(expected, actual, nlp) == []


def test_bf16_keeps_token_cosine(
    sample_path: Callable[[str], Path], texts: list[str], cache_dir: Path
):
    if "BF16" not in openvino_runtime.cpu_capabilities():
        pytest.skip("this CPU has no bf16 arithmetic; the refusal is tested below")
    nlp = spacy.load(sample_path("minilm"))
    expected = run(nlp, texts, batch_size=8)
    spacy_accelerate.optimize(nlp, "openvino", "bf16", cache_dir=cache_dir)
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    assert proxy.exported.parity.gate.min_cosine == 0.999
    actual = run(nlp, texts, batch_size=8)
    pairs = zip(expected, actual, strict=True)
    cosines = np.concatenate([token_cosines(e, a) for e, a in pairs])
    assert cosines.min() >= 0.999
    assert max_abs_diff(expected, actual) > 1e-4  # bf16 really ran
    assert agreement(expected, actual).rate("ent") >= 0.99


def test_bf16_is_refused_on_a_cpu_without_bf16(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(openvino_runtime, "cpu_capabilities", lambda: frozenset({"FP32", "INT8"}))
    nlp = spacy.load(sample_path("roberta"))
    with pytest.raises(InvalidOptionError, match="AVX512_BF16 or AMX-BF16"):
        spacy_accelerate.optimize(nlp, "openvino", "bf16", cache_dir=cache_dir)
    assert not spacy_accelerate.is_optimized(nlp)


def test_a_warm_start_loads_the_ir_from_the_cache(
    sample_path: Callable[[str], Path], texts: list[str], cache_dir: Path, monkeypatch
):
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "openvino", "fp32", cache_dir=cache_dir)
    first = spacy_accelerate.accelerated_components(nlp)["transformer"].exported
    assert not first.cache_hit
    assert any((cache_dir / "openvino").iterdir())  # OpenVINO's compiled blobs

    def no_export(*args, **kwargs):
        raise AssertionError("a warm start must not export")

    monkeypatch.setattr(exported, "export_onnx", no_export)
    again = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(again, "openvino", "fp32", cache_dir=cache_dir)
    second = spacy_accelerate.accelerated_components(again)["transformer"].exported
    assert second.cache_hit and second.key == first.key
    assert disagreements(run(nlp, texts, 8), run(again, texts, 8), again) == []
    assert spacy_accelerate.clear_cache(cache_dir) >= 1
    assert not any((cache_dir / "openvino").glob("*"))


def test_the_key_depends_on_openvino_and_the_cpu(monkeypatch: pytest.MonkeyPatch):
    key = openvino_runtime.openvino_key()
    assert key["openvino"] and key["cpu"] and "FP32" in key["cpu"]
    config = spacy_accelerate.config.build_config("openvino", "fp32")
    assert exported._export_options(config)["openvino"] == key
    cpu = spacy_accelerate.config.build_config("cpu", "fp32")
    assert "openvino" not in exported._export_options(cpu)


def test_openvino_missing_names_the_extra(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a)
    )
    nlp = spacy.load(sample_path("roberta"))
    with pytest.raises(ProviderUnavailableError, match=r"spacy-accelerate\[openvino\]"):
        spacy_accelerate.optimize(nlp, "openvino", "fp32", cache_dir=cache_dir)


def test_int8_that_changes_the_pipelines_annotations_is_refused(
    sample_path: Callable[[str], Path], cache_dir: Path
):
    # The tiny sample's untrained heads flip tags on small changes: every plan of the
    # ladder passes the cosine gate or not, and the agreement gate refuses the rest.
    nlp = spacy.load(sample_path("roberta"))
    with pytest.raises(AccuracyError, match="agree with PyTorch's on only") as caught:
        spacy_accelerate.optimize(nlp, "openvino", "int8", cache_dir=cache_dir)
    assert "ffn kept float" in str(caught.value)  # the whole ladder was tried
    assert not spacy_accelerate.is_optimized(nlp)
    assert spacy_accelerate.list_cached(cache_dir) == []  # nothing refused is stored


def test_calibration_texts_are_validated():
    with pytest.raises(InvalidOptionError, match="calibration_texts must be"):
        spacy_accelerate.config.build_config("openvino", "int8", calibration_texts="one text")
    assert spacy_accelerate.config.build_config("openvino", "int8").gate().min_cosine == 0.995
