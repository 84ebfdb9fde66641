"""Which int8 mechanism keeps a pipeline's annotations, and at what speed: the measured curve.

    python benchmarks/int8_mechanisms.py --output benchmarks/results/int8_mechanisms-minilm-ewt.json
    python benchmarks/int8_mechanisms.py --no-bf16 --output ...-no-bf16.json

Each mechanism quantizes the same exported encoder of the pipeline (``minilm-ewt`` by
default) with the libraries' own tools, outside the plan search, and is measured the way
the search judges a plan: the agreement of every annotation with PyTorch fp32 on the
built-in calibration sample (the gate's texts) and on held-out UD-EWT test documents,
whether the default ``min_agreement`` passes it, and the full pipeline's seconds over the
calibration texts, all mechanisms and the float baselines alternating (median of three).
PyTorch's own bf16 autocast is measured alongside (on any CPU): the change a PyTorch user
accepts.

Mechanisms (ONNX Runtime, then OpenVINO):

- ``ort-dynamic``: ``quantize_dynamic``, per-channel int8 weights, one scale per activation
  tensor; ``ort-dynamic-ffn-out-float``: its feed-forward output MatMuls in float;
- ``ort-static`` (QDQ, MinMax), ``ort-static-ffn-out-float``;
- ``ort-blockwise-<B>``: ``MatMulNBits`` 8-bit weights in blocks of B input channels,
  ``accuracy_level`` 4 (activations quantized per token and block, int8 arithmetic);
  ``ort-blockwise4-32``: 4-bit weights;
- ``ov-static-<hint>``: NNCF ``quantize`` with its transformer preset (SmoothQuant), bias
  correction off as in the library;
  ``ov-static-f32-no-smoothquant``; ``ov-static-<hint>-ffn-out-float``: the feed-forward
  output MatMuls in NNCF's ignored scope;
- ``ov-dynamic-<group>``: NNCF int8 weight compression, activations quantized per token in
  groups at run time (f32 hint).

``--no-bf16`` runs as on a CPU without bf16 units (the library's CPU detection simulated):
OpenVINO's float parts compile in f32, its bf16 baseline is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import onnx  # noqa: E402
import torch  # noqa: E402
from spacy_accelerate_samples import ewt  # noqa: E402
from spacy_accelerate_samples.trained import TRAINED_SAMPLE_NAME, load_benchmark_pipeline  # noqa: E402

from spacy_accelerate.architectures import detect_architecture  # noqa: E402
from spacy_accelerate.backends.onnxruntime.quantize import prepare  # noqa: E402
from spacy_accelerate.backends.onnxruntime.session import EncoderSession  # noqa: E402
from spacy_accelerate.backends.openvino.quantize import (  # noqa: E402
    feed_forward_outputs,
    nodes_by_layer,
)
from spacy_accelerate.backends.openvino.session import (  # noqa: E402
    DYNAMIC_QUANTIZATION_RT_INFO,
    FLOAT_LAYERS_RT_INFO,
    OpenVINOSession,
)
from spacy_accelerate.backends.registry import check_provider, session_layout  # noqa: E402
from spacy_accelerate.bench.side_by_side import write_report  # noqa: E402
from spacy_accelerate.cache.store import ModelCache  # noqa: E402
from spacy_accelerate.cpu_features import cpu_features, simulated  # noqa: E402
from spacy_accelerate.errors import spelled  # noqa: E402
from spacy_accelerate.export.fingerprint import package_versions  # noqa: E402
from spacy_accelerate.export.onnx import export_onnx  # noqa: E402
from spacy_accelerate.options.agreement import DEFAULT_AGREEMENT  # noqa: E402
from spacy_accelerate.options.request import build_config  # noqa: E402
from spacy_accelerate.pipeline.components import find_transformer_components  # noqa: E402
from spacy_accelerate.pipeline.patch import scoped  # noqa: E402
from spacy_accelerate.pipeline.shim import find_shim  # noqa: E402
from spacy_accelerate.planning.annotating import annotate  # noqa: E402
from spacy_accelerate.planning.autocast import AutocastModule  # noqa: E402
from spacy_accelerate.planning.recording import record_calibration  # noqa: E402
from spacy_accelerate.runtime.buckets import BucketPlan  # noqa: E402
from spacy_accelerate.serving.proxy import candidate_proxy  # noqa: E402
from spacy_accelerate.verify.agreement import compare  # noqa: E402


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Bench:
    """The pipeline, its exported encoder and the calibration, and how a model is measured."""

    def __init__(self, pipeline: str, heldout_sentences: int) -> None:
        self.nlp = load_benchmark_pipeline(pipeline)
        self.location = find_shim(find_transformer_components(self.nlp)[0])
        self.module = self.location.read_pytorch_module()
        self.detected = detect_architecture(self.module)
        self.spec = self.detected.spec
        self.work = Path(tempfile.mkdtemp(prefix="int8-mechanisms-"))
        self.onnx_path = self.work / "model.onnx"
        hf = self.detected.architecture.to_hugging_face(self.detected.encoder, self.spec)
        export_onnx(hf, self.spec, self.onnx_path, opset=17)
        self.prepared = self.work / "prepared.onnx"
        prepare(self.onnx_path, self.prepared)
        self.calibration = record_calibration(self.nlp, self.location, self.spec, None)
        self.heldout = ewt.document_texts("test", sentences=heldout_sentences)
        with torch.no_grad():
            self.heldout_reference = annotate(self.nlp, self.heldout)
        graph = onnx.load(str(self.onnx_path), load_external_data=False)
        self.ffn_out = list(feed_forward_outputs(graph, nodes_by_layer(graph, self.spec)))
        self.cache = ModelCache(self.work / "cache")

    def session(self, provider: str, precision: str, path: Path) -> Any:
        config = build_config(provider, precision)
        resolved = check_provider(config)
        buckets = BucketPlan.for_pipeline(config.gpu, self.spec, 128, 64)
        layout = session_layout(config, self.spec, buckets, self.cache, "0" * 64)
        kind = OpenVINOSession if provider == "openvino" else EncoderSession
        return kind(path, resolved, config, layout)

    def standin(self, model: Any) -> torch.nn.Module:
        if isinstance(model, torch.nn.Module):
            return model
        return candidate_proxy(self.module, model, self.spec)

    def agreement(self, model: Any, texts: list[str], reference: list) -> dict[str, Any]:
        with scoped(self.location, self.standin(model)), torch.no_grad():
            report = compare(reference, annotate(self.nlp, texts))
        rates = {
            a.value: {"rate": round(r.rate, 5), "lower_95": round(r.lower, 5)}
            for a, r in report.rates
        }
        refusal = report.refusal(DEFAULT_AGREEMENT)
        return {"rates": rates, "refusal": None if refusal is None else spelled(refusal)}

    def seconds(self, model: Any | None) -> float:
        standin = self.standin(model) if model is not None else self.module
        with scoped(self.location, standin), torch.no_grad():
            start = time.perf_counter()
            annotate(self.nlp, list(self.calibration.texts))
            return time.perf_counter() - start


# ---------------------------------------------------------------- the mechanisms


def ort_dynamic(bench: Bench, target: Path, exclude: list[str]) -> Any:
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(bench.prepared),
        str(target),
        op_types_to_quantize=["MatMul"],
        per_channel=True,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=exclude,
        extra_options={"MatMulConstBOnly": True, "DefaultTensorType": TensorProto.FLOAT},
    )
    return bench.session("cpu", "int8", target)


def ort_static(bench: Bench, target: Path, exclude: list[str]) -> Any:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    names = [i.name for i in onnx.load(str(bench.prepared), load_external_data=False).graph.input]
    rows = iter([item.feeds(names) for item in bench.calibration.items])

    class Reader:
        def get_next(self) -> Any:
            return next(rows, None)

    quantize_static(
        str(bench.prepared),
        str(target),
        Reader(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul"],
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=exclude,
        extra_options={"MatMulConstBOnly": True},
    )
    return bench.session("cpu", "int8", target)


def ort_blockwise(bench: Bench, target: Path, bits: int, block: int) -> Any:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(bench.prepared)),
        bits=bits,
        block_size=block,
        is_symmetric=True,
        accuracy_level=4,
    )
    quantizer.process()
    quantizer.model.save_model_to_file(str(target), False)
    return bench.session("cpu", "int8", target)


def _ov_saved(bench: Bench, model: Any, target: Path, hint: str, group: int | None = None) -> Any:
    import openvino as ov

    model.set_rt_info(hint, FLOAT_LAYERS_RT_INFO)
    if group is not None:
        model.set_rt_info(group, DYNAMIC_QUANTIZATION_RT_INFO)
    ov.save_model(model, str(target.with_suffix(".xml")), compress_to_fp16=False)
    return bench.session("openvino", "int8", target.with_suffix(".xml"))


def ov_float(bench: Bench, target: Path, hint: str) -> Any:
    import openvino as ov

    model = ov.convert_model(str(bench.onnx_path))
    ov.save_model(model, str(target.with_suffix(".xml")), compress_to_fp16=False)
    return bench.session(
        "openvino", "bf16" if hint == "bf16" else "fp32", target.with_suffix(".xml")
    )


def ov_static(bench: Bench, target: Path, hint: str, ignored: list[str], smooth: bool) -> Any:
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    model = ov.convert_model(str(bench.onnx_path))
    names = [port.any_name for port in model.inputs]
    present = {op.get_friendly_name() for op in model.get_ops()}
    # Bias correction off, as the library runs it (the same outputs, in less time).
    advanced = AdvancedQuantizationParameters(disable_bias_correction=True)
    if not smooth:
        advanced.smooth_quant_alphas = AdvancedSmoothQuantParameters(matmul=-1)
    quantized = nncf.quantize(
        model,
        nncf.Dataset([item.feeds(names) for item in bench.calibration.items]),
        model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(bench.calibration.items),
        ignored_scope=nncf.IgnoredScope(names=[n for n in ignored if n in present], validate=False),
        advanced_parameters=advanced,
    )
    return _ov_saved(bench, quantized, target, hint)


def ov_dynamic(bench: Bench, target: Path, group: int) -> Any:
    import nncf
    import openvino as ov

    model = nncf.compress_weights(
        ov.convert_model(str(bench.onnx_path)), mode=nncf.CompressWeightsMode.INT8_ASYM
    )
    return _ov_saved(bench, model, target, "f32", group)


def mechanisms(bench: Bench, bf16: bool) -> dict[str, Callable[[Path], Any]]:
    ffn = bench.ffn_out
    hints = ["bf16", "f32"] if bf16 else ["f32"]
    found: dict[str, Callable[[Path], Any]] = {
        "ort-dynamic": lambda t: ort_dynamic(bench, t, []),
        "ort-dynamic-ffn-out-float": lambda t: ort_dynamic(bench, t, ffn),
        "ort-static": lambda t: ort_static(bench, t, []),
        "ort-static-ffn-out-float": lambda t: ort_static(bench, t, ffn),
        "ort-blockwise-128": lambda t: ort_blockwise(bench, t, 8, 128),
        "ort-blockwise-32": lambda t: ort_blockwise(bench, t, 8, 32),
        "ort-blockwise4-32": lambda t: ort_blockwise(bench, t, 4, 32),
        "ov-static-f32-no-smoothquant": lambda t: ov_static(bench, t, "f32", [], False),
        "ov-dynamic-128": lambda t: ov_dynamic(bench, t, 128),
        "ov-dynamic-64": lambda t: ov_dynamic(bench, t, 64),
    }
    for hint in hints:
        found[f"ov-static-{hint}"] = lambda t, h=hint: ov_static(bench, t, h, [], True)
        found[f"ov-static-{hint}-ffn-out-float"] = lambda t, h=hint: ov_static(
            bench, t, h, ffn, True
        )
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args.pipeline, args.heldout_sentences)
    texts, reference = list(bench.calibration.texts), list(bench.calibration.docs)
    models: dict[str, Any] = {
        "onnxruntime fp32": bench.session("cpu", "fp32", bench.onnx_path),
        "openvino fp32": ov_float(bench, bench.work / "ov-f32", "f32"),
    }
    bf16 = cpu_features().bf16
    if bf16:
        models["openvino bf16"] = ov_float(bench, bench.work / "ov-bf16", "bf16")
    # What the defaults are measured against: it runs on any CPU (without bf16 units, slowly).
    models["pytorch bf16 autocast"] = AutocastModule(bench.module, "cpu", torch.bfloat16)
    rows: dict[str, Any] = {}
    chosen = mechanisms(bench, bf16)
    for name, make in chosen.items():
        if args.only and not any(word in name for word in args.only):
            continue
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            models[name] = make(bench.work / name)
        rows[name] = {"build_seconds": round(time.perf_counter() - started, 1)}
    for name, model in models.items():
        if name.endswith("fp32"):
            continue
        row = rows.setdefault(name, {})
        row["calibration"] = bench.agreement(model, texts, reference)
        row["heldout"] = bench.agreement(model, bench.heldout, bench.heldout_reference)
        _log(f"{name}: {json.dumps(row)}")
    for model in models.values():  # warm-up
        bench.seconds(model)
    timings: dict[str, list[float]] = {name: [] for name in ["pytorch fp32", *models]}
    for _ in range(args.repeats):
        timings["pytorch fp32"].append(bench.seconds(None))
        for name, model in models.items():
            timings[name].append(bench.seconds(model))
    median = {name: statistics.median(times) for name, times in timings.items()}
    fastest_fp32 = min(median["onnxruntime fp32"], median["openvino fp32"])
    for name, seconds in median.items():
        rows.setdefault(name, {})["speed"] = {
            "seconds": round(seconds, 3),
            "vs_pytorch_fp32": round(median["pytorch fp32"] / seconds, 3),
            "vs_fastest_fp32": round(fastest_fp32 / seconds, 3),
        }
    shutil.rmtree(bench.work, ignore_errors=True)
    return {
        "pipeline": args.pipeline,
        "cpu": cpu_features().describe(),
        "no_bf16": args.no_bf16,
        "calibration_tokens": sum(len(doc) for doc in reference),
        "heldout_tokens": sum(len(doc) for doc in bench.heldout_reference),
        "mechanisms": rows,
        "versions": package_versions(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default=TRAINED_SAMPLE_NAME)
    parser.add_argument("--heldout-sentences", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", help="the mechanisms whose name holds one of these")
    parser.add_argument("--no-bf16", action="store_true", help="as on a CPU without bf16 units")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    features = cpu_features().without_bf16() if args.no_bf16 else cpu_features()
    with simulated(features):
        report = run(args)
    write_report(report, args.output)


if __name__ == "__main__":
    main()
