"""Transformer forward pass only: PyTorch vs every way this project can export the encoder.

    python benchmarks/encoder_forward.py --layers 12 --width 768 --heads 12 --batch 32 --seq 128

A curated RoBERTa encoder with random weights (speed depends on shape, not
values), or the real MiniLM weights with ``--minilm``, is exported once, then
fused and/or quantized into each variant: ONNX Runtime fp32 with and without
the transformer fusions, and int8 (dynamic quantization) per tensor or per
channel, quantized before or after the fusions. All variants, plus PyTorch
fp32 and PyTorch bf16 autocast, run interleaved in one process; the median
tokens per second of each is reported with its ratio to PyTorch fp32 and the
smallest token cosine similarity of its last layer to PyTorch fp32. This is
how the CPU provider's fusion choice and the default int8 recipe were made.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from curated_transformers.models.curated_transformer import CuratedTransformer
from curated_transformers.models.roberta import RobertaConfig, RobertaEncoder

from spacy_accelerate.architectures import DetectedEncoder, detect_architecture
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.backends.onnxruntime.graph import GraphPlan, optimize_graph
from spacy_accelerate.backends.onnxruntime.int8_recipe import Int8Recipe
from spacy_accelerate.backends.onnxruntime.quantize import prepare, quantize_int8
from spacy_accelerate.backends.onnxruntime.session import EncoderSession
from spacy_accelerate.backends.registry import check_provider
from spacy_accelerate.bench.side_by_side import alternate, write_report
from spacy_accelerate.export.onnx import MODEL_FILE, export_onnx
from spacy_accelerate.options.gate import Gate
from spacy_accelerate.options.request import build_config
from spacy_accelerate.runtime.buckets import BucketPlan
from spacy_accelerate.runtime.session import SessionLayout
from spacy_accelerate.verify.parity import compare, reference_outputs


def _random_roberta(args: argparse.Namespace) -> torch.nn.Module:
    config = RobertaConfig(
        hidden_width=args.width,
        embedding_width=args.width,
        num_attention_heads=args.heads,
        num_hidden_layers=args.layers,
        intermediate_width=4 * args.width,
        vocab_size=50265,
    )
    return CuratedTransformer(RobertaEncoder(config)).eval()


def _minilm() -> torch.nn.Module:
    from spacy_accelerate_samples.pipelines import curated_torch_module, load_sample

    return curated_torch_module(load_sample("minilm")).eval()


def _inputs(detected: DetectedEncoder, batch: int, seq: int) -> EncoderInputs:
    spec = detected.spec
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(spec.padding_idx + 1, spec.vocab_size, (batch, seq), generator=generator)
    ids[1::2, seq // 2 :] = spec.padding_idx  # half the rows padded to half length
    return EncoderInputs.from_ids(ids.numpy(), spec.padding_idx)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--minilm", action="store_true", help="real MiniLM weights, not random")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    torch.manual_seed(0)
    module = _minilm() if args.minilm else _random_roberta(args)
    detected = detect_architecture(module)
    spec = detected.spec
    options = build_config("cpu", "fp32")
    provider = check_provider(options)
    buckets = BucketPlan.for_pipeline(options.gpu, spec, spec.longest_input, 1)
    layout = SessionLayout(spec.input_names, spec.padding_idx, buckets)
    inputs = _inputs(detected, args.batch, args.seq)
    tokens = int(inputs.attention_mask.sum())
    last = spec.hidden_state_names[-1:]

    recipes = {
        f"onnxruntime int8 {'fused' if r.fuse_first else 'unfused'}"
        f" {'per-channel' if r.per_channel else 'per-tensor'}": r
        for r in (Int8Recipe(pc, ff) for ff in (False, True) for pc in (False, True))
    }
    folder = Path(tempfile.mkdtemp())
    try:
        plain = folder / MODEL_FILE
        export_onnx(
            detected.architecture.to_hugging_face(detected.encoder, spec), spec, plain, opset=17
        )
        sessions: dict[str, EncoderSession] = {}
        for name, fused, recipe in [
            ("onnxruntime fp32 unfused", False, None),
            ("onnxruntime fp32 fused", True, None),
            *((name, recipe.fuse_first, recipe) for name, recipe in recipes.items()),
        ]:
            path = folder / f"{len(sessions)}.onnx"
            shutil.copy(plain, path)
            if fused:
                optimize_graph(path, spec, GraphPlan(fuse=True))
            if recipe is not None:
                prepared = path.with_name(f"prepared-{path.name}")
                quantized = path.with_name(f"int8-{path.name}")
                prepare(path, prepared)
                quantize_int8(prepared, quantized, recipe, [])
                path = quantized
            sessions[name] = EncoderSession(path, provider, options, layout)

        def pytorch() -> list[np.ndarray]:
            return reference_outputs(module, detected, inputs)

        def pytorch_bf16() -> list[np.ndarray]:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return reference_outputs(module, detected, inputs)

        variants: dict[str, Callable[[], list[np.ndarray]]] = {
            "pytorch fp32": pytorch,
            "pytorch bf16 autocast": pytorch_bf16,
        }
        for name, session in sessions.items():
            variants[name] = lambda s=session: s.run(inputs, last)

        reference = pytorch()[-1:]
        cosines = {}
        for name, run in variants.items():
            produced = run()[-1:]
            report = compare(produced, reference, spec, inputs, Gate())
            cosines[name] = (report.worst_cosine, report.worst)

        times = alternate(variants, args.repeats)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    base = tokens / statistics.median(times["pytorch fp32"])
    report = {
        "model": "minilm" if args.minilm else "random roberta",
        "shape": {k: v for k, v in vars(args).items() if k not in ("output", "minilm")},
        "tokens_per_batch": tokens,
        "torch_threads": torch.get_num_threads(),
        "variants": {
            name: {
                "tokens_per_second": round(tokens / statistics.median(t), 1),
                "vs_pytorch_fp32": round(tokens / statistics.median(t) / base, 3),
                "min_token_cosine_last_layer": round(cosines[name][0], 6),
                "max_abs_diff_last_layer": cosines[name][1],
            }
            for name, t in times.items()
        },
    }
    write_report(report, args.output)


if __name__ == "__main__":
    main()
