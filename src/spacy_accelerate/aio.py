"""``nlp(text)`` for an async service: awaited, concurrent requests annotated together.

An async endpoint (FastAPI's ``async def``, Starlette, aiohttp) must not annotate on the
event loop: it would hold every other request while the pipeline runs. Awaiting
:func:`annotate` instead hands the text to the pipeline's batcher on this event loop
(:class:`RequestBatches`), which annotates in a worker thread, the way Ray Serve's
``@serve.batch`` and Triton's dynamic batcher do:

- **a lone request never waits**: where nothing is being annotated, it starts at once,
  alone (``nlp(text)``);
- requests that arrive while a batch is annotated wait, and the next batch takes them all
  (up to :data:`MAX_DOCUMENTS`) through ``nlp.pipe``: the whole pipeline runs batched (the
  transformer, and spaCy's components, vectorised over the batch), not only the encoder's
  calls (:mod:`spacy_accelerate.runtime.shared_calls`, which sync callers get);
- a bounded queue: at most :data:`~spacy_accelerate.runtime.shared_calls.MAX_WAITING`
  requests wait; one more raises :class:`~spacy_accelerate.errors.QueueFullError` at once;
- one request's failure is its own: a batch that raises is annotated again document by
  document, so the error reaches the request that caused it;
- a request cancelled before its batch starts (a client gone, a timeout) is never
  annotated; one cancelled while its batch runs is dropped when it ends (a pipeline cannot
  stop between two of its components).

It works on any pipeline, accelerated or not (the plain pipeline batched the same way is
the fair rival of an accelerated service: ``benchmarks/serving.py``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate.runtime.shared_calls import MAX_WAITING, queue_full

#: The most requests one batch annotates; more wait for the next.
MAX_DOCUMENTS = 64
#: Worker threads annotating batches: one batch at a time per pipeline and event loop.
WORKER_THREADS = 8

Config = dict[str, dict[str, Any]]


@dataclass(eq=False)
class _Request:
    text: str | Doc
    component_cfg: Config | None
    future: asyncio.Future[Doc]


def annotate_each(
    nlp: Language, texts: list[str | Doc], component_cfg: Config | None = None
) -> list[Doc | Exception]:
    """Each text's document, or the error annotating it raised: the texts annotated as one
    ``nlp.pipe`` batch, and where that raises, one by one, so that an error reaches only
    the text that caused it. A batcher's worker (here, or a Ray Serve ``@serve.batch``
    method) calls it in a thread."""
    if len(texts) > 1:
        try:
            return list(nlp.pipe(texts, batch_size=len(texts), component_cfg=component_cfg))
        except Exception:
            pass  # annotated one by one below: the error reaches its own text
    found: list[Doc | Exception] = []
    for text in texts:
        try:
            found.append(nlp(text, component_cfg=component_cfg))
        except Exception as error:
            found.append(error)
    return found


def _annotate_batch(nlp: Language, batch: list[_Request]) -> list[Doc | Exception]:
    """Each request's document, or the error annotating it raised (in a worker thread)."""
    return annotate_each(nlp, [request.text for request in batch], batch[0].component_cfg)


class RequestBatches:
    """The awaited requests of one pipeline on one event loop (see the module's
    docstring). ``batches`` counts the batches annotated (tests and stats)."""

    def __init__(self, nlp: Language, executor: Callable[[], ThreadPoolExecutor]) -> None:
        self.nlp = nlp
        self.batches = 0
        self._executor = executor
        self._waiting: deque[_Request] = deque()
        #: The task annotating batch after batch while requests wait (held: the event
        #: loop keeps only a weak reference to a task).
        self._draining: asyncio.Task[None] | None = None

    async def annotate(self, text: str | Doc, component_cfg: Config | None) -> Doc:
        if len(self._waiting) >= MAX_WAITING:
            raise queue_full("requests are waiting for this pipeline")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Doc] = loop.create_future()
        self._waiting.append(_Request(text, component_cfg, future))
        if self._draining is None:
            self._draining = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        """Annotate batch after batch while requests wait. However it ends (the event loop
        cancelling it at shutdown included), no request is left waiting for ever."""
        try:
            while self._waiting:
                batch = self._take()
                if batch:
                    await self._annotate(batch)
        finally:
            self._draining = None
            for request in self._waiting:  # only where the loop cancelled this task
                request.future.cancel()
            self._waiting.clear()

    async def _annotate(self, batch: list[_Request]) -> None:
        """Annotate ``batch`` in a worker thread and answer each of its requests."""
        self.batches += 1
        loop = asyncio.get_running_loop()
        try:
            found = await loop.run_in_executor(self._executor(), _annotate_batch, self.nlp, batch)
        except Exception as error:  # not annotated (the worker threads shut down): said so
            found = [error] * len(batch)
        except BaseException:  # this task cancelled: the batch's requests too
            for request in batch:
                request.future.cancel()
            raise
        for request, doc in zip(batch, found, strict=True):
            if request.future.done():  # cancelled meanwhile: dropped
                continue
            if isinstance(doc, Exception):
                request.future.set_exception(doc)
            else:
                request.future.set_result(doc)

    def _take(self) -> list[_Request]:
        """The next batch: the first request still awaited and those awaited with the same
        ``component_cfg``, up to :data:`MAX_DOCUMENTS`; cancelled ones are dropped."""
        live = [request for request in self._waiting if not request.future.done()]
        self._waiting.clear()
        if not live:
            return []
        first = live[0]
        batch = [r for r in live if r.component_cfg == first.component_cfg][:MAX_DOCUMENTS]
        self._waiting.extend(request for request in live if request not in batch)
        return batch


_LOCK = threading.Lock()
#: The worker threads and the process that started them (a forked child has none of its
#: parent's threads: it starts its own).
_EXECUTOR: tuple[int, ThreadPoolExecutor] | None = None
#: Each pipeline's batchers, by event loop (both forgotten once collected).
_BATCHES: weakref.WeakKeyDictionary[Language, weakref.WeakKeyDictionary[Any, RequestBatches]]
_BATCHES = weakref.WeakKeyDictionary()


def _executor() -> ThreadPoolExecutor:
    """The worker threads, started on first use (none for a process that never awaits)."""
    global _EXECUTOR
    with _LOCK:
        if _EXECUTOR is None or _EXECUTOR[0] != os.getpid():
            threads = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="spacy-accelerate")
            _EXECUTOR = (os.getpid(), threads)
        return _EXECUTOR[1]


def batches_of(nlp: Language) -> RequestBatches:
    """``nlp``'s batcher on the running event loop."""
    loop = asyncio.get_running_loop()
    with _LOCK:
        by_loop = _BATCHES.setdefault(nlp, weakref.WeakKeyDictionary())
        if loop not in by_loop:
            by_loop[loop] = RequestBatches(nlp, _executor)
        return by_loop[loop]


async def annotate(nlp: Language, text: str | Doc, *, component_cfg: Config | None = None) -> Doc:
    """``nlp(text, component_cfg=...)``, awaited, batched with the requests awaited at the
    same time (see the module's docstring)::

        doc = await spacy_accelerate.aio.annotate(nlp, request_text)
    """
    return await batches_of(nlp).annotate(text, component_cfg)
