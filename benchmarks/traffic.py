"""A closed-loop load run against ``examples/web_service.py`` under uvicorn (issue 61, item
3), for ``benchmarks/serving.py``.

Each variant is served by fresh uvicorn processes on 127.0.0.1 (one worker with the
machine's CPUs, or several sharing them), then ``clients`` coroutines each send held-out
texts one after the other over HTTP for ``seconds`` (a bounded count each), for 1, 8 and
32 clients, sentences and paragraphs: requests per second, p50 and p99 latency, errors,
and the server's RSS at the end (its worker processes' included). The variants:

- ``plain service``: the plain pipeline served as a plain spaCy user serves it, the same
  example with the library not installed (``nlp(text)`` in Starlette's thread pool);
- ``plain, batched``: the plain pipeline with the library installed, the requests in
  flight annotated together the same way (``aio.annotate``): the fair rival;
- each accelerated plan's saved folder, served by the same example, and served one
  request at a time as the example did before issue 61 (the baseline of its targets).

The server is ``traffic_server.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Variant:
    """How one variant is served: its saved folder, ``traffic_server.py``'s mode and how
    many uvicorn worker processes share the machine's CPUs (each given its share through
    the example's ``SPACY_THREADS``)."""

    folder: Path
    mode: str
    processes: int = 1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rss_mib(pid: int) -> float:
    """The resident memory of ``pid`` and every process under it (uvicorn's workers)."""
    total = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            total += int(line.split()[1]) / 1024
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            total += _rss_mib(int(child))
    return total


class Server:
    """``examples/web_service.py`` on a variant's folder, in uvicorn processes of its own."""

    def __init__(self, variant: Variant) -> None:
        self.port = _free_port()
        env = {**os.environ, "SPACY_PIPELINE": str(variant.folder), "TRAFFIC_MODE": variant.mode}
        if variant.processes > 1:
            env["SPACY_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // variant.processes))
        command = [
            *(sys.executable, "-m", "uvicorn", "traffic_server:app", "--app-dir", str(BENCHMARKS)),
            *("--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"),
            *("--workers", str(variant.processes)),
        ]
        self.process = subprocess.Popen(command, env=env)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, processes: int, timeout: float = 600) -> None:
        """Until each of the ``processes`` workers has answered (its pipeline loaded)."""
        import httpx

        deadline, answered = time.monotonic() + timeout, set()
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server on {self.url} ended: {self.process.returncode}")
            try:
                with httpx.Client() as fresh:  # a new connection: any worker may take it
                    answered.add(fresh.get(f"{self.url}/pid", timeout=2).json()["pid"])
                time.sleep(0.1)
            except httpx.HTTPError:
                time.sleep(0.5)
            if len(answered) >= processes:
                return
        raise RuntimeError(f"the server on {self.url} did not start in {timeout} s")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


async def _closed_loop(url: str, texts: list[str], clients: int, seconds: float, most: int):
    import httpx

    latencies: list[float] = []
    errors = 0

    async def client(offset: int, http: httpx.AsyncClient, deadline: float) -> None:
        nonlocal errors
        for sent in range(most):
            if time.perf_counter() > deadline:
                return
            text = texts[(offset + sent * clients) % len(texts)]
            started = time.perf_counter()
            answer = await http.post(f"{url}/annotate", json={"text": text})
            if answer.status_code == 200:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(*(client(i, http, deadline) for i in range(clients)))
        wall = time.perf_counter() - started
    return latencies, errors, wall


def _row(latencies: list[float], errors: int, wall: float) -> dict[str, Any]:
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "requests": len(latencies),
        "errors": errors,
        "requests_per_s": len(latencies) / wall,
        "p50_ms": cuts[49] * 1e3,
        "p99_ms": cuts[98] * 1e3,
    }


def traffic_rows(
    variants: dict[str, Variant],
    kinds: dict[str, list[str]],
    clients: list[int],
    seconds: float,
) -> dict[str, Any]:
    """Every variant under every load, one server a variant, after an untimed pass of each
    kind."""
    report: dict[str, Any] = {}
    for name, variant in variants.items():
        server = Server(variant)
        try:
            server.wait_ready(variant.processes)
            rows: dict[str, Any] = {}
            for kind, texts in kinds.items():
                asyncio.run(_closed_loop(server.url, texts, 4, 1e9, 5))  # warm
                for count in clients:
                    found = asyncio.run(_closed_loop(server.url, texts, count, seconds, 400))
                    rows[f"{kind}, {count} clients"] = _row(*found)
            rows["server_rss_mib"] = _rss_mib(server.process.pid)
            report[name] = rows
            print(json.dumps({name: rows}, indent=1), flush=True)
        finally:
            server.stop()
    return report
