"""CPU runtimes on real spans: one call over the padded batch vs rows grouped by length.

    python benchmarks/length_groups.py --pipeline trf-base --sentences 400

The pipeline runs once on PyTorch over UD-EWT test documents with a recorder
in its shim, so the batches are exactly what spaCy hands the transformer
(strided spans padded to the longest). Each served model (``--variants``,
``provider:precision``) then runs those batches (a) in one call per batch,
padding and all, and (b) as it is served: rows grouped by length, each group
cut to its longest row (:mod:`spacy_accelerate.runtime.length_groups`). Both
alternate, ``--repeats`` passes each; the report gives real pieces per
second, the ratio, the share of padded positions, and the largest difference
between (a) and (b) at the real pieces.
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
from spacy_accelerate_samples.trained import TRAINED_SAMPLE_NAME, load_benchmark_pipeline  # noqa: E402

import spacy_accelerate  # noqa: E402
from spacy_accelerate.bench.side_by_side import alternate, write_report  # noqa: E402

DEFAULT_VARIANTS = ("cpu:fp32", "cpu:int8", "openvino:fp32", "openvino:int8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default=TRAINED_SAMPLE_NAME)
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    parser.add_argument(
        "--min-agreement",
        type=float,
        default=0.98,
        help="OpenVINO int8's agreement bound (the sample pipelines' heads fail the default)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    nlp = load_benchmark_pipeline(args.pipeline)
    cache = Path(tempfile.mkdtemp())
    runners: dict[str, Any] = {}
    for variant in args.variants:
        provider, precision = variant.split(":")
        options: dict[str, Any] = {"cache_dir": cache, "warmup": False}
        if provider == "openvino" and precision == "int8":
            options["min_agreement"] = args.min_agreement
        spacy_accelerate.optimize(nlp, provider, precision, **options)
        proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
        runners[variant] = proxy.session.runner
        spec = proxy.spec
        spacy_accelerate.restore(nlp)
    calls = recorded_test_batches(nlp, spec, args.sentences)
    last = [spec.hidden_state_names[-1]]
    masks = [call.attention_mask.astype(bool) for call in calls]
    pieces = sum(int(mask.sum()) for mask in masks)

    def feeds_for(runner: Any) -> list[dict[str, np.ndarray]]:
        return [call.feeds(runner.input_names) for call in calls]

    def largest_difference(runner: Any) -> float:
        worst = 0.0
        for feed, mask in zip(feeds_for(runner), masks, strict=True):
            whole = np.array(runner.run_whole(feed, last)[0], copy=True)
            grouped = runner.run_arrays(feed, last)[0]
            worst = max(worst, float(np.abs(whole[mask] - grouped[mask]).max()))
        return worst

    timed: dict[str, Any] = {}
    for variant, runner in runners.items():
        feeds = feeds_for(runner)
        for label, run in (("whole batch", runner.run_whole), ("by length", runner.run_arrays)):
            timed[f"{variant} {label}"] = lambda run=run, feeds=feeds: [run(f, last) for f in feeds]
    for run in timed.values():  # warm-up
        run()
    times = alternate(timed, args.repeats)
    rate = {name: pieces / statistics.median(t) for name, t in times.items()}
    report = {
        "pipeline": args.pipeline,
        "sentences": args.sentences,
        "call_shapes": [list(call.shape) for call in calls],
        "pieces": pieces,
        "padded_share": round(1 - pieces / sum(mask.size for mask in masks), 3),
        "variants": {
            variant: {
                "whole_pieces_per_second": round(rate[f"{variant} whole batch"], 1),
                "by_length_pieces_per_second": round(rate[f"{variant} by length"], 1),
                "speedup": round(rate[f"{variant} by length"] / rate[f"{variant} whole batch"], 3),
                "max_abs_diff_at_real_pieces": largest_difference(runner),
            }
            for variant, runner in runners.items()
        },
    }
    write_report(report, args.output)


if __name__ == "__main__":
    main()
