"""Soak: 50,000 documents through an accelerated pipeline, and whether its memory grows.

    python benchmarks/soak.py --sample minilm --documents 50000 \\
        --output benchmarks/results/soak-<machine>-<date>.json

Each provider runs in a child process of its own (one provider's arenas must not count
against the other). The documents are UD-EWT sentences of test and dev, cycled, each
document one to eight of them, so that batches come in every length the pipeline sees.
The resident set size (VmRSS) is read after a warm-up and then every ``--every`` documents
to the end; the figure that counts is the growth from the warm-up to the end. A leak of
one object per document would show as a steady climb.

The warm-up is ``--warmup`` documents of the stream, then one batch of the longest
documents it holds: the runtimes keep their buffers at the largest batch they have seen
(a first run found RSS stepping up exactly when a batch of more span rows than before
came by, 28 -> 30 -> 34 rows, and flat between), so a server reaches its steady state
once it has seen its largest batch, and that is what is measured after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: Documents per ``nlp.pipe`` batch.
BATCH_SIZE = 64


def rss_mib() -> float:
    """This process's resident set size, from the kernel."""
    with open("/proc/self/status", encoding="utf8") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def documents() -> Iterator[str]:
    """EWT sentences of test and dev, cycled, grouped one to eight per document."""
    from spacy_accelerate_samples import ewt

    sentences = [s.text for split in ("test", "dev") for s in ewt.read_sentences(split)]
    start, size = 0, 1
    while True:
        yield " ".join(sentences[(start + i) % len(sentences)] for i in range(size))
        start = (start + size) % len(sentences)
        size = size % 8 + 1


def soak(sample: str, provider: str, precision: str, count: int, warmup: int, every: int) -> dict:
    import spacy
    from spacy_accelerate_samples.pipelines import ensure_sample

    import spacy_accelerate

    nlp = spacy.load(ensure_sample(sample))
    spacy_accelerate.optimize(nlp, provider, precision)
    stream = documents()
    start = time.perf_counter()
    seen = list(islice(stream, warmup))
    longest = sorted(seen, key=len, reverse=True)[:BATCH_SIZE]
    for _ in nlp.pipe([*seen, *longest], batch_size=BATCH_SIZE):
        pass
    readings = [(warmup, rss_mib())]
    done = warmup
    while done < count:
        step = min(every, count - done)
        for _ in nlp.pipe(islice(stream, step), batch_size=BATCH_SIZE):
            pass
        done += step
        readings.append((done, rss_mib()))
        print(f"  {provider}: {done:,} documents, RSS {readings[-1][1]:,.1f} MiB", flush=True)
    after_warmup, end = readings[0][1], readings[-1][1]
    return {
        "provider": provider,
        "precision": precision,
        "documents": done,
        "seconds": round(time.perf_counter() - start, 1),
        "rss_after_warmup_mib": round(after_warmup, 1),
        "rss_end_mib": round(end, 1),
        "rss_growth_percent": round(100 * (end - after_warmup) / after_warmup, 2),
        "readings": [[n, round(mib, 1)] for n, mib in readings],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", default="minilm")
    parser.add_argument("--providers", nargs="+", default=["cpu", "openvino"])
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--every", type=int, default=5_000)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:  # one provider, in this process: print its result as JSON
        result = soak(
            args.sample, args.child, args.precision, args.documents, args.warmup, args.every
        )
        print("RESULT " + json.dumps(result), flush=True)
        return

    results = []
    for provider in args.providers:
        command = [sys.executable, __file__, *sys.argv[1:], "--child", provider]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
        lines = done.stdout.splitlines()
        print("\n".join(line for line in lines if not line.startswith("RESULT ")))
        (line,) = [line for line in lines if line.startswith("RESULT ")]
        results.append(json.loads(line.removeprefix("RESULT ")))
    report = {
        "sample": args.sample,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "results": results,
    }
    for result in results:
        print(
            f"{result['provider']:9s} {result['documents']:,} documents in "
            f"{result['seconds']:,.0f} s: RSS {result['rss_after_warmup_mib']:,.1f} MiB after "
            f"warm-up, {result['rss_end_mib']:,.1f} MiB at the end "
            f"({result['rss_growth_percent']:+.2f}%)"
        )
    if args.output:
        args.output.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
