"""``precision="auto"`` cold and warm: the pruned search against the full one, on one machine.

    python benchmarks/auto_search.py --pipelines minilm-ewt trf-base --repeats 2 \\
        --output benchmarks/results/auto_search-<machine>.json

For each pipeline, ``optimize(nlp, provider="auto", precision="auto")`` runs in an empty
cache folder of its own, alternating the pruned search (what ``optimize()`` does) and the
full one (every candidate built and judged, no rivals:
:func:`spacy_accelerate.planning.auto_search.full_search`); then once more in the same
folder (warm: the stored choice, a cache hit). Reported: the seconds of each, the plan each
served (with the choice it stored: every passing plan's timed seconds, every refusal),
and whether the two searches served the same plan.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from spacy_accelerate_samples.trained import (  # noqa: E402
    REFERENCES,
    load_benchmark_pipeline,
)

import spacy_accelerate  # noqa: E402
from spacy_accelerate.bench.side_by_side import write_report  # noqa: E402
from spacy_accelerate.cpu_features import cpu_features, simulated  # noqa: E402
from spacy_accelerate.export.fingerprint import package_versions  # noqa: E402
from spacy_accelerate.planning.auto_precision import CHOICE_FILE  # noqa: E402
from spacy_accelerate.planning.auto_search import full_search  # noqa: E402

SEARCHES: dict[str, Callable[[], AbstractContextManager[Any]]] = {
    "pruned": nullcontext,
    "full": full_search,
}


def one_search(name: str, search: str) -> dict[str, Any]:
    """A cold and a warm ``optimize()`` of pipeline ``name`` in a cache of its own."""
    nlp = load_benchmark_pipeline(name)
    cache = Path(tempfile.mkdtemp(prefix="auto-search-"))
    try:
        started = time.perf_counter()
        with SEARCHES[search]():
            spacy_accelerate.optimize(nlp, "auto", "auto", cache_dir=cache)
        cold = time.perf_counter() - started
        choice = stored_choice(cache)
        served = {
            n: p.exported.summary for n, p in spacy_accelerate.accelerated_components(nlp).items()
        }
        spacy_accelerate.restore(nlp)
        started = time.perf_counter()
        spacy_accelerate.optimize(nlp, "auto", "auto", cache_dir=cache)
        warm = time.perf_counter() - started
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    plans = {n: summary.split(", exported")[0] for n, summary in served.items()}
    print(f"{name} {search}: cold {cold:.1f} s, warm {warm:.2f} s, {plans}", flush=True)
    return {
        "cold_seconds": round(cold, 1),
        "warm_seconds": round(warm, 2),
        "served": plans,
        # Why: each passing plan's timed seconds and each refusal, as the search stored them.
        "choice": choice,
    }


def stored_choice(cache: Path) -> dict[str, Any] | None:
    """The choice the cold search stored in ``cache`` (None where none was stored)."""
    found = sorted(cache.rglob(CHOICE_FILE))
    return json.loads(found[0].read_text()) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", nargs="+", default=list(REFERENCES))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-bf16", action="store_true", help="as on a CPU without bf16 units")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    features = cpu_features().without_bf16() if args.no_bf16 else cpu_features()
    report: dict[str, Any] = {"cpu": features.describe(), "cpus": len(os.sched_getaffinity(0))}
    with simulated(features):
        for name in args.pipelines:
            runs = [
                {"search": search, **one_search(name, search)}
                for _ in range(args.repeats)
                for search in SEARCHES
            ]
            plans = {str(run["served"]) for run in runs}
            report[name] = {"runs": runs, "same_plan": len(plans) == 1}
    report["versions"] = package_versions()
    report["date"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    write_report(report, args.output)


if __name__ == "__main__":
    main()
