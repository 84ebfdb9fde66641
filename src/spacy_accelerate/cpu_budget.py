"""The CPU budget of a process serving an accelerated pipeline: the one module that says
how many threads each part runs on, and the one place that changes torch's.

What it decides:

- **The CPUs this process may use** (:func:`available_cpus`): its CPU affinity (containers
  and ``taskset`` restrict it; oversubscription costs more than it gains), or fewer where
  the process is one of several sharing them (:meth:`CpuBudget.confine`: a Ray actor's
  ``num_cpus``).
- **Each worker's share**: ``nlp.pipe(n_process=N)`` records N while it runs
  (:meth:`CpuBudget.sharing`); a session opened or unpickled in a worker gets the parent's
  runtime threads divided among them (:meth:`CpuBudget.threads_each`).
- **The runtime's threads under overlap and whether overlap pays**: one cost model
  (:class:`OverlapCost`), read by ``optimize()`` (:mod:`spacy_accelerate.planning.overlap_plan`)
  and by ``spacy-accelerate bench``'s advice.
- **torch's threads.** ``torch.set_num_threads`` sets the calling thread's OpenMP setting
  and, through ATen's lazily read default, that of every thread started later. The library
  changes only the calling thread's setting (OpenMP's and MKL's per-thread calls,
  :func:`_this_thread`), only around its own work and never across a ``yield``
  (:func:`glue_threads`), or once in a thread of its own before that thread runs anything
  (:func:`helper_threads`), so that whenever control is in the caller's code the count is
  what the caller left, and threads others start meanwhile get the caller's default. The
  one lasting change is in a process forked from one that served an accelerated pipeline
  (:func:`after_fork_in_child`): a forked child inherits torch's OpenMP bookkeeping but
  not its threads, and its first parallel op would hang (spaCy#6662), so it runs torch on
  one thread. Every change is listed in
  docs/concurrency.md.
"""

from __future__ import annotations

import ctypes
import functools
import math
import multiprocessing
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType


#: The least gain (overlapped against one stage after the other, per word) for which
#: overlap is turned on by default: below it, noise and the helper's cost win.
MIN_OVERLAP_GAIN = 1.05


def affinity_cpus() -> int:
    """The CPUs this process may run on (its affinity), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


class CpuBudget:
    """This process's CPUs and how they are shared: the ``nlp.pipe(n_process=N)`` calls
    running now (a forked worker inherits the count of the call that forked it), and a
    limit set by whoever started the process (a Ray actor's CPUs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[int] = []
        self._confined: int | None = None
        #: The accelerated transformers in a pipeline's shim now (held weakly: a pipeline
        #: dropped takes its own away; ``restore()`` too).
        self._served: weakref.WeakSet[object] = weakref.WeakSet()

    def serve(self, module: object) -> None:
        """``module`` serves in a pipeline from now on (:attr:`serving`)."""
        self._served.add(module)

    def stop_serving(self, module: object) -> None:
        self._served.discard(module)

    def serves(self, module: object) -> bool:
        """Whether ``module`` serves in a pipeline now."""
        return module in self._served

    @property
    def served(self) -> int:
        """How many accelerated transformers serve in this process's pipelines."""
        return len(self._served)

    @property
    def serving(self) -> bool:
        """Whether this process serves (or was forked from one that served) an accelerated
        pipeline: then its forked children run torch on one thread."""
        return bool(self._served)

    def cpus(self) -> int:
        """The CPUs this process uses: its affinity, or the limit it was confined to."""
        mine = affinity_cpus()
        return mine if self._confined is None else max(1, min(mine, self._confined))

    def confine(self, cpus: float | None) -> None:
        """Use at most ``cpus`` CPUs from now on (None: the affinity's); a Ray actor's
        ``num_cpus``, which Ray does not enforce with an affinity."""
        self._confined = None if cpus is None else max(1, int(cpus))

    @property
    def workers(self) -> int:
        """The processes this process's runtime threads are shared among (1 outside an
        ``nlp.pipe(n_process=N)`` call)."""
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
        """In a forked child: a fresh lock (one a parent's thread held stays held)."""
        self._lock = threading.Lock()


#: This process's budget.
BUDGET = CpuBudget()


def available_cpus() -> int:
    """The CPUs this process's runtime sessions share by default."""
    return BUDGET.cpus()


def worker_count(n_process: int) -> int:
    """The worker processes spaCy starts for ``n_process`` (-1: one per CPU)."""
    return multiprocessing.cpu_count() if n_process == -1 else max(1, n_process)


@dataclass(frozen=True)
class OverlapCost:
    """What overlap gains, from an accelerated pipeline's stages timed one after the other
    with its runtime on ``threads`` threads (seconds per word): the encoder call, the
    transformer component's work around it (both in the helper thread under overlap), and
    everything else (the tokenizer and the components, on the caller's thread). The
    encoder's time is taken to scale with its threads; the rest runs on one core."""

    threads: int
    encoder: float
    around: float
    components: float

    @property
    def sequential(self) -> float:
        """Seconds per word without overlap, on every thread."""
        return self.encoder + self.around + self.components

    def overlapped(self, runtime_threads: int) -> float:
        """Seconds per word with overlap, the runtime on ``runtime_threads``: its slower
        side, and never less than the work of every stage spread over every CPU (the
        encoder's runtime on every thread shares them with the caller's thread)."""
        encoder = self.encoder * self.threads / max(1, runtime_threads)
        work = (self.encoder * self.threads + self.around + self.components) / self.threads
        return max(encoder + self.around, self.components, work)

    @property
    def runtime_threads(self) -> int:
        """The runtime's threads under overlap: one fewer, leaving the components a core
        of their own, where the slower side still beats the stages one after the other
        (a parallel loop waits for its slowest thread: a core shared with the caller's
        thread makes the encoder late whenever the components run)."""
        if self.threads < 2:
            return self.threads
        fewer = self.threads - 1
        return fewer if self.overlapped(fewer) < self.sequential else self.threads

    @property
    def gain(self) -> float:
        """Predicted words per second with overlap over without (at best)."""
        return self.sequential / self.overlapped(self.runtime_threads)

    @property
    def pays(self) -> bool:
        """Whether overlap is predicted to gain at least :data:`MIN_OVERLAP_GAIN`."""
        return self.threads >= 2 and self.gain >= MIN_OVERLAP_GAIN

    @property
    def ceiling(self) -> float:
        """Words per second one overlapped process reaches at most, however many cores:
        its slower thread's rate without the encoder (which scales with threads)."""
        return 1 / max(self.components, self.around)

    @property
    def saturating_threads(self) -> int | None:
        """The runtime threads at which the encoder keeps pace with the components; None
        where it never does."""
        spare = self.components - self.around
        if spare <= 0:
            return None
        return max(1, math.ceil(self.encoder * self.threads / spare))

    def processes(self, cpus: int) -> int:
        """How many processes use ``cpus`` CPUs best: one, until a process's components,
        not its encoder, bound it; then one per saturating share."""
        saturating = self.saturating_threads
        if saturating is None or saturating + 1 >= cpus:
            return 1
        return max(1, cpus // (saturating + 1))


@dataclass(frozen=True)
class OverlapPlan:
    """Whether ``nlp.pipe`` overlaps, and how many threads fewer than its full count the
    runtime then runs on (0 or 1), with why (for the log) and the ``overlap`` option it was
    decided for (a pipeline loaded with another serves that option instead)."""

    overlap: bool
    fewer: int = 0
    why: str = ""
    asked: bool | None = None

    def runtime_threads(self, threads: int) -> int:
        """The runtime's threads out of ``threads``, under this plan."""
        return max(1, threads - self.fewer) if self.overlap else threads

    def record(self) -> dict[str, Any]:
        """As saved in ``config.cfg``."""
        return {"overlap": self.overlap, "fewer": self.fewer, "asked": self.asked}

    @classmethod
    def from_record(cls, record: Any) -> OverlapPlan | None:
        """A saved plan, or None where there is none or it is not one (a hand-edited or
        older file: the plan is then decided anew)."""
        if not isinstance(record, dict):
            return None
        overlap, fewer, asked = record.get("overlap"), record.get("fewer"), record.get("asked")
        if not isinstance(overlap, bool) or type(fewer) is not int or fewer not in (0, 1):
            return None
        if not isinstance(asked, bool | None):
            return None
        return cls(overlap, fewer, "recorded with the pipeline", asked)


_LEASE = threading.local()


def _torch() -> ModuleType:
    """torch, imported when first needed: the command line's ``--help`` imports this
    module and must not import torch."""
    import torch

    return torch


@functools.cache
def _thread_local_setters() -> tuple[Callable[[int], Any], ...]:
    """The C functions that set torch's threads for the calling thread only: OpenMP's
    ``omp_set_num_threads`` (its per-thread setting, which ATen's parallel loops read) and
    MKL's ``mkl_set_num_threads_local``, looked up in torch's own library, which links
    both. ``torch.set_num_threads`` also stores ATen's process-wide default, which every
    thread started later copies at its first parallel op: a thread another caller starts
    while the library holds one thread would keep one for good. Empty where torch was not
    built on OpenMP or the functions are not found: :func:`_this_thread` then falls back
    to ``torch.set_num_threads``."""
    torch = _torch()
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return ()
    try:
        library = ctypes.CDLL(str(Path(str(torch.__file__)).parent / "lib" / "libtorch_cpu.so"))
        found = [library.omp_set_num_threads]
    except (OSError, AttributeError):
        return ()
    mkl = getattr(library, "MKL_Set_Num_Threads_Local", None)
    return (*found, *([mkl] if mkl is not None else []))


def _this_thread(threads: int) -> None:
    """torch on ``threads`` threads in the calling thread, and nowhere else (see
    :func:`_thread_local_setters`). ATen reads its default into a thread once, at the
    thread's first parallel op: that is done first, so that it cannot undo this later."""
    torch = _torch()
    torch.get_num_threads()
    setters = _thread_local_setters()
    if not setters:
        torch.set_num_threads(threads)
        return
    for setter in setters:
        setter(threads)


@contextmanager
def glue_threads(glue_only: bool = True) -> Iterator[None]:
    """torch on one thread in the calling thread while the block runs (the library's own
    work, where torch only glues runtimes together), put back after it; other threads,
    and threads started meanwhile, keep theirs. Blocks nest; never hold one across a
    ``yield`` to the caller, and run the caller's code met inside one (its texts iterator)
    in :func:`callers_threads`. ``glue_only=False``: no change."""
    previous = _torch().get_num_threads()
    change = glue_only and previous != 1
    outer = getattr(_LEASE, "callers", None)
    if change:
        _this_thread(1)
        _LEASE.callers = previous
    try:
        yield
    finally:
        if change:
            _LEASE.callers = outer
            _this_thread(previous)


@contextmanager
def callers_threads() -> Iterator[None]:
    """Inside :func:`glue_threads`: the caller's own torch threads while the block runs
    the caller's code (a texts iterator pulled by the library); no change outside one."""
    callers = getattr(_LEASE, "callers", None)
    if callers is None:
        yield
        return
    _this_thread(callers)
    try:
        yield
    finally:
        _this_thread(1)


def helper_threads(glue_only: bool) -> None:
    """Set up torch in a thread the library started, before it runs anything: one thread
    where torch only glues (``glue_only``), in that thread only."""
    if glue_only:
        _this_thread(1)
    else:
        _torch().get_num_threads()


def worker_torch_threads(threads: int) -> None:
    """In a worker process of ``nlp.pipe(n_process=N)`` (spaCy's, not the caller's):
    torch on at most its share of the threads."""
    if _torch().get_num_threads() > threads:
        _torch().set_num_threads(threads)


#: Other modules' resets in a forked child (:func:`on_fork_in_child`).
_FORK_RESETS: list[Callable[[], None]] = []


def on_fork_in_child(reset: Callable[[], None]) -> None:
    """Run ``reset`` in every forked child (a lock or registry a parent's thread held):
    the one fork handler of the library is this module's."""
    _FORK_RESETS.append(reset)


def after_fork_in_child() -> None:
    """In a forked child: fresh locks, and torch on one thread where the parent served
    an accelerated pipeline (see the module's docstring)."""
    BUDGET.after_fork()
    for reset in _FORK_RESETS:
        reset()
    if BUDGET.serving and _torch().get_num_threads() > 1:
        _torch().set_num_threads(1)


os.register_at_fork(after_in_child=after_fork_in_child)
