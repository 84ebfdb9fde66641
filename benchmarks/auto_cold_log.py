"""One cold ``optimize(nlp, "auto", "auto")`` in a fresh process, with a timestamped log.

    python benchmarks/auto_cold_log.py trf-base > benchmarks/results/auto_cold_log-<machine>.txt

An empty cache folder of its own; every INFO and DEBUG record of ``spacy_accelerate``
printed with the seconds since the start, so that each step of the search (export,
calibration, each plan built, raced and judged, the final race) can be read off one run.
The last line is the seconds ``optimize()`` took. ``benchmarks/auto_search.py`` compares
the pruned and the full search; this shows where one search's time goes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

START = time.perf_counter()


class SinceStart(logging.Formatter):
    """A record as the seconds since the start and its message."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{time.perf_counter() - START:7.1f} {record.getMessage()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline", help="a benchmark pipeline, such as trf-base or minilm-ewt")
    args = parser.parse_args()
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(SinceStart())
    library = logging.getLogger("spacy_accelerate")
    library.setLevel(logging.DEBUG)
    library.addHandler(handler)
    library.propagate = False

    from spacy_accelerate_samples.trained import load_benchmark_pipeline

    import spacy_accelerate

    nlp = load_benchmark_pipeline(args.pipeline)
    started = time.perf_counter()
    spacy_accelerate.optimize(nlp, "auto", "auto", cache_dir=tempfile.mkdtemp(prefix="auto-log-"))
    print(f"TOTAL optimize {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
