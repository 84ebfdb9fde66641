"""Memory of an overlapped ``nlp.pipe`` against the same pipeline one stage after the other:
RSS growth while 20,000 documents stream through, each variant in a fresh process.

    python benchmarks/overlap_memory.py --pipeline minilm-ewt --documents 20000 \\
        --output benchmarks/results/overlap_memory-<machine>.json

Each run: load the pipeline, ``optimize()`` it (``--provider``, ``--precision``) with
``overlap`` forced on or off, annotate 64 documents to warm it, read RSS, then stream
``--documents`` EWT test sentences (repeated) through ``nlp.pipe`` at the pipeline's
default batch size, dropping each document, reading RSS every 500 documents. Reported:
the growth over the warm RSS at the end and at its highest, and the ratio of overlap's to
the sequential run's. Variants alternate, ``--rounds`` times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VARIANTS = {"no overlap": False, "overlap": True}


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One variant, in this process."""
    from spacy_accelerate_samples import ewt
    from spacy_accelerate_samples.trained import load_benchmark_pipeline

    import spacy_accelerate

    overlap = VARIANTS[args.child]
    nlp = load_benchmark_pipeline(args.pipeline)
    spacy_accelerate.optimize(nlp, args.provider, args.precision, overlap=overlap)
    sentences = [d.text for d in ewt.load_documents("test", max_sentences=1)]
    texts = (sentences * (args.documents // len(sentences) + 1))[: args.documents]
    for _doc in nlp.pipe(texts[:64]):
        pass
    warm = _rss_mib()
    highest = warm
    started = time.perf_counter()
    for index, _doc in enumerate(nlp.pipe(texts)):
        if index % 500 == 0:
            highest = max(highest, _rss_mib())
    seconds = time.perf_counter() - started
    end = _rss_mib()
    return {
        "overlap": nlp.pipe.overlap,
        "batch_size": nlp.batch_size,
        "warm_rss_mib": round(warm),
        "growth_end_mib": round(end - warm),
        "growth_peak_mib": round(max(highest, end) - warm),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    made = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    made.add_argument("--pipeline", default="minilm-ewt")
    made.add_argument("--provider", default="cpu")
    made.add_argument("--precision", default="fp32")
    made.add_argument("--documents", type=int, default=20000)
    made.add_argument("--rounds", type=int, default=1)
    made.add_argument("--output", type=Path)
    made.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = made.parse_args()
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name in VARIANTS:
            command = [sys.executable, __file__, *sys.argv[1:], "--child", name]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(name, runs[name][-1], flush=True)
    peak = {name: max(r["growth_peak_mib"] for r in found) for name, found in runs.items()}
    from run import machine

    report = {
        "machine": machine(),
        "options": vars(args) | {"output": None, "child": None},
        "runs": runs,
        "peak_growth_ratio_overlap_vs_not": round(peak["overlap"] / max(1, peak["no overlap"]), 2),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
