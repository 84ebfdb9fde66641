"""``nlp(text)`` for an async service: awaited, run in a worker thread.

An async endpoint (FastAPI's ``async def``, Starlette, aiohttp) must not annotate on the
event loop: it would hold every other request while the pipeline runs. Awaiting
:func:`annotate` runs ``nlp(text)`` in one of this module's worker threads instead, so the
event loop goes on, and the encoder calls of requests in flight at once run together while
the runtime is busy (:mod:`spacy_accelerate.runtime.shared_calls`), exactly as for a sync
endpoint in a thread pool.

A request cancelled before its thread starts it (a client gone, a timeout) is never
annotated; one cancelled while its document is being annotated finishes in its thread and
the document is dropped: a pipeline cannot stop between two of its components.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from spacy.language import Language
from spacy.tokens import Doc

#: Worker threads: the requests annotated at once (the rest wait for a thread). As many
#: as a run of the encoder takes rows together, so that a full batch can form.
WORKER_THREADS = 64

_LOCK = threading.Lock()
#: The worker threads and the process that started them (a forked child has none of its
#: parent's threads: it starts its own).
_EXECUTOR: tuple[int, ThreadPoolExecutor] | None = None


def _executor() -> ThreadPoolExecutor:
    """The worker threads, started on first use (none for a process that never awaits)."""
    global _EXECUTOR
    with _LOCK:
        if _EXECUTOR is None or _EXECUTOR[0] != os.getpid():
            threads = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="spacy-accelerate")
            _EXECUTOR = (os.getpid(), threads)
        return _EXECUTOR[1]


async def annotate(
    nlp: Language, text: str | Doc, *, component_cfg: dict[str, dict[str, Any]] | None = None
) -> Doc:
    """``nlp(text, component_cfg=...)``, awaited (see the module's docstring)::

    doc = await spacy_accelerate.aio.annotate(nlp, request_text)
    """
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor(), lambda: nlp(text, component_cfg=component_cfg))
