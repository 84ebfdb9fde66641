"""Concurrent ``nlp(text)`` in one process, as a threaded service calls it (issue 61, item 1).

    python benchmarks/concurrent_calls.py --pipeline minilm-ewt --clients 1 8 32 \\
        --output benchmarks/results/concurrent-calls-<machine>.json

Closed loop, in process (no HTTP): ``--clients`` threads each send held-out EWT test
sentences one after the other for ``--seconds``, the variants alternating round by round:

- ``plain``: the PyTorch pipeline called from every thread at once, as a plain spaCy
  service does (no lock);
- ``accelerated, one at a time``: the accelerated pipeline behind a lock, as
  ``examples/web_service.py`` served before issue 61;
- ``accelerated, shared calls``: the accelerated pipeline called from every thread at once:
  the encoder's calls of concurrent requests run together
  (:mod:`spacy_accelerate.runtime.shared_calls`);
- ``plain, awaited batches`` and ``accelerated, awaited batches``: clients as coroutines on
  one event loop awaiting :func:`spacy_accelerate.aio.annotate`, which annotates the
  requests awaited together as one ``nlp.pipe`` batch (the plain one is the fair rival).

Requests per second, p50 and p99 latency, and the encoder runs per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from run import machine, machine_slug  # noqa: E402
from spacy_accelerate_samples import ewt  # noqa: E402
from spacy_accelerate_samples.trained import load_benchmark_pipeline  # noqa: E402

import spacy_accelerate  # noqa: E402
from spacy_accelerate import aio  # noqa: E402


class Awaited:
    """A pipeline awaited through :func:`spacy_accelerate.aio.annotate` (the closed loop
    runs its clients as coroutines)."""

    def __init__(self, nlp: Any) -> None:
        self.nlp = nlp

    def __call__(self, text: str) -> Any:
        return self.nlp(text)  # the warm-up's call


def awaited_loop(nlp: Any, texts: list[str], clients: int, seconds: float) -> list[float]:
    """``closed_loop`` with coroutines awaiting ``aio.annotate`` on one event loop."""
    latencies: list[float] = []

    async def client(offset: int, deadline: float) -> None:
        index = offset
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await aio.annotate(nlp, texts[index % len(texts)])
            latencies.append(time.perf_counter() - started)
            index += clients

    async def run() -> None:
        deadline = time.perf_counter() + seconds
        await asyncio.gather(*(client(i, deadline) for i in range(clients)))

    asyncio.run(run())
    return latencies


def closed_loop(call: Callable[[str], Any], texts: list[str], clients: int, seconds: float):
    """``clients`` threads calling ``call`` on ``texts`` in turn for ``seconds``: the
    latencies of the calls that ended in time."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    lock = threading.Lock()

    def client(offset: int) -> None:
        index = offset
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            call(texts[index % len(texts)])
            ended = time.perf_counter()
            with lock:
                latencies.append(ended - started)
            index += clients

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def _row(latencies: list[float], seconds: float, runs: int | None) -> dict[str, Any]:
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    row = {
        "requests": len(latencies),
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": cuts[49] * 1e3,
        "p99_ms": cuts[98] * 1e3,
    }
    if runs is not None:
        row["encoder_runs_per_request"] = runs / len(latencies)
    return row


def variants(pipeline: str, provider: str, precision: str) -> dict[str, tuple[Any, Any]]:
    """Each variant's call, and its proxy (None for plain) to count the encoder's runs."""
    plain = load_benchmark_pipeline(pipeline)
    accelerated = load_benchmark_pipeline(pipeline)
    spacy_accelerate.optimize(accelerated, provider, precision, workload="documents")
    (proxy,) = spacy_accelerate.accelerated_components(accelerated).values()
    lock = threading.Lock()

    def one_at_a_time(text: str) -> Any:
        with lock:
            return accelerated(text)

    return {
        "plain": (plain, None),
        "accelerated, one at a time": (one_at_a_time, proxy),
        "accelerated, shared calls": (accelerated, proxy),
        "plain, awaited batches": (Awaited(plain), None),
        "accelerated, awaited batches": (Awaited(accelerated), proxy),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", default="minilm-ewt")
    parser.add_argument("--provider", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    texts = [s.text for s in ewt.read_sentences("test")[:400]]
    calls = variants(args.pipeline, args.provider, args.precision)
    for call, _ in calls.values():  # warm: each variant's first calls
        for text in texts[:20]:
            call(text)
    report: dict[str, Any] = {"machine": machine(), "args": vars(args) | {"output": None}}
    for clients in args.clients:
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in calls}
        for turn in range(args.rounds):
            names = list(calls) if turn % 2 == 0 else list(calls)[::-1]
            for name in names:
                call, proxy = calls[name]
                before = proxy.served.shared_calls.runs if proxy is not None else 0
                if isinstance(call, Awaited):
                    latencies = awaited_loop(call.nlp, texts, clients, args.seconds)
                else:
                    latencies = closed_loop(call, texts, clients, args.seconds)
                runs = proxy.served.shared_calls.runs - before if proxy is not None else None
                rows[name].append(_row(latencies, args.seconds, runs))
        report[f"{clients} clients"] = {name: _medians(found) for name, found in rows.items()}
        print(json.dumps({clients: report[f"{clients} clients"]}, indent=1), flush=True)
    output = args.output or Path(f"concurrent-calls-{machine_slug(report['machine'])}.json")
    with contextlib.suppress(OSError):
        output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))
    print(f"written to {output}")


def _medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


if __name__ == "__main__":
    main()
