"""How much the library says while it works: its own progress for long steps, and whether
third-party output (NNCF's bars and tables, ...) reaches the user.

The command line sets the level from ``--quiet`` / ``--verbose``; Python callers may call
:func:`set_verbosity` themselves.

The long steps of ``optimize()`` (export, calibration, quantization, each plan judged, ...)
say what they do through :func:`step`::

    with progress.step("measuring each MatMul's int8 harm", total=len(matmuls)) as advance:
        for matmul in matmuls:
            ...
            advance()

    with progress.step("searching int8 plans") as search:
        search.note("plan 2: dynamic int8")   # what it is doing now
        progress.note("racing it against bf16")  # the same, from a lower function

    for doc in progress.track(nlp.pipe(texts), "annotating", len(texts)): ...

    @progress.step("OpenVINO int8: quantizing")   # the whole function is the step
    def quantize_within_gate(...): ...

Where stderr is a terminal a step is a tqdm bar on stderr (shown at once, gone when the
step ends); elsewhere (logs, CI, notebooks) it is plain INFO lines on the
``spacy_accelerate`` logger: the step when it starts and ends, each note, and how far it
got at most every :data:`LOG_EVERY` seconds. Nothing at all at :attr:`Verbosity.QUIET`.

:func:`third_party_output` keeps other libraries' chatter (NNCF's progress bars and
tables on stdout) from the user below :attr:`Verbosity.VERBOSE`.

This module is at the bottom of the package's layers: every stage may use it, and it
imports nothing of the library.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import threading
import time
from collections.abc import Generator, Iterable, Iterator, Sequence, Sized
from contextlib import contextmanager
from typing import IO, Any, TypeVar


class Verbosity(enum.IntEnum):
    """QUIET: errors only. NORMAL: the library's own progress. VERBOSE: third-party output
    too."""

    QUIET = 0
    NORMAL = 1
    VERBOSE = 2


_level = Verbosity.NORMAL


def set_verbosity(level: Verbosity) -> None:
    """Set how much the library says from now on (process-wide)."""
    global _level
    _level = Verbosity(level)


def verbosity() -> Verbosity:
    """The level :func:`set_verbosity` set last (NORMAL by default)."""
    return _level


logger = logging.getLogger("spacy_accelerate")

T = TypeVar("T")

#: In log lines, how often (seconds) a step with a total says how far it got.
LOG_EVERY = 10.0

#: How a bar reads, with a total and without.
_COUNTED = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
_UNCOUNTED = "{desc} [{elapsed}{postfix}]"


def _bars_wanted() -> bool:
    """Whether steps are drawn as bars: stderr is a terminal."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return False


class Step:
    """One long step in progress: call it (or :meth:`advance`) when a part is done,
    :meth:`note` to say what it is doing now. Silent at :attr:`Verbosity.QUIET`."""

    def __init__(self, what: str, total: int | None) -> None:
        self.what, self.total = what, total
        self.done = 0
        self._started = self._logged = time.perf_counter()
        self._bar: Any = None
        self._shown = verbosity() > Verbosity.QUIET and total != 0
        if self._shown and _bars_wanted():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=what,
                bar_format=_COUNTED if total else _UNCOUNTED,
                leave=False,
                file=sys.stderr,
                dynamic_ncols=True,
            )
        elif self._shown:
            logger.info("spacy-accelerate: %s%s", what, f" (0 of {total})" if total else "")

    def advance(self, count: int = 1) -> None:
        """``count`` more parts of the step are done."""
        self.done += count
        if self._bar is not None:
            self._bar.update(count)
        elif self._shown and time.perf_counter() - self._logged >= LOG_EVERY:
            self._logged = time.perf_counter()
            logger.info("spacy-accelerate: %s: %s", self.what, self._so_far())

    __call__ = advance

    def note(self, text: str) -> None:
        """Say what the step is doing now (``"plan 2: dynamic int8"``)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text[:60], refresh=True)
        elif self._shown:
            self._logged = time.perf_counter()
            logger.info("spacy-accelerate: %s: %s", self.what, text)

    def _so_far(self) -> str:
        return f"{self.done} of {self.total}" if self.total else f"{self.done} done"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._shown:
            seconds = time.perf_counter() - self._started
            finished = f"{self._so_far()}, " if self.total or self.done else ""
            logger.info("spacy-accelerate: %s: finished (%s%.1f s)", self.what, finished, seconds)
        self._shown = False


_open = threading.local()


def _steps() -> list[Step]:
    """The steps open in this thread, innermost last."""
    if not hasattr(_open, "steps"):
        _open.steps = []
    steps: list[Step] = _open.steps
    return steps


@contextmanager
def step(what: str, total: int | None = None) -> Iterator[Step]:
    """A long step, said as ``what`` (``"quantizing to int8"``) for as long as the block
    runs; ``total``: how many parts it has (None: not known; 0: nothing to do, so nothing
    is shown). Steps nest."""
    current = Step(what, total)
    steps = _steps()
    steps.append(current)
    try:
        yield current
    finally:
        steps.remove(current)
        current.close()


def track(items: Iterable[T], what: str, total: int | None = None) -> Generator[T, None, None]:
    """``items``, one :func:`step` advanced as each is done (``total``: by default their
    ``len()``, where they have one)."""
    if total is None and isinstance(items, Sized):
        total = len(items)
    with step(what, total) as current:
        for item in items:
            yield item
            current.advance()


def advance(count: int = 1) -> None:
    """``count`` more parts of the innermost open step of this thread are done."""
    steps = _steps()
    if steps:
        steps[-1].advance(count)


def note(text: str) -> None:
    """Say what the innermost open step of this thread is doing now (an INFO line where
    none is open, unless quiet)."""
    steps = _steps()
    if steps:
        steps[-1].note(text)
    elif verbosity() > Verbosity.QUIET:
        logger.info("spacy-accelerate: %s", text)


class _Sieve:
    """Stands in for ``sys.stdout`` while some thread is in :func:`third_party_output`:
    drops what such a thread writes, and what threads started meanwhile write (a
    progress bar's refresh thread), and passes on the rest. Says it is no terminal, so
    that a progress library draws nothing while it runs."""

    def __init__(self, target: IO[str]) -> None:
        self.target = target
        self.known = {thread.ident for thread in threading.enumerate()}

    def _dropped(self) -> bool:
        ident = threading.get_ident()
        return ident in _silenced or ident not in self.known

    def write(self, text: str) -> int:
        return len(text) if self._dropped() else self.target.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


_sieve_lock = threading.Lock()
_silenced: dict[int, int] = {}  # thread id -> how many third_party_output blocks it is in
_sieve: _Sieve | None = None
_levels: dict[str, int] = {}  # the levels the silenced loggers had


class _RootRecords(logging.Filter):
    """Drops the INFO and DEBUG records that the modules of some packages log on the root
    logger (ONNX Runtime's quantizer logs there) from one thread."""

    def __init__(self, packages: Sequence[str], ident: int) -> None:
        super().__init__()
        self.parts = tuple(f"{os.sep}{package}{os.sep}" for package in packages)
        self.ident = ident

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.levelno < logging.WARNING
            and record.thread == self.ident
            and any(part in record.pathname for part in self.parts)
        )


@contextmanager
def third_party_output(*loggers: str, root_records_of: Sequence[str] = ()) -> Iterator[None]:
    """Unless the verbosity is :attr:`Verbosity.VERBOSE`: what this thread (and threads it
    starts) writes to ``sys.stdout`` is dropped while the block runs, the named loggers
    (``"nncf"``) say only warnings and errors, and so do the packages of
    ``root_records_of`` (``"onnxruntime"``) where they log on the root logger. Other
    threads keep their output."""
    if verbosity() >= Verbosity.VERBOSE:
        yield
        return
    global _sieve
    ident = threading.get_ident()
    root_filter = _RootRecords(root_records_of, ident)
    logging.getLogger().addFilter(root_filter)
    with _sieve_lock:
        for name in loggers:
            # Only a logger its library made already: one made here would be a plain
            # Logger where the library later asks for its own class (NNCF does).
            named = logging.Logger.manager.loggerDict.get(name)
            if isinstance(named, logging.Logger) and name not in _levels:
                _levels[name] = named.level
                named.setLevel(max(named.getEffectiveLevel(), logging.WARNING))
        if not _silenced:
            _sieve = _Sieve(sys.stdout)
            sys.stdout = _sieve  # type: ignore[assignment]
        _silenced[ident] = _silenced.get(ident, 0) + 1
    try:
        yield
    finally:
        logging.getLogger().removeFilter(root_filter)
        with _sieve_lock:
            _silenced[ident] -= 1
            if not _silenced[ident]:
                del _silenced[ident]
            if not _silenced:
                if _sieve is not None and sys.stdout is _sieve:
                    sys.stdout = _sieve.target
                _sieve = None
                for name, level in _levels.items():
                    logging.getLogger(name).setLevel(level)
                _levels.clear()
