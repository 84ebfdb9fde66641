"""OpenVINO run directly vs through ONNX Runtime's OpenVINO execution provider.

The two cannot share an environment: ``onnxruntime-openvino`` replaces the
``onnxruntime`` package and bundles its own OpenVINO. So the plain ONNX export
of an encoder (no ONNX Runtime fusions, which OpenVINO cannot read) is written
in this project's environment, and measured in a separate one that holds the
execution provider and the OpenVINO release it bundles::

    python benchmarks/openvino_ep.py --export trf-base /tmp/trf-base.onnx
    python3 -m venv /tmp/ortov
    /tmp/ortov/bin/pip install onnxruntime-openvino "openvino==2025.4.1" numpy
    /tmp/ortov/bin/python benchmarks/openvino_ep.py /tmp/trf-base.onnx --batch 8 --seq 128

(2025.4.1 is what onnxruntime-openvino 1.24.1 bundles: the same OpenVINO on
both sides.) Every variant runs the same random batch, interleaved,
``--repeats`` times; the report gives tokens per second, the ratio to the
direct OpenVINO fp32 run and the largest difference of the last hidden state
to ONNX Runtime's CPU provider.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def export(pipeline: str, target: Path) -> None:
    """The plain ONNX export of a benchmark pipeline's encoder (this project's environment)."""
    import spacy

    from spacy_accelerate.architectures import detect_architecture
    from spacy_accelerate.export import export_onnx
    from spacy_accelerate.samples.pipelines import ensure_sample
    from spacy_accelerate.shim import find_shim
    from spacy_accelerate.validate import find_transformer_components

    nlp = spacy.load(ensure_sample(pipeline))
    module = find_shim(find_transformer_components(nlp)[0]).pytorch_module
    detected = detect_architecture(module)
    hf_model = detected.architecture.to_hugging_face(detected.encoder, detected.spec)
    export_onnx(hf_model, detected.spec, target, opset=17)


def batch(args: argparse.Namespace, names: list[str]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, size=(args.batch, args.seq), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1::2, args.seq // 2 :] = 0  # half the rows padded to half length
    ids[mask == 0] = 1
    arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {name: arrays[name] for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--export", metavar="PIPELINE", help="write the plain ONNX file first")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="0: every CPU this process has")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.export:
        export(args.export, args.model)
        return

    import os

    import onnxruntime as ort
    import openvino as ov

    threads = args.threads or len(os.sched_getaffinity(0))
    core = ov.Core()
    model = core.read_model(str(args.model))
    names = [port.any_name for port in model.inputs]
    last = sorted(port.any_name for port in model.outputs if port.any_name.startswith("hidden"))[-1]
    feeds = batch(args, names)
    tokens = int(feeds["attention_mask"].sum())
    variants: dict[str, Callable[[], np.ndarray]] = {}

    for hint in ("f32", "bf16"):
        compiled = core.compile_model(
            model,
            "CPU",
            {
                "INFERENCE_PRECISION_HINT": hint,
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_NUM_THREADS": threads,
                "NUM_STREAMS": 1,
            },
        )
        request = compiled.create_infer_request()

        def run_direct(request: Any = request) -> np.ndarray:
            request.infer(feeds)
            return np.array(request.get_tensor(last).data)

        variants[f"openvino {hint} (direct)"] = run_direct

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    cpu = ort.InferenceSession(str(args.model), options, providers=["CPUExecutionProvider"])
    variants["onnxruntime cpu fp32"] = lambda: cpu.run([last], feeds)[0]
    for hint in ("f32", "bf16"):
        provider_options = {
            "device_type": "CPU",
            "num_of_threads": str(threads),
            "load_config": json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": hint}}),
        }
        session = ort.InferenceSession(
            str(args.model),
            options,
            providers=[("OpenVINOExecutionProvider", provider_options)],
        )
        assert session.get_providers()[0] == "OpenVINOExecutionProvider"
        variants[f"openvino {hint} (onnxruntime execution provider)"] = lambda session=session: (
            session.run([last], feeds)[0]
        )

    reference = variants["onnxruntime cpu fp32"]()
    diffs = {name: float(np.max(np.abs(run() - reference))) for name, run in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    base = tokens / statistics.median(times["openvino f32 (direct)"])
    report = {
        "model": str(args.model),
        "shape": [args.batch, args.seq],
        "threads": threads,
        "versions": {"onnxruntime": ort.__version__, "openvino": ov.__version__},
        "variants": {
            name: {
                "tokens_per_second": round(tokens / statistics.median(t), 1),
                "vs_openvino_f32_direct": round(tokens / statistics.median(t) / base, 3),
                "max_abs_diff_to_onnxruntime_cpu": diffs[name],
            }
            for name, t in times.items()
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
