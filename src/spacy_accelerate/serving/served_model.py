"""The runtime session a proxy serves from, in this process.

A proxy's session is opened by the process that made it. A forked worker (spaCy's
``n_process`` on Linux, gunicorn's preload) inherits the parent's session, whose runtime
threads did not survive the fork: it opens the same verified cache entry once, on its
share of the parent's threads (:mod:`spacy_accelerate.cpu_budget`). The overlap plan
serves from another session of the same model (:meth:`ServedModel.serve_on`). Concurrent
callers' calls run together while the runtime is busy
(:mod:`spacy_accelerate.runtime.shared_calls`), where each row's outputs are its own
whatever the others.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.cpu_budget import BUDGET, on_fork_in_child
from spacy_accelerate.errors import CacheError
from spacy_accelerate.options.config import OptimizeConfig
from spacy_accelerate.provision.get_or_export import ExportedModel, reopen
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.runtime.shared_calls import SharedCalls

#: Sessions a forked process inherited from its parent. They are never run there (their
#: thread pools' workers stayed in the parent) and never destroyed there either: tearing
#: one down joins thread handles that belong to the parent, which can crash the child
#: (onnxruntime PR #31961). The fork itself ends, with ``os._exit``, without freeing them.
_INHERITED: list[Session] = []
_FORK_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    # A lock a parent's thread held at the fork stays held in the child: start afresh.
    global _FORK_LOCK
    _FORK_LOCK = threading.Lock()


on_fork_in_child(_after_fork_in_child)


def worker_config(config: OptimizeConfig) -> OptimizeConfig:
    """``config`` on this process's share of its threads (all of them outside a
    ``pipe`` call with workers)."""
    return replace(config, intra_op_threads=BUDGET.threads_each(config.intra_op_threads))


class ServedModel:
    """A proxy's session and the verified model it serves (``provenance``: None for a
    candidate plan, still being judged), opened in this process."""

    def __init__(
        self,
        session: Session,
        spec: EncoderSpec,
        provenance: ExportedModel | None,
        read_original: Callable[[], torch.nn.Module],
    ) -> None:
        self.session = session
        self.spec = spec
        self.provenance = provenance
        #: The PyTorch module, with its weights: what a cache entry gone is built from.
        self.read_original = read_original
        #: The process whose runtime opened ``session`` (see :meth:`own_session`).
        self.opened_in = os.getpid()
        #: Concurrent calls, run together while the runtime is busy.
        self.shared_calls = SharedCalls(spec.padding_idx)

    @property
    def exported(self) -> ExportedModel:
        """The verified model served: its cache entry (what a fork, an overlap plan or an
        unpickled copy reopens), how it was built and checked. A candidate plan, still
        being judged, has none: it is in no cache entry yet, and it runs only scoped to
        the thread judging it, where nothing reopens or pickles it."""
        if self.provenance is None:
            raise CacheError(
                "A candidate plan being judged is in no cache entry yet: it cannot be "
                "reopened or pickled; please report this."
            )
        return self.provenance

    def run(self, feeds: dict[str, torch.Tensor], names: Sequence[str]) -> list[torch.Tensor]:
        """The outputs ``names`` of this process's session, run with the calls of other
        threads where rows are independent (not under dynamic int8)."""
        session = self.own_session()
        if session.rows_independent:
            return self.shared_calls.run(session.run_tensors, feeds, names)
        return session.run_tensors(feeds, names)

    def own_session(self) -> Session:
        """The session, opened in this process (see the module's docstring)."""
        if self.opened_in == os.getpid():
            return self.session
        with _FORK_LOCK:
            if self.opened_in != os.getpid():
                _INHERITED.append(self.session)
                self.reopen_with(worker_config(self.session.config))
                self.opened_in = os.getpid()
        return self.session

    def serve_on(self, threads: int) -> None:
        """Serve from a session of the same verified model on ``threads`` runtime threads
        (the split of the CPUs under overlap, :mod:`spacy_accelerate.planning.overlap_plan`)."""
        if threads != self.session.config.intra_op_threads:
            self.reopen_with(replace(self.session.config, intra_op_threads=threads))

    def serving(self) -> tuple[Session, ExportedModel | None]:
        """What serves now (to put back with :meth:`serve`)."""
        return self.session, self.provenance

    def serve(self, served: tuple[Session, ExportedModel | None]) -> None:
        """Serve from a session :meth:`serving` returned (of the same model)."""
        self.session, self.provenance = served

    def reopen_with(self, config: OptimizeConfig) -> None:
        """Serve from the verified model's cache entry opened with ``config``."""
        reopened = reopen(
            self.exported,
            self.spec,
            self.read_original,
            self.session.provider,
            config,
            self.session.layout,
        )
        if reopened is None:
            raise CacheError(
                f"The cached {config.precision.value} model {self.exported.key[:12]} is no "
                "longer in the cache. Call spacy_accelerate.optimize(nlp) again (before "
                "starting workers), and do not clear the cache while the pipeline runs."
            )
        self.session, self.provenance = reopened
