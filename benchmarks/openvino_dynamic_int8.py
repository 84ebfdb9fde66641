"""OpenVINO int8 on real spans: static int8 vs dynamic int8 (per-token activation scales).

    python benchmarks/openvino_dynamic_int8.py --pipeline trf-base --sentences 200

The pipeline runs once on PyTorch over UD-EWT test documents with a recorder
in its shim, so the batches are exactly what spaCy hands the transformer.
The encoder's IR is then run over those batches, variants alternating
(``--repeats`` passes each): fp32 and bf16 (the fp32 IR with each hint);
NNCF's static int8 of every MatMul, as accuracy control's first plan serves
it; and NNCF's int8 weight compression with OpenVINO's run-time quantization
of the activations in groups of 32 (OpenVINO's default), 128 (what the
dynamic plans serve), 256 and 768 channels, the rest of the model in fp32,
and in groups of 128, 256 and 768 with the rest in bf16 (the hint accuracy
control tries first where the CPU has bf16). The report gives real pieces
per second, the ratio to fp32, and the mean and smallest token cosine of the
last hidden state to fp32's over the real pieces. This is the measurement behind
:class:`spacy_accelerate.backends.openvino.quantize.DynamicInt8`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from spacy_accelerate_samples.ewt import recorded_test_batches  # noqa: E402
from spacy_accelerate_samples.trained import load_benchmark_pipeline  # noqa: E402

import spacy_accelerate  # noqa: E402
from spacy_accelerate.backends.openvino.quantize import import_nncf  # noqa: E402
from spacy_accelerate.backends.openvino.session import (  # noqa: E402
    IR_FILE,
    compile_settings,
    import_openvino,
)
from spacy_accelerate.bench.side_by_side import alternate, write_report  # noqa: E402
from spacy_accelerate.options.config import Precision  # noqa: E402
from spacy_accelerate.verify.parity import token_cosines  # noqa: E402

GROUP_SIZES = (32, 128, 256, 768)
#: Groups also run with the bf16 hint (the model's float part, LayerNorm and attention, in bf16).
BF16_GROUP_SIZES = (128, 256, 768)


def served_ir(pipeline: str, precision: str, cache: Path) -> Path:
    """The IR ``provider="openvino"`` serves; int8 with gates loose enough that the
    first plan (static int8 of every MatMul) is served."""
    nlp = load_benchmark_pipeline(pipeline)
    loose = {"min_agreement": 0.5, "min_cosine": 0.5} if precision == "int8" else {}
    spacy_accelerate.optimize(nlp, "openvino", precision, cache_dir=cache, warmup=False, **loose)
    return spacy_accelerate.accelerated_components(nlp)["transformer"].exported.path / IR_FILE


def real_piece_cosines(
    outputs: list[np.ndarray], reference: list[np.ndarray], masks: list[np.ndarray]
) -> np.ndarray:
    return np.concatenate(
        [
            token_cosines(out[mask.astype(bool)], ref[mask.astype(bool)])
            for out, ref, mask in zip(outputs, reference, masks, strict=True)
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="trf-base")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    cache = Path(tempfile.mkdtemp())
    fp32_ir = served_ir(args.pipeline, "fp32", cache)
    static_ir = served_ir(args.pipeline, "int8", cache)
    nlp = load_benchmark_pipeline(args.pipeline)
    spacy_accelerate.optimize(nlp, "openvino", "fp32", cache_dir=cache, warmup=False)
    spec = spacy_accelerate.accelerated_components(nlp)["transformer"].spec
    spacy_accelerate.restore(nlp)
    calls = recorded_test_batches(nlp, spec, args.sentences)
    names = list(spec.input_names)
    last = spec.hidden_state_names[-1]

    ov, nncf = import_openvino(), import_nncf()
    core = ov.Core()
    compressed = nncf.compress_weights(
        core.read_model(str(fp32_ir)), mode=nncf.CompressWeightsMode.INT8_ASYM
    )
    base = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    models: dict[str, tuple[Any, dict[str, Any]]] = {
        "fp32": (core.read_model(str(fp32_ir)), {"INFERENCE_PRECISION_HINT": "f32"}),
        "bf16": (core.read_model(str(fp32_ir)), {"INFERENCE_PRECISION_HINT": "bf16"}),
        "static int8": (core.read_model(str(static_ir)), {}),  # the hint its IR records
    }
    for group in GROUP_SIZES:
        models[f"dynamic int8, groups of {group}"] = (
            compressed,
            {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": group},
        )
    for group in BF16_GROUP_SIZES:
        models[f"dynamic int8, groups of {group}, bf16 float part"] = (
            compressed,
            {"INFERENCE_PRECISION_HINT": "bf16", "DYNAMIC_QUANTIZATION_GROUP_SIZE": group},
        )
    requests = {}
    for name, (model, settings) in models.items():
        settings = {**compile_settings(model, Precision.INT8), **settings}
        requests[name] = core.compile_model(
            model, "CPU", {**base, **settings}
        ).create_infer_request()
    feeds = [call.feeds(names) for call in calls]
    masks = [call.attention_mask for call in calls]
    pieces = sum(int(mask.sum()) for mask in masks)

    def runner(request: Any) -> Any:
        def run() -> list[np.ndarray]:
            outputs = []
            for feed in feeds:
                request.infer(feed)
                outputs.append(request.get_tensor(last).data.copy())
            return outputs

        return run

    variants = {name: runner(request) for name, request in requests.items()}
    outputs = {name: run() for name, run in variants.items()}  # warm-up, and the outputs
    times = alternate(variants, args.repeats)
    fp32_rate = pieces / statistics.median(times["fp32"])
    report: dict[str, Any] = {
        "pipeline": args.pipeline,
        "calls": len(calls),
        "pieces": pieces,
        "variants": {},
    }
    for name, t in times.items():
        cosines = real_piece_cosines(outputs[name], outputs["fp32"], masks)
        report["variants"][name] = {
            "pieces_per_second": round(pieces / statistics.median(t), 1),
            "vs_fp32": round(pieces / statistics.median(t) / fp32_rate, 3),
            "mean_token_cosine": round(float(cosines.mean()), 6),
            "min_token_cosine": round(float(cosines.min()), 6),
        }
    write_report(report, args.output)


if __name__ == "__main__":
    main()
