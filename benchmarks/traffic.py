"""A closed-loop load run against ``examples/web_service.py`` under uvicorn (issue 61, item
3), for ``benchmarks/serving.py``.

Each variant is served by a fresh uvicorn process on 127.0.0.1 (one worker, the machine's
CPUs), then ``clients`` coroutines each send held-out texts one after the other over
HTTP for ``seconds`` (a bounded count each), for 1, 8 and 32 clients, sentences and
paragraphs: requests per second, p50 and p99 latency, errors, and the server's RSS at the
end. The variants:

- ``plain service``: the plain pipeline served as a plain spaCy user serves it, the same
  example with the library not installed (``nlp(text)`` in Starlette's thread pool);
- ``plain, batched``: the plain pipeline with the library installed, the requests in
  flight annotated together the same way (``aio.annotate``): the fair rival;
- each accelerated plan's saved folder, served by the same example.
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
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

#: argv: the port, whether the library may be imported ("plain" hides it).
SERVER = """
import sys
if sys.argv[2] == "plain":
    sys.modules["spacy_accelerate"] = None  # as where it is not installed
sys.path.insert(0, sys.argv[3])
import uvicorn, web_service
uvicorn.run(web_service.app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Server:
    """``examples/web_service.py`` on ``folder`` in a uvicorn process of its own."""

    def __init__(self, folder: Path, plain_service: bool) -> None:
        self.port = _free_port()
        env = {**os.environ, "SPACY_PIPELINE": str(folder)}
        mode = "plain" if plain_service else "library"
        command = [sys.executable, "-c", SERVER, str(self.port), mode, str(EXAMPLES)]
        self.process = subprocess.Popen(command, env=env)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 600) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server on {self.url} ended: {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
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
    variants: dict[str, tuple[Path, bool]],
    kinds: dict[str, list[str]],
    clients: list[int],
    seconds: float,
) -> dict[str, Any]:
    """Every variant (its folder, and whether it is served as a plain spaCy service) under
    every load, one server process a variant, after an untimed pass of each kind."""
    report: dict[str, Any] = {}
    for variant, (folder, plain_service) in variants.items():
        server = Server(folder, plain_service)
        try:
            server.wait_ready()
            rows: dict[str, Any] = {}
            for kind, texts in kinds.items():
                asyncio.run(_closed_loop(server.url, texts, 4, 1e9, 5))  # warm
                for count in clients:
                    found = asyncio.run(_closed_loop(server.url, texts, count, seconds, 400))
                    rows[f"{kind}, {count} clients"] = _row(*found)
            rows["server_rss_mib"] = _rss_mib(server.process.pid)
            report[variant] = rows
            print(json.dumps({variant: rows}, indent=1), flush=True)
        finally:
            server.stop()
    return report
