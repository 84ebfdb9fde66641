"""A minimal web service on a saved accelerated pipeline: one ``nlp(text)`` per request.

Save the pipeline once, accelerated for single documents, with its models bundled::

    pip install "spacy-accelerate[cpu,openvino,examples]"
    spacy-accelerate optimize en_core_web_trf --precision auto --workload documents \\
        --output ./trf-accelerated

then serve it (each worker process loads it once; ``SPACY_THREADS`` gives each its share of
the machine's CPUs, here 8 CPUs for 4 workers)::

    SPACY_PIPELINE=./trf-accelerated SPACY_THREADS=2 \\
        uvicorn examples.web_service:app --workers 4
    curl -s localhost:8000/annotate -d '{"text": "Apple is buying a U.K. startup."}'

``spacy.load`` serves the bundled models (no export, no timing at load) and keeps no
PyTorch copy of the transformer's weights in memory. A request's annotation runs in a
worker thread, one at a time per process: the runtime already uses the process's CPUs, and
the event loop stays free to accept requests meanwhile. Without spacy-accelerate installed
the same folder loads on PyTorch (see docs/saving-and-loading.md).
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import spacy
from spacy.language import Language
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

#: The saved pipeline's folder (or an installed package's name).
PIPELINE_ENV = "SPACY_PIPELINE"
#: This process's runtime threads (unset: every CPU the process may use).
THREADS_ENV = "SPACY_THREADS"
#: The longest text a request may send, in characters.
MAX_CHARACTERS = 100_000


class Annotator:
    """The pipeline, loaded once per process, called by one request at a time."""

    def __init__(self, pipeline: str, threads: int | None) -> None:
        overrides = {"nlp": {"after_pipeline_creation": {"threads": threads}}} if threads else {}
        self.nlp: Language = spacy.load(pipeline, config=overrides)
        self.lock = threading.Lock()

    def __call__(self, text: str) -> dict[str, Any]:
        with self.lock:
            doc = self.nlp(text)
        return {
            "tokens": [
                {"text": t.text, "tag": t.tag_, "pos": t.pos_, "dep": t.dep_, "head": t.head.i}
                for t in doc
            ],
            "entities": [
                {"text": e.text, "label": e.label_, "start": e.start_char, "end": e.end_char}
                for e in doc.ents
            ],
        }


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    threads = os.environ.get(THREADS_ENV)
    app.state.annotate = Annotator(os.environ[PIPELINE_ENV], int(threads) if threads else None)
    yield


async def annotate(request: Request) -> JSONResponse:
    try:
        body = await request.json()
    except ValueError:
        return JSONResponse({"error": 'send JSON: {"text": "..."}'}, status_code=400)
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str) or len(text) > MAX_CHARACTERS:
        message = f"'text' must be a string of at most {MAX_CHARACTERS} characters"
        return JSONResponse({"error": message}, status_code=400)
    return JSONResponse(await run_in_threadpool(request.app.state.annotate, text))


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"pipeline": request.app.state.annotate.nlp.meta.get("name")})


app = Starlette(
    routes=[Route("/annotate", annotate, methods=["POST"]), Route("/health", health)],
    lifespan=lifespan,
)
