"""OpenVINO int8's accuracy control, the calibrated gate and ``auto``'s CPU rule, piece by piece."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import spacy

from spacy_accelerate.architectures import detect_architecture
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.backends import registry as providers
from spacy_accelerate.backends.onnxruntime import backend as ort_backend
from spacy_accelerate.backends.openvino import session as openvino_runtime
from spacy_accelerate.backends.openvino.float_layers import with_float_layers
from spacy_accelerate.backends.openvino.quantize import FloatLayers, nodes_by_layer, plan_ladder
from spacy_accelerate.cpu_features import cpu_features, simulated
from spacy_accelerate.errors import InvalidOptionError, ProviderUnavailableError
from spacy_accelerate.export.onnx import export_onnx
from spacy_accelerate.options.agreement import Annotation
from spacy_accelerate.options.config import Precision, Provider
from spacy_accelerate.options.gate import Gate, recorded_report_meets
from spacy_accelerate.options.providers import PROVIDERS
from spacy_accelerate.options.request import build_config
from spacy_accelerate.pipeline.components import find_transformer_components
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.planning.judging import CalibrationSource
from spacy_accelerate.verify.parity import read_pieces
from spacy_accelerate.verify.plan_search import bisect_ladder
from spacy_accelerate.verify.spot_check import spot_check_gate


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


def test_the_ladder_reverts_the_most_harmful_layers_up_to_all_but_one():
    harm = [0.001, 0.005, 0.002, 0.0005, 0.003, 0.0]
    assert list(plan_ladder(harm)) == [
        FloatLayers((2,), "bf16"),
        FloatLayers((2, 5), "bf16"),
        FloatLayers((2, 3, 5), "bf16"),
        FloatLayers((1, 2, 3, 5), "bf16"),
        FloatLayers((1, 2, 3, 4, 5), "bf16"),  # layer 6 harms least: the one left in int8
    ]
    # Float layers in fp32 (a CPU without bf16, or bf16's fallback): at most half of them.
    assert list(plan_ladder(harm, float_in_bf16=False)) == [
        FloatLayers((2,), "f32"),
        FloatLayers((2, 5), "f32"),
        FloatLayers((2, 3, 5), "f32"),
    ]
    assert list(plan_ladder([0.1, 0.2])) == [FloatLayers((2,), "bf16")]
    assert list(plan_ladder([0.1])) == []  # one layer: in float, nothing would be int8
    twelve = list(plan_ladder([float(k) for k in range(12)]))
    assert [len(plan.layers) for plan in twelve] == list(range(1, 12))
    assert twelve[-1].layers == tuple(range(2, 13))
    assert twelve[-1].label == "layers 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 float (bf16)"
    in_fp32 = list(plan_ladder([float(k) for k in range(12)], float_in_bf16=False))
    assert [len(plan.layers) for plan in in_fp32] == list(range(1, 7))
    assert in_fp32[0].label == "layers 12 float (fp32)"
    assert FloatLayers().label == "all layers int8"


@dataclass(frozen=True)
class Attempt:
    plan: FloatLayers
    passed: bool


@pytest.mark.parametrize("float_in_bf16", [True, False])
@pytest.mark.parametrize("layers", [6, 12, 24])
def test_the_fewest_float_layers_that_pass_are_found_by_bisection(layers: int, float_in_bf16: bool):
    ladder = list(plan_ladder([float(k) for k in range(layers)], float_in_bf16=float_in_bf16))
    for needed in range(0, layers + 1):  # plans with at least `needed` float layers pass
        tried: list[int] = []

        def attempt(plan: FloatLayers, needed: int = needed, tried: list[int] = tried) -> Attempt:
            tried.append(len(plan.layers))
            return Attempt(plan, len(plan.layers) >= needed)

        found = bisect_ladder(ladder, attempt)
        assert found is not None
        passing = [plan for plan in ladder if len(plan.layers) >= needed]
        if passing:
            assert found.passed and found.plan == passing[0]
        else:  # even the most float layers fail: refused after that one attempt
            assert not found.passed and tried == [len(ladder[-1].layers)]
        assert len(tried) <= 1 + math.ceil(math.log2(len(ladder)))
    assert bisect_ladder([], attempt) is None


def exported_sample(sample_path: Callable[[str], Path], sample: str, folder: Path):
    nlp = spacy.load(sample_path(sample))
    module = find_shim(find_transformer_components(nlp)[0]).read_pytorch_module()
    detected = detect_architecture(module)
    hf_model = detected.architecture.to_hugging_face(detected.encoder, detected.spec)
    path = folder / "model.onnx"
    export_onnx(hf_model, detected.spec, path, opset=17)
    return path, detected


@pytest.mark.parametrize("sample", ["bert", "roberta", "albert"])
def test_layers_are_split_from_the_graph(
    sample: str, sample_path: Callable[[str], Path], tmp_path: Path
):
    path, detected = exported_sample(sample_path, sample, tmp_path)
    graph = onnx.load(str(path))
    layers = {
        layer: [node.name for node in nodes if node.op_type == "MatMul"]
        for layer, nodes in nodes_by_layer(graph, detected.spec).items()
    }
    assert sorted(layers) == list(range(1, detected.spec.num_hidden_layers + 1))
    counts = {len(names) for names in layers.values()}
    assert len(counts) == 1 and counts.pop() >= 4  # q, k, v, out, ffn in/out (+ attention)
    every = [name for names in layers.values() for name in names]
    assert len(every) == len(set(every))
    if sample != "albert":  # ALBERT runs one shared layer, its nodes are not named by layer
        # Cross-check with the exporter's own naming (Hugging Face numbers layers from 0).
        for layer, names in layers.items():
            assert all(f"/layer.{layer - 1}/" in name for name in names)


@pytest.mark.parametrize("sample", ["roberta", "bert"])
def test_a_plan_is_the_all_int8_model_with_its_layers_back_in_float(
    sample: str, sample_path: Callable[[str], Path], tmp_path: Path
):
    import nncf
    import openvino as ov

    path, detected = exported_sample(sample_path, sample, tmp_path)
    float_model = ov.convert_model(str(path))
    names = [port.any_name for port in float_model.inputs]
    inputs = EncoderInputs.from_ids(
        np.random.default_rng(0).integers(5, detected.spec.vocab_size, (8, 24)),
        detected.spec.padding_idx,
    )
    dataset = nncf.Dataset([inputs.feeds(names)])
    quantized = nncf.quantize(float_model, dataset, model_type=nncf.ModelType.TRANSFORMER)
    present = {op.get_friendly_name() for op in float_model.get_ops()}
    layers = {
        layer: [node.name for node in found if node.name in present]
        for layer, found in nodes_by_layer(onnx.load(str(path)), detected.spec).items()
    }
    last = detected.spec.hidden_state_names[-1]

    def run(model: object) -> np.ndarray:
        compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        return compiled(inputs.feeds(names))[last]

    int8 = run(quantized)
    every = [name for found in layers.values() for name in found]
    for nodes, others in ((layers[1], layers[2]), (every, [])):
        # The same model as NNCF's own quantization with those layers in its ignored scope.
        reverted = with_float_layers(quantized, float_model, nodes)
        assert reverted is not None
        ignored = nncf.quantize(
            float_model,
            dataset,
            model_type=nncf.ModelType.TRANSFORMER,
            ignored_scope=nncf.IgnoredScope(names=nodes, validate=False),
        )
        assert np.abs(run(reverted) - run(ignored)).max() <= 1e-5
        assert np.abs(run(reverted) - int8).max() > 1e-3
        feeding = {
            op.get_friendly_name(): {v.get_node().get_type_name() for v in op.input_values()}
            for op in reverted.get_ops()
        }
        assert not any("FakeQuantize" in feeding.get(name, ()) for name in nodes)
        assert any("FakeQuantize" in feeding.get(name, ()) for name in others) == bool(others)
    # Every layer in float: no quantizer is left anywhere (what stays int8 is the
    # embedding tables' weights, outside the layers).
    assert not any(op.get_type_name() == "FakeQuantize" for op in reverted.get_ops())
    # A name the model does not have: nothing is guessed.
    assert with_float_layers(quantized, float_model, ["no such MatMul"]) is None


def test_min_agreement_is_validated():
    assert build_config("openvino", "int8").min_agreement.bound(Annotation.TAG) == 0.995
    uniform = build_config("openvino", "int8", min_agreement=0.98).min_agreement
    assert {uniform.bound(a) for a in Annotation} == {0.98}
    for bad in (0, 1.5, "0.9", True, {}, [0.9]):
        with pytest.raises(InvalidOptionError, match="min_agreement must be"):
            build_config("openvino", "int8", min_agreement=bad)
    with pytest.raises(InvalidOptionError, match=r"min_agreement\['dep'\] must be"):
        build_config("cpu", "int8", min_agreement={"dep": 2})
    with pytest.raises(InvalidOptionError, match="no annotation 'tags'; name one of 'tag'"):
        build_config("cpu", "int8", min_agreement={"tags": 0.9})


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
    monkeypatch.setattr(providers, "torch_cuda_problem", lambda: "no GPU in this test")
    # The vendor's rule is what is tested: simulate a CPU with bf16 units (this one may
    # have none, and then bf16 is refused, as tested in test_openvino.py).
    monkeypatch.setattr(
        openvino_runtime, "cpu_capabilities", lambda cpu=None: frozenset({"FP32", "BF16", "INT8"})
    )
    with simulated(replace(cpu_features(), vendor=vendor)):
        on_cpu = [p for p in providers.auto_order(precision) if not PROVIDERS.on_gpu(p)]
        assert on_cpu[0] is first
        served = providers.check_provider(build_config("auto", precision)).provider
    # bf16 is served by OpenVINO alone on a CPU, whatever the vendor.
    assert served is (Provider.OPENVINO if precision is Precision.BF16 else first)


def test_auto_without_openvino_stays_on_onnx_runtime(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(providers, "torch_cuda_problem", lambda: "no GPU in this test")
    listed = providers.listed_providers
    monkeypatch.setattr(providers, "listed_providers", lambda: listed() - {Provider.OPENVINO})
    with simulated(replace(cpu_features(), vendor="GenuineIntel")):
        assert providers.check_provider(build_config("auto", "int8")).provider is Provider.CPU


def test_the_cpu_vendor_is_read_here():
    vendor = cpu_features().vendor
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

    monkeypatch.setattr(ort_backend, "import_onnxruntime", missing)
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
