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
PyTorch copy of the transformer's weights in memory. Requests are annotated off the event
loop, which stays free to accept requests meanwhile, and never behind a lock: with
spacy-accelerate installed, through ``spacy_accelerate.aio.annotate``, which annotates the
requests in flight together as one ``nlp.pipe`` batch while the pipeline is busy (a lone
request starts at once, alone); without it, the same folder loads on PyTorch (see
docs/saving-and-loading.md) and each request runs ``nlp(text)`` in Starlette's thread pool,
as a plain spaCy service does. At most 256 requests wait (``QueueFullError``: answered 503).

What a request may send (the limits below; anything else answers 400, saying why, before
any annotation starts):

- valid Unicode: a JSON ``\\ud800`` escape decodes to a lone surrogate, which spaCy's
  tokenizer cannot encode (``UnicodeEncodeError``);
- something to annotate: not empty, not only whitespace (a whitespace-only text makes a
  curated transformer pipeline raise ``ValueError``, with or without spacy-accelerate:
  docs/design.md, "Known upstream behaviour");
- at most ``MAX_TEXT_BYTES`` of UTF-8: every piece covers at least one byte and every token
  at least one character, so a request's work grows with its bytes (not with its
  characters: byte-level BPE makes four pieces of a rare emoji);
- no word (characters between whitespace) over ``MAX_WORD_CHARACTERS``: WordPiece's time
  grows faster than the square of a word's length (a 10,000-character word: 35 to 65 s in
  curated-tokenizers' ``WordPieceProcessor`` alone), spaCy's tokenizer's with the square of
  a run of punctuation (``")" * 10_000``: 7.6 s).

Within these, the slowest texts tried (words of punctuation, of emoji, of random letters)
took at most 3.5x as long as English of as many bytes: en_core_web_trf's architecture,
accelerated, on a busy two-CPU machine, 4.2 to 4.6 s for 5,000 bytes of English, 10.3 to
14.3 s for the slowest 5,000 bytes. Set the limits from what your pipeline takes on your
workers; longer documents go to ``nlp.pipe`` in a batch job, or in several requests.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import spacy
import torch
from confection import ConfigValidationError
from spacy.language import Language
from spacy.tokens import Doc
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

try:  # the library's batching where it is installed; plain spaCy where it is not
    from spacy_accelerate import aio
    from spacy_accelerate.errors import QueueFullError as QueueFull
except ImportError:
    aio = None  # type: ignore[assignment]

    class QueueFull(Exception):  # type: ignore[no-redef]
        """Never raised without the library."""


#: The saved pipeline's folder (or an installed package's name).
PIPELINE_ENV = "SPACY_PIPELINE"
#: This process's runtime threads (unset: every CPU the process may use).
THREADS_ENV = "SPACY_THREADS"

# What one request may ask of a worker (why these: the module's docstring).
#: The longest text a request may send, in bytes of UTF-8.
MAX_TEXT_BYTES = 5_000
#: The longest word a text may hold, in characters between whitespace.
MAX_WORD_CHARACTERS = 200
#: The largest request body read: room for the text JSON-escaped (at most 6 bytes of JSON
#: for one byte of text, ``\\u0000``).
MAX_BODY_BYTES = 6 * MAX_TEXT_BYTES + 1_000

_LONG_WORD = re.compile(rf"\S{{{MAX_WORD_CHARACTERS + 1},}}")


def refusal(text: object) -> str | None:
    """Why ``text`` is not annotated, or None when it is."""
    if not isinstance(text, str):
        return "'text' must be a string"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as error:
        return (
            f"'text' is not valid Unicode: a lone surrogate (U+{ord(text[error.start]):04X}) "
            f"at character {error.start}"
        )
    if size > MAX_TEXT_BYTES:
        return (
            f"'text' is {size} bytes of UTF-8, over the limit of {MAX_TEXT_BYTES}: "
            "split it into several requests"
        )
    if not text.strip():
        return "'text' has nothing to annotate: it is empty or only whitespace"
    word = _LONG_WORD.search(text)
    if word is not None:
        return (
            f"'text' has a word of {word.end() - word.start()} characters at character "
            f"{word.start()}, over the limit of {MAX_WORD_CHARACTERS} characters between "
            "whitespace"
        )
    return None


def load(pipeline: str, threads: int | None) -> Language:
    """The pipeline, running on ``threads`` threads (None: every CPU it may use): an
    accelerated one's runtime through its saved ``optimize()`` settings, PyTorch's where
    the folder is not accelerated (or the library is not installed)."""
    if threads is None:
        return spacy.load(pipeline)
    torch.set_num_threads(threads)
    try:
        return spacy.load(
            pipeline, config={"nlp": {"after_pipeline_creation": {"threads": threads}}}
        )
    except ConfigValidationError:  # no optimize() settings: a plain pipeline
        return spacy.load(pipeline)


class Annotator:
    """The pipeline, loaded once per process, called by every request."""

    def __init__(self, pipeline: str, threads: int | None) -> None:
        self.nlp: Language = load(pipeline, threads)

    async def __call__(self, text: str) -> dict[str, Any]:
        if aio is None:  # a plain spaCy service: one nlp(text) per request, in a thread
            doc = await run_in_threadpool(self.nlp, text)
        else:
            doc = await aio.annotate(self.nlp, text)
        return annotations(doc)


def annotations(doc: Doc) -> dict[str, Any]:
    """What a request gets back: each token's tag, part of speech and dependency, and the
    entities."""
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


def text_in(raw: bytes) -> str | JSONResponse:
    """The text a request's body asks to annotate, or the answer refusing it, saying why."""
    if len(raw) > MAX_BODY_BYTES:
        message = f"the request body is over {MAX_BODY_BYTES} bytes"
        return JSONResponse({"error": message}, status_code=413)
    try:
        body = json.loads(raw)
    except ValueError:
        return JSONResponse({"error": 'send JSON: {"text": "..."}'}, status_code=400)
    text = body.get("text") if isinstance(body, dict) else None
    message = refusal(text)
    if message is not None:
        return JSONResponse({"error": message}, status_code=400)
    return text


async def annotate(request: Request) -> JSONResponse:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            break  # not read further: refused as too long
    text = text_in(bytes(raw))
    if isinstance(text, JSONResponse):
        return text
    try:
        return JSONResponse(await request.app.state.annotate(text))
    except QueueFull as error:
        return JSONResponse({"error": str(error)}, status_code=503)


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"pipeline": request.app.state.annotate.nlp.meta.get("name")})


app = Starlette(
    routes=[Route("/annotate", annotate, methods=["POST"]), Route("/health", health)],
    lifespan=lifespan,
)
