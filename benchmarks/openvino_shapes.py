"""OpenVINO on real spans: one dynamic-shape model vs models reshaped to static buckets.

    python benchmarks/openvino_shapes.py --pipeline minilm-ewt --sentences 400

The pipeline runs once on PyTorch over UD-EWT test documents with a recorder
in its shim, so the batches are exactly what spaCy hands the transformer
(rows of strided spans, padded to the longest). The encoder's IR is then run
over those batches by (a) one model compiled with dynamic batch and sequence
axes, as ``provider="openvino"`` serves it, and (b) one model per bucket
(rows rounded up to a multiple of 8, pieces to a multiple of 16), each
reshaped to its static shape and compiled, the inputs padded into it, as
the GPU providers run (they round rows to powers of two). Both alternate,
``--repeats`` passes each; the report gives pieces per second, the ratio, and
what the buckets cost to compile. This is the measurement behind serving dynamic shapes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from spacy_accelerate_samples.ewt import recorded_test_batches  # noqa: E402
from spacy_accelerate_samples.trained import TRAINED_SAMPLE_NAME, load_benchmark_pipeline  # noqa: E402

import spacy_accelerate  # noqa: E402
from spacy_accelerate.architectures.inputs import EncoderInputs  # noqa: E402
from spacy_accelerate.backends.openvino.session import IR_FILE, import_openvino  # noqa: E402
from spacy_accelerate.bench.side_by_side import alternate, write_report  # noqa: E402

#: Bucket granularity: finer than the GPU providers' powers of two, to give static
#: shapes their best case on a CPU (less padding, more models to compile).
BATCH_MULTIPLE = 8
SEQUENCE_MULTIPLE = 16


def bucket_of(shape: tuple[int, int]) -> tuple[int, int]:
    rows, pieces = shape
    return -(-rows // BATCH_MULTIPLE) * BATCH_MULTIPLE, -(
        -pieces // SEQUENCE_MULTIPLE
    ) * SEQUENCE_MULTIPLE


def padded(inputs: EncoderInputs, shape: tuple[int, int], padding_idx: int) -> dict[str, Any]:
    rows, pieces = inputs.shape
    ids = np.full(shape, padding_idx, dtype=np.int64)
    mask = np.zeros(shape, dtype=np.int64)
    types = np.zeros(shape, dtype=np.int64)
    ids[:rows, :pieces] = inputs.input_ids
    mask[:rows, :pieces] = inputs.attention_mask
    types[:rows, :pieces] = inputs.token_type_ids
    mask[rows:, 0] = 1  # padding rows see one piece: no softmax over nothing
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default=TRAINED_SAMPLE_NAME)
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    nlp = load_benchmark_pipeline(args.pipeline)
    cache = Path(tempfile.mkdtemp())
    spacy_accelerate.optimize(nlp, "openvino", args.precision, cache_dir=cache, warmup=False)
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    spec = proxy.spec
    spacy_accelerate.restore(nlp)
    calls = recorded_test_batches(nlp, spec, args.sentences)
    names = list(spec.input_names)
    last = spec.hidden_state_names[-1]

    ov = import_openvino()
    core = ov.Core()
    properties = {
        "INFERENCE_PRECISION_HINT": "bf16" if args.precision == "bf16" else "f32",
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
    }
    ir = proxy.exported.path / IR_FILE
    dynamic = core.compile_model(str(ir), "CPU", properties).create_infer_request()
    shapes = sorted({bucket_of(call.shape) for call in calls})
    start = time.perf_counter()
    static = {}
    for shape in shapes:
        model = core.read_model(str(ir))
        model.reshape({name: list(shape) for name in names})
        static[shape] = core.compile_model(model, "CPU", properties).create_infer_request()
    compile_seconds = time.perf_counter() - start
    feeds = [call.feeds(names) for call in calls]
    bucketed = [padded(call, bucket_of(call.shape), spec.padding_idx) for call in calls]
    pieces = sum(int(call.attention_mask.sum()) for call in calls)

    def run_dynamic() -> None:
        for feed in feeds:
            dynamic.infer(feed)
            dynamic.get_tensor(last)

    def run_buckets() -> None:
        for feed in bucketed:
            request = static[feed["input_ids"].shape]
            request.infer({name: feed[name] for name in names})
            request.get_tensor(last)

    variants = {"dynamic shapes": run_dynamic, "static buckets": run_buckets}
    for run in variants.values():  # warm-up
        run()
    times = alternate(variants, args.repeats)
    base = pieces / statistics.median(times["dynamic shapes"])
    report = {
        "pipeline": args.pipeline,
        "precision": args.precision,
        "calls": len(calls),
        "pieces": pieces,
        "distinct_call_shapes": len({call.shape for call in calls}),
        "buckets": [list(shape) for shape in shapes],
        "bucket_compile_seconds": round(compile_seconds, 2),
        "padding_overhead": round(
            sum(int(np.prod(f["input_ids"].shape)) for f in bucketed)
            / sum(int(np.prod(f["input_ids"].shape)) for f in feeds),
            3,
        ),
        "variants": {
            name: {
                "pieces_per_second": round(pieces / statistics.median(t), 1),
                "vs_dynamic": round(pieces / statistics.median(t) / base, 3),
            }
            for name, t in times.items()
        },
    }
    write_report(report, args.output)


if __name__ == "__main__":
    main()
