"""Transformer forward pass only: PyTorch vs the exported ONNX model, fused and unfused.

    python benchmarks/encoder_forward.py --layers 12 --width 768 --heads 12 --batch 32 --seq 128

A curated RoBERTa encoder with random weights (speed depends on shape, not
values) is exported once without and once with ONNX Runtime's transformer
fusions; the three variants run interleaved in one process, and the median
tokens per second of each is reported with its ratio to PyTorch fp32. This is
how the CPU provider's fusion choice was made.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from curated_transformers.models.curated_transformer import CuratedTransformer
from curated_transformers.models.roberta import RobertaConfig, RobertaEncoder

from spacy_accelerate.architectures import detect_architecture
from spacy_accelerate.benchmark import write_report
from spacy_accelerate.config import build_config
from spacy_accelerate.export import MODEL_FILE, export_onnx, optimize_graph
from spacy_accelerate.parity import reference_outputs
from spacy_accelerate.providers import check_provider
from spacy_accelerate.runtime import EncoderSession


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = RobertaConfig(
        hidden_width=args.width,
        embedding_width=args.width,
        num_attention_heads=args.heads,
        num_hidden_layers=args.layers,
        intermediate_width=4 * args.width,
        vocab_size=50265,
    )
    module = CuratedTransformer(RobertaEncoder(config)).eval()
    detected = detect_architecture(module)
    spec = detected.spec
    options = build_config("cpu", "fp32")
    provider = check_provider(options)
    hf_model = detected.architecture.to_hugging_face(detected.encoder, spec)

    ids = torch.randint(3, spec.vocab_size, (args.batch, args.seq))
    ids[1::2, args.seq // 2 :] = spec.padding_idx  # half the rows padded to half length
    mask = (ids != spec.padding_idx).numpy().astype(np.int64)
    feeds = (ids.numpy(), mask, np.zeros_like(mask))
    last = spec.output_names[-1:]
    tokens = int(mask.sum())

    with tempfile.TemporaryDirectory() as folder:
        sessions = {}
        for fused in (False, True):
            path = Path(folder) / f"{'fused' if fused else 'plain'}-{MODEL_FILE}"
            export_onnx(hf_model, spec, path, opset=options.opset)
            if fused:
                optimize_graph(path, spec, provider)
            sessions["onnxruntime fused" if fused else "onnxruntime unfused"] = EncoderSession(
                path, provider, options
            )

        def pytorch() -> None:
            reference_outputs(module, ids)

        variants = {"pytorch fp32": pytorch}
        for name, session in sessions.items():
            variants[name] = lambda s=session: s.run(*feeds, last)

        reference = reference_outputs(module, ids)[-1]
        diffs = {}
        for name, session in sessions.items():
            out = session.run(*feeds, last)[0]
            valid = mask.astype(bool)
            diffs[name] = float(np.max(np.abs(out[valid] - reference[valid])))

        for run in variants.values():
            run()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, run in variants.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)

    base = tokens / statistics.median(times["pytorch fp32"])
    report = {
        "shape": {k: v for k, v in vars(args).items() if k != "output"},
        "tokens_per_batch": tokens,
        "torch_threads": torch.get_num_threads(),
        "variants": {
            name: {
                "tokens_per_second": round(tokens / statistics.median(t), 1),
                "vs_pytorch_fp32": round(tokens / statistics.median(t) / base, 3),
                "max_abs_diff_last_layer": diffs.get(name, 0.0),
            }
            for name, t in times.items()
        },
    }
    write_report(report, args.output)


if __name__ == "__main__":
    main()
