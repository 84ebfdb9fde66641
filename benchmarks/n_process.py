"""One process on every thread against ``nlp.pipe(n_process=N)`` with the threads divided.

    python benchmarks/n_process.py --pipelines minilm-ewt trf-base --workers 2 \\
        --output benchmarks/results/n_process-<machine>.json

For each pipeline: ``optimize()`` as asked (default ``auto``), then the same held-out EWT
test documents annotated by one process with every runtime thread, and by
``nlp.pipe(..., n_process=N)``, whose workers each get the parent's threads divided by N
(``spacy_accelerate.pipeline.workers``). The two alternate, ``--repeats`` times; each pass
is timed from the call to the last document back in the parent, so the workers' start-up
(fork, their sessions opened again, warm-up) is counted, as it is on every call. Words
per second are the input's words over that time; the report gives the median and the
range, the time to the first document, the ratio, and whether the annotations of both are
identical. Each worker sends every document back to the parent serialized, with the
transformer's output in ``doc._.trf_data``; ``--doc-cleaner`` ends the pipeline with spaCy's
``doc_cleaner`` removing it (in both variants), as a user who does not read it can.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import alternating  # noqa: E402
from spacy_accelerate_samples.trained import load_benchmark_pipeline  # noqa: E402

import spacy_accelerate  # noqa: E402


def _annotations(doc: Any) -> list[tuple[str, str, int, str]]:
    return [(t.tag_, t.dep_, t.head.i, t.ent_iob_ + t.ent_type_) for t in doc]


def _timed(nlp: Any, texts: list[str], batch_size: int, workers: int) -> tuple[float, float, list]:
    """Seconds to the last document and to the first (the workers' start-up and one
    batch), and the annotations."""
    started = time.perf_counter()
    stream = nlp.pipe(texts, batch_size=batch_size, n_process=workers)
    docs = [next(stream)]
    first = time.perf_counter() - started
    docs.extend(stream)
    return time.perf_counter() - started, first, [_annotations(doc) for doc in docs]


def measure(name: str, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    nlp = load_benchmark_pipeline(name)
    if args.doc_cleaner:  # spaCy's own component: the transformer output stays in the worker
        nlp.add_pipe("doc_cleaner", config={"attrs": {"_.trf_data": None}})
    started = time.perf_counter()
    spacy_accelerate.optimize(nlp, args.provider, args.precision)
    set_up = time.perf_counter() - started
    (proxy,) = spacy_accelerate.accelerated_components(nlp).values()
    words = sum(len(text.split()) for text in texts)
    _timed(nlp, texts[:8], args.batch_size, 1)  # warm
    seconds: dict[int, list[float]] = {1: [], args.workers: []}
    firsts: dict[int, list[float]] = {1: [], args.workers: []}
    outputs: dict[int, list] = {}
    for _ in range(args.repeats):
        for workers in seconds:  # alternating
            took, first, outputs[workers] = _timed(nlp, texts, args.batch_size, workers)
            seconds[workers].append(took)
            firsts[workers].append(first)
            print(f"{name}: n_process={workers} {words / took:,.0f} words/s", flush=True)
    wps = {workers: [words / s for s in taken] for workers, taken in seconds.items()}
    median = {workers: statistics.median(values) for workers, values in wps.items()}
    return {
        "served": proxy.exported.summary,
        "optimize_s": round(set_up, 1),
        "threads_one_process": proxy.session.config.intra_op_threads,
        "threads_each_worker": max(1, proxy.session.config.intra_op_threads // args.workers),
        "documents": len(texts),
        "words": words,
        "wps": {
            f"n_process={workers}": {
                "median": round(median[workers]),
                "range": [round(min(values)), round(max(values))],
                "first_document_s": round(statistics.median(firsts[workers]), 2),
            }
            for workers, values in wps.items()
        },
        "ratio_workers_vs_one": round(median[args.workers] / median[1], 3),
        "identical_annotations": outputs[1] == outputs[args.workers],
    }


def main() -> None:
    parser = alternating.parser(__doc__.split("\n")[0], sentences=600)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--doc-cleaner",
        action="store_true",
        help="End the pipeline with spaCy's doc_cleaner dropping doc._.trf_data (in both "
        "variants): the workers then send the parent annotations only.",
    )
    args = parser.parse_args()
    alternating.run(args, measure, workers=args.workers, doc_cleaner=args.doc_cleaner)


if __name__ == "__main__":
    main()
