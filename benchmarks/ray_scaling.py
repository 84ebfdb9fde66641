"""Rows per second of :func:`spacy_accelerate.ray.annotate` with 1 and 2 actors, and the
time Ray adds at start-up, over UD-EWT test sentences.

    python benchmarks/ray_scaling.py [--pipeline PATH] [--rows 2000] [--actors 1,2]

The pipeline defaults to the tiny RoBERTa sample ($SPACY_ACCELERATE_SAMPLES). The model
cache is filled before the runs, so every actor start is a cache hit; each run reports the
wall time to the first annotated batch (actor start: load + optimize), the whole run, and
the rate after the first batch (steady state).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import ray
import spacy
from spacy_accelerate_samples import ewt
from spacy_accelerate_samples.pipelines import ensure_sample

import spacy_accelerate
from spacy_accelerate.ray import annotate

FIELDS = ("tags", "deps", "heads", "entities")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default=None)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--actors", default="1,2")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    samples = Path(os.environ.get("SPACY_ACCELERATE_SAMPLES", tempfile.mkdtemp()))
    pipeline = args.pipeline or str(ensure_sample("roberta", samples))
    texts = [sentence.text for sentence in ewt.read_sentences("test")][: args.rows]
    rows = [{"id": index, "text": text} for index, text in enumerate(texts)]
    cache = Path(tempfile.mkdtemp(prefix="ray-scaling-cache-"))
    options = {"provider": "cpu", "cache_dir": str(cache)}

    started = time.perf_counter()
    nlp = spacy_accelerate.optimize(spacy.load(pipeline), **options)  # fill the cache
    single_start = time.perf_counter()
    list(nlp.pipe(texts, batch_size=args.batch_size))
    single = time.perf_counter() - single_start
    print(f"pipeline {pipeline}, {len(rows)} rows, fields {','.join(FIELDS)}")
    print(f"cache filled in {single_start - started:.1f} s")
    print(f"one process, no Ray (nlp.pipe, threads=default): {len(rows) / single:.0f} rows/s")

    init_start = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    init = time.perf_counter() - init_start
    print(f"ray.init: {init:.1f} s ({os.cpu_count()} CPUs)")
    for actors in (int(count) for count in args.actors.split(",")):
        dataset = ray.data.from_items(rows)
        annotated = annotate(
            dataset,
            pipeline,
            optimize_options=options,
            fields=FIELDS,
            batch_size=args.batch_size,
            concurrency=actors,
            num_cpus=1,
        )
        start = time.perf_counter()
        first = None
        count = errors = 0
        for batch in annotated.iter_batches(batch_format="pyarrow", batch_size=None):
            if first is None:
                first = time.perf_counter()
                first_rows = batch.num_rows
            count += batch.num_rows
            errors += batch.num_rows - batch.column("error").null_count
        end = time.perf_counter()
        assert first is not None and count == len(rows) and errors == 0
        steady = (count - first_rows) / (end - first) if end > first else float("nan")
        print(
            f"{actors} actor(s): first batch after {first - start:.1f} s "
            f"(ray.init + this: {init + first - start:.1f} s), whole run {end - start:.1f} s "
            f"= {count / (end - start):.0f} rows/s; after the first batch {steady:.0f} rows/s"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
