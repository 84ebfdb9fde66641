"""Worker processes of an accelerated pipeline share this machine's CPUs and run safely.

``nlp.pipe(texts, n_process=N)`` starts N worker processes: forked on Linux (before
Python 3.14), otherwise spawned or forked from a server, the pipeline then pickled to
each. Two things would go wrong in them without this module:

- **A forked worker hangs in PyTorch.** ``optimize()`` runs the PyTorch encoder (to check
  the exported model against it), which starts torch's OpenMP thread pool. A forked child
  inherits that pool's bookkeeping but not its threads, so the first parallel torch op
  there (in a downstream head: a scalar weighting of the layers, say) waits forever
  (spaCy#6662). In every process forked from one that accelerated a pipeline, torch runs
  on one thread (:func:`after_fork_in_child`); torch still computes the same values.
  The encoder itself runs on the accelerated runtime, whose session the worker opens
  afresh (:meth:`~spacy_accelerate.pipeline.proxy.AcceleratedModule._own_session`).
- **N workers would each take every CPU.** The session a worker opens gets the parent's
  runtime threads divided among the workers of the ``pipe`` call that started it, at
  least one (:meth:`WorkerShare.threads_each`); a pickled pipeline carries that count,
  and the unpickling worker runs torch on as many threads. The count is known because an
  accelerated pipeline's ``nlp.pipe``
  (:class:`~spacy_accelerate.pipeline.pipe.AcceleratedPipe`) records N while the call
  runs (:meth:`WorkerShare.sharing`). Ray actors follow their own CPUs instead
  (``spacy_accelerate.ray``).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class WorkerShare:
    """How many processes the runtime threads of this process are shared among: the
    workers of the ``nlp.pipe(n_process=N)`` call running now (1 outside one). A forked
    worker inherits the count of the call that forked it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[int] = []
        #: Whether this process serves (or was forked from one that served) an
        #: accelerated pipeline: then its forked children run torch on one thread.
        self.serving = False

    @property
    def workers(self) -> int:
        with self._lock:
            return max(self._calls, default=1)

    def threads_each(self, threads: int) -> int:
        """A worker's share of ``threads`` (at least one)."""
        return max(1, threads // self.workers)

    @contextmanager
    def sharing(self, workers: int) -> Iterator[None]:
        """Count ``workers`` processes while the block runs (calls may nest or overlap)."""
        with self._lock:
            self._calls.append(workers)
        try:
            yield
        finally:
            with self._lock:
                self._calls.remove(workers)

    def after_fork(self) -> None:
        """In a forked child: fresh lock (one a parent's thread held stays held)."""
        self._lock = threading.Lock()


#: This process's share.
WORKERS = WorkerShare()


def after_fork_in_child() -> None:
    WORKERS.after_fork()
    if WORKERS.serving and torch.get_num_threads() > 1:
        torch.set_num_threads(1)


os.register_at_fork(after_in_child=after_fork_in_child)


def worker_count(n_process: int) -> int:
    """The worker processes spaCy starts for ``n_process`` (-1: one per CPU)."""
    return multiprocessing.cpu_count() if n_process == -1 else max(1, n_process)
