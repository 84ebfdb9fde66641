"""One ``traffic.py`` variant's server: ``examples/web_service.py``'s app as the variant
serves it, imported by every uvicorn worker process (``traffic_server:app``), the variant
read from ``TRAFFIC_MODE``:

- ``plain``: the library hidden, as where it is not installed (``nlp(text)`` in
  Starlette's thread pool);
- ``library``: the example as it is (``aio.annotate``);
- ``locked``: the example as it was before issue 61, the baseline of its targets: each
  request's ``nlp(text)`` and answer in Starlette's thread pool, behind one lock.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

MODE_ENV = "TRAFFIC_MODE"
MODES = ("plain", "library", "locked")

_mode = os.environ[MODE_ENV]
if _mode not in MODES:
    raise SystemExit(f"{MODE_ENV} must be one of {MODES}, not {_mode!r}")
if _mode == "plain":
    sys.modules["spacy_accelerate"] = None  # type: ignore[assignment]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import web_service  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402


class LockedAnnotator(web_service.Annotator):
    """One request at a time, its answer built in the thread that annotated it."""

    def __init__(self, pipeline: str, threads: int | None) -> None:
        super().__init__(pipeline, threads)
        self.lock = threading.Lock()

    def annotate_alone(self, text: str) -> dict[str, Any]:
        with self.lock:
            doc = self.nlp(text)
        return web_service.annotations(doc)

    async def __call__(self, text: str) -> dict[str, Any]:
        return await run_in_threadpool(self.annotate_alone, text)


if _mode == "locked":
    web_service.Annotator = LockedAnnotator  # type: ignore[misc]


async def process_id(request: Request) -> JSONResponse:
    """Which worker answered: the load starts once every worker has loaded its pipeline."""
    return JSONResponse({"pid": os.getpid()})


app = web_service.app
app.add_route("/pid", process_id)
