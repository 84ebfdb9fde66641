"""OpenVINO int8's accuracy control, the calibrated gate and ``auto``'s CPU rule, piece by piece."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import spacy

from spacy_accelerate import providers
from spacy_accelerate.calibration import CalibrationSource
from spacy_accelerate.config import Precision, Provider, build_config
from spacy_accelerate.errors import InvalidOptionError, ProviderUnavailableError
from spacy_accelerate.export import export_onnx
from spacy_accelerate.gate import Gate, recorded_report_meets
from spacy_accelerate.openvino_quantize import FloatLayers, matmuls_by_layer, plan_ladder
from spacy_accelerate.parity import read_pieces
from spacy_accelerate.shim import find_shim
from spacy_accelerate.spot_check import spot_check_gate
from spacy_accelerate.validate import find_transformer_components


def test_read_pieces_leave_out_each_rows_span_markers_and_padding():
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [0, 1, 1, 1, 1]])
    read = read_pieces(mask)
    assert read.tolist() == [
        [False, True, True, False, False],
        [False, False, False, False, False],  # markers only: an empty span
        [False, False, False, False, False],
        [False, False, True, True, False],  # left padding
    ]


def test_the_calibrated_gate_bounds_the_mean_and_every_piece():
    gate = build_config("openvino", "int8").gate()
    assert gate == Gate(min_cosine=0.95, min_mean_cosine=0.995)
    assert gate.accepts(0.5, 0.96, 0.996)
    assert not gate.accepts(0.5, 0.96, 0.994)  # the mean
    assert not gate.accepts(0.5, 0.94, 0.999)  # one broken piece
    assert not gate.accepts(float("nan"), 0.99, 0.999)
    assert build_config("openvino", "int8", min_cosine=0.99).gate().min_mean_cosine == 0.99
    # Elsewhere the bound is on every piece, as before.
    assert build_config("cpu", "int8").gate() == Gate(min_cosine=0.99)
    assert build_config("openvino", "bf16").gate() == Gate(min_cosine=0.999)


def test_a_stored_report_without_a_mean_proves_no_calibrated_gate():
    report = {"max_abs_diff": [0.1], "min_cosine": [0.999]}
    assert recorded_report_meets(report, Gate(min_cosine=0.99))
    assert not recorded_report_meets(report, Gate(min_cosine=0.95, min_mean_cosine=0.995))
    report["mean_cosine"] = [0.9999, 0.998]
    assert recorded_report_meets(report, Gate(min_cosine=0.95, min_mean_cosine=0.995))
    assert not recorded_report_meets(report, Gate(min_cosine=0.95, min_mean_cosine=0.999))


def test_the_ladder_reverts_the_most_harmful_layers_up_to_half():
    harm = [0.001, 0.005, 0.002, 0.0005, 0.003, 0.0]
    assert list(plan_ladder(harm)) == [
        FloatLayers((2,)),
        FloatLayers((2, 5)),
        FloatLayers((2, 3, 5)),  # 4 would be more than half of 6
    ]
    assert list(plan_ladder([0.1, 0.2])) == [FloatLayers((2,))]
    twelve = list(plan_ladder([float(k) for k in range(12)]))
    assert [len(plan.layers) for plan in twelve] == [1, 2, 4, 6]
    assert twelve[-1].layers == (7, 8, 9, 10, 11, 12) and twelve[-1].label.endswith("float")
    assert FloatLayers().label == "all layers int8"


@pytest.mark.parametrize("sample", ["bert", "roberta", "albert"])
def test_matmuls_are_split_by_layer_from_the_graph(
    sample: str, sample_path: Callable[[str], Path], tmp_path: Path
):
    nlp = spacy.load(sample_path(sample))
    from spacy_accelerate.architectures import detect_architecture

    module = find_shim(find_transformer_components(nlp)[0]).pytorch_module
    detected = detect_architecture(module)
    hf_model = detected.architecture.to_hugging_face(detected.encoder, detected.spec)
    path = tmp_path / "model.onnx"
    export_onnx(hf_model, detected.spec, path, opset=17)
    graph = onnx.load(str(path))
    layers = matmuls_by_layer(graph, detected.spec)
    assert sorted(layers) == list(range(1, detected.spec.num_hidden_layers + 1))
    counts = {len(names) for names in layers.values()}
    assert len(counts) == 1 and counts.pop() >= 4  # q, k, v, out, ffn in/out (+ attention)
    every = [name for names in layers.values() for name in names]
    assert len(every) == len(set(every))
    if sample != "albert":  # ALBERT runs one shared layer, its nodes are not named by layer
        # Cross-check with the exporter's own naming (Hugging Face numbers layers from 0).
        for layer, names in layers.items():
            assert all(f"/layer.{layer - 1}/" in name for name in names)


def test_min_agreement_is_validated():
    assert build_config("openvino", "int8").agreement_bound == 0.995
    assert build_config("openvino", "int8", min_agreement=0.98).agreement_bound == 0.98
    for bad in (0, 1.5, "0.9", True):
        with pytest.raises(InvalidOptionError, match="min_agreement must be"):
            build_config("openvino", "int8", min_agreement=bad)


@pytest.mark.parametrize(
    ("vendor", "precision", "first"),
    [
        ("GenuineIntel", Precision.INT8, Provider.OPENVINO),
        ("GenuineIntel", Precision.BF16, Provider.OPENVINO),
        ("GenuineIntel", Precision.FP32, Provider.CPU),
        ("AuthenticAMD", Precision.INT8, Provider.CPU),
        ("AuthenticAMD", Precision.FP32, Provider.CPU),
        ("", Precision.INT8, Provider.CPU),
    ],
)
def test_auto_prefers_openvino_on_intel_at_int8_and_bf16(
    vendor: str, precision: Precision, first: Provider, monkeypatch: pytest.MonkeyPatch
):
    assert providers.cpu_order(precision, vendor)[0] is first
    monkeypatch.setattr(providers, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(providers, "torch_cuda_problem", lambda: "no GPU in this test")
    config = build_config("auto", precision)
    served = providers.check_provider(config).provider
    # bf16 is served by OpenVINO alone on a CPU, whatever the vendor.
    assert served is (Provider.OPENVINO if precision is Precision.BF16 else first)


def test_auto_without_openvino_stays_on_onnx_runtime(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(providers, "cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setattr(providers, "torch_cuda_problem", lambda: "no GPU in this test")
    listed = providers.listed_providers
    monkeypatch.setattr(providers, "listed_providers", lambda: listed() - {Provider.OPENVINO})
    assert providers.check_provider(build_config("auto", "int8")).provider is Provider.CPU


def test_the_cpu_vendor_is_read_here():
    vendor = providers.cpu_vendor()
    assert vendor == "" or vendor.isalnum()
    if Path("/proc/cpuinfo").exists():
        assert vendor in Path("/proc/cpuinfo").read_text()


def test_read_pieces_find_the_end_marker_past_padding_inside_a_row():
    # A padding id inside a row (spacy-transformers masks by the mask, not by position).
    read = read_pieces(np.array([[1, 1, 0, 1, 1]]))
    assert read.tolist() == [[False, True, False, True, False]]


def test_a_warm_spot_check_holds_the_stored_batches_to_their_own_figure():
    gate = Gate(min_cosine=0.95, min_mean_cosine=0.995)
    # Two batches may average below the bound the whole calibration set met.
    assert spot_check_gate(gate, 0.9941) == Gate(min_cosine=0.95, min_mean_cosine=0.9931)
    assert spot_check_gate(gate, 0.9999) == gate  # never more than the full bound
    assert spot_check_gate(gate, None) == gate  # an entry from before: the full bound
    assert spot_check_gate(Gate(min_cosine=0.99), 0.9) == Gate(min_cosine=0.99)


def test_calibration_texts_must_be_real_texts():
    for bad in ([""], ["a text", "   "], (text for text in ()), "one text"):
        with pytest.raises(InvalidOptionError, match="non-blank strings"):
            build_config("openvino", "int8", calibration_texts=bad)
    generated = build_config("openvino", "int8", calibration_texts=(t for t in ["a", "b"]))
    assert generated.calibration_texts == ("a", "b")  # a generator is read once, kept whole


def test_openvino_is_listed_without_onnxruntime(monkeypatch: pytest.MonkeyPatch):
    def missing():
        raise ProviderUnavailableError("ONNX Runtime is not installed")

    monkeypatch.setattr(providers, "import_onnxruntime", missing)
    assert providers.listed_providers() == {Provider.OPENVINO}


def test_the_key_follows_the_heads_the_agreement_judges(sample_path: Callable[[str], Path]):
    def judged_by(nlp: spacy.language.Language) -> str:
        location = find_shim(find_transformer_components(nlp)[0])
        return CalibrationSource(nlp, location, None, ("a text",)).judged_by

    first, second = spacy.load(sample_path("roberta")), spacy.load(sample_path("roberta"))
    list(first.pipe(["Texts add strings to the vocab: not a change of the heads."]))
    assert judged_by(first) == judged_by(second)
    tagger = second.get_pipe("tagger").model
    node = next(node for node in tagger.walk() if node.has_param("W") and node.get_param("W").size)
    node.set_param("W", node.get_param("W") + 0.01)
    assert judged_by(first) != judged_by(second)
