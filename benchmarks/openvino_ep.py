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
both sides.) The two OpenVINO libraries clash in one process, so each side
runs in its own, alternating ``--rounds`` times; each times every variant on
the same random batch ``--repeats`` times after a warm-up. The report gives
the median tokens per second, the ratio to OpenVINO fp32 run directly, and
the mean absolute last hidden state of each (equal values: the same result).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Each side runs in a process of its own (fork + exec): no tokenizers warning per child.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402


def export(pipeline: str, target: Path) -> None:
    """The plain ONNX export of a benchmark pipeline's encoder (this project's environment)."""
    import spacy
    from spacy_accelerate_samples.pipelines import ensure_sample

    from spacy_accelerate.architectures import detect_architecture
    from spacy_accelerate.export.onnx import export_onnx
    from spacy_accelerate.pipeline.components import find_transformer_components
    from spacy_accelerate.pipeline.shim import find_shim

    nlp = spacy.load(ensure_sample(pipeline))
    module = find_shim(find_transformer_components(nlp)[0]).read_pytorch_module()
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


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One side, in this process: tokens per second of each of its variants."""
    import os

    threads = args.threads or len(os.sched_getaffinity(0))
    variants: dict[str, Callable[[], np.ndarray]] = {}
    if args.side == "direct":
        import openvino as ov

        core = ov.Core()
        model = core.read_model(str(args.model))
        names = [port.any_name for port in model.inputs]
        last = max((p.any_name for p in model.outputs), key=lambda n: int(n.rsplit("_", 1)[1]))
        feeds = batch(args, names)
        for hint in ("f32", "bf16"):
            properties = {
                "INFERENCE_PRECISION_HINT": hint,
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_NUM_THREADS": threads,
                "NUM_STREAMS": 1,
            }
            request = core.compile_model(model, "CPU", properties).create_infer_request()

            def run_direct(request: Any = request) -> np.ndarray:
                request.infer(feeds)
                return np.array(request.get_tensor(last).data)

            variants[f"openvino {hint} (direct)"] = run_direct
        version = ov.__version__
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        sessions = {
            "onnxruntime cpu fp32": ("CPUExecutionProvider", {}),
            **{
                f"openvino {hint} (onnxruntime execution provider)": (
                    "OpenVINOExecutionProvider",
                    {
                        "device_type": "CPU",
                        "num_of_threads": str(threads),
                        "load_config": json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": hint}}),
                    },
                )
                for hint in ("f32", "bf16")
            },
        }
        for name, (provider, provider_options) in sessions.items():
            session = ort.InferenceSession(
                str(args.model), options, providers=[(provider, provider_options)]
            )
            if session.get_providers()[0] != provider:
                raise RuntimeError(f"{provider} did not start: {session.get_providers()}")
            names = [port.name for port in session.get_inputs()]
            last = max(
                (o.name for o in session.get_outputs()), key=lambda n: int(n.rsplit("_", 1)[1])
            )
            feeds = batch(args, names)
            variants[name] = lambda s=session, f=feeds, o=last: s.run([o], f)[0]
        version = ort.__version__
    tokens = int(batch(args, ["attention_mask"])["attention_mask"].sum())
    results: dict[str, Any] = {"version": version, "variants": {}}
    for name, run in variants.items():
        run()  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            output = run()
            times.append(time.perf_counter() - start)
        results["variants"][name] = {
            "tokens_per_second": tokens / statistics.median(times),
            "checksum": float(np.abs(output).mean()),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--export", metavar="PIPELINE", help="write the plain ONNX file first")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="0: every CPU this process has")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per variant and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating process pairs")
    parser.add_argument("--side", choices=("direct", "ep"), help="internal: measure one side")
    args = parser.parse_args()
    if args.export:
        export(args.export, args.model)
        return
    if args.side:
        print(json.dumps(measure(args)))
        return
    # The two sides cannot share a process (their OpenVINO libraries clash), so they
    # alternate, one process each, --rounds times.
    rounds: dict[str, list[float]] = {}
    versions, checksums = {}, {}
    for _ in range(args.rounds):
        for side in ("direct", "ep"):
            command = [sys.executable, __file__, str(args.model), "--side", side]
            command += ["--batch", str(args.batch), "--seq", str(args.seq)]
            command += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            versions[side] = result["version"]
            for name, row in result["variants"].items():
                rounds.setdefault(name, []).append(row["tokens_per_second"])
                checksums[name] = row["checksum"]
    base = statistics.median(rounds["openvino f32 (direct)"])
    report = {
        "model": str(args.model),
        "shape": [args.batch, args.seq],
        "versions": {"openvino (direct)": versions["direct"], "onnxruntime": versions["ep"]},
        "variants": {
            name: {
                "tokens_per_second": round(statistics.median(values), 1),
                "vs_openvino_f32_direct": round(statistics.median(values) / base, 3),
                "mean_abs_last_hidden_state": round(checksums[name], 5),
            }
            for name, values in rounds.items()
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
