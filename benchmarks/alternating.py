"""What the benchmarks that alternate two ways of running one accelerated pipeline share
(``n_process.py``, ``overlap.py``): their command line, the held-out texts, the report."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from run import machine
from spacy_accelerate_samples import ewt
from spacy_accelerate_samples.trained import BENCHMARK_PIPELINES

from spacy_accelerate.bench.side_by_side import write_report


def parser(description: str, sentences: int) -> argparse.ArgumentParser:
    """The options every such benchmark takes; add its own."""
    made = argparse.ArgumentParser(description=description)
    made.add_argument("--pipelines", nargs="+", default=list(BENCHMARK_PIPELINES))
    made.add_argument("--provider", default="auto")
    made.add_argument("--precision", default="auto")
    made.add_argument("--repeats", type=int, default=3)
    made.add_argument("--batch-size", type=int, default=64)
    made.add_argument("--sentences", type=int, default=sentences, help="EWT test sentences")
    made.add_argument("--output", type=Path)
    return made


def run(
    args: argparse.Namespace,
    measure: Callable[[str, list[str], argparse.Namespace], dict[str, Any]],
    **settings: Any,
) -> None:
    """``measure`` each pipeline on the EWT test documents, and write the report (with
    ``settings``, the benchmark's own options)."""
    docs = ewt.load_documents("test", max_sentences=8, limit_sentences=args.sentences)
    texts = [doc.text for doc in docs]
    report = {
        "machine": machine(),
        "options": {"provider": args.provider, "precision": args.precision},
        "repeats": args.repeats,
        "batch_size": args.batch_size,
        **settings,
        "pipelines": {name: measure(name, texts, args) for name in args.pipelines},
    }
    write_report(report, args.output)
