"""The accelerated pipeline with the transformer overlapping spaCy's components against the
same pipeline one after the other (``optimize(overlap=...)``).

    python benchmarks/overlap.py --pipelines minilm-ewt trf-base \\
        --output benchmarks/results/overlap-<machine>.json

For each pipeline: first ``optimize()`` as asked (default ``auto``) with ``overlap`` left to
it, and the plan it decided (:mod:`spacy_accelerate.planning.overlap_plan`); then
``overlap`` forced on (the runtime on the threads it measures) and off (every thread),
switched before each pass, then the held-out EWT test documents annotated
by ``nlp.pipe``, alternating, ``--repeats`` times; words per second over the whole call
(median and range), the ratio, and whether the annotations (tags, dependencies, entities,
and the transformer's last layer) are identical.
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


def _annotations(doc: Any) -> tuple:
    hidden = doc._.trf_data.last_hidden_layer_state.dataXd.tobytes()
    return [(t.tag_, t.dep_, t.head.i, t.ent_iob_ + t.ent_type_) for t in doc], hidden


def measure(name: str, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    nlp = load_benchmark_pipeline(name)
    started = time.perf_counter()
    spacy_accelerate.optimize(nlp, args.provider, args.precision)  # the default: decided
    decided = {
        "plan": dict(nlp.config["nlp"]["after_pipeline_creation"]["overlap_plan"]),
        "optimize_seconds": round(time.perf_counter() - started, 1),
    }
    print(f"{name}: optimize() decided {decided['plan']}", flush=True)
    variants = {"overlap": True, "no overlap": False}
    words = sum(len(text.split()) for text in texts)
    seconds: dict[str, list[float]] = {variant: [] for variant in variants}
    outputs: dict[str, list] = {}
    threads: dict[str, int] = {}

    def switch(variant: str) -> None:  # optimize() again: the split is the option's
        overlap = variants[variant]
        spacy_accelerate.optimize(nlp, args.provider, args.precision, overlap=overlap)
        (served,) = spacy_accelerate.accelerated_components(nlp).values()
        threads[variant] = served.session.config.intra_op_threads

    for variant in variants:  # warm
        switch(variant)
        list(nlp.pipe(texts[:16], batch_size=args.batch_size))
    for _ in range(args.repeats):
        for variant in variants:  # alternating
            switch(variant)
            started = time.perf_counter()
            docs = list(nlp.pipe(texts, batch_size=args.batch_size))
            seconds[variant].append(time.perf_counter() - started)
            outputs[variant] = [_annotations(doc) for doc in docs]
            print(f"{name}: {variant} {words / seconds[variant][-1]:,.0f} words/s", flush=True)
    (proxy,) = spacy_accelerate.accelerated_components(nlp).values()
    wps = {variant: [words / s for s in taken] for variant, taken in seconds.items()}
    median = {variant: statistics.median(values) for variant, values in wps.items()}
    return {
        "served": proxy.exported.summary,
        "decided_by_optimize": decided,
        "runtime_threads": threads,
        "words": words,
        "wps": {
            variant: {"median": round(median[variant]), "range": [round(min(v)), round(max(v))]}
            for variant, v in wps.items()
        },
        "ratio_overlap_vs_not": round(median["overlap"] / median["no overlap"], 3),
        "identical_annotations": outputs["overlap"] == outputs["no overlap"],
    }


def main() -> None:
    args = alternating.parser(__doc__.split("\n")[0], sentences=1000).parse_args()
    alternating.run(args, measure)


if __name__ == "__main__":
    main()
