"""Stopping the library's helper thread, promptly, also inside a runtime call.

An overlapped ``nlp.pipe`` (:mod:`spacy_accelerate.serving.overlap`) runs the transformer
components of a whole batch in a helper thread. When the caller stops early (a generator
closed, Ctrl-C, an error behind, the process ending), waiting for that batch would keep the
caller waiting for seconds, and a helper still inside a runtime's C++ call when the
interpreter finalizes aborts the process (``std::terminate``, exit status 134). So:

- the helper runs its work in :func:`cancellable` with a :class:`StopSignal`;
- the proxies call :func:`check` before each call into the runtime, which ends the
  helper's work with :class:`Cancelled` once the signal is set;
- each backend wraps its runtime call in :func:`runtime_call` with the runtime's own way to
  abort a call in flight (ONNX Runtime's ``RunOptions.terminate``, OpenVINO's
  ``InferRequest.cancel``): setting the signal aborts it, and the runtime's error
  becomes :class:`Cancelled`.

Threads that were never made cancellable (the caller's) are never stopped, and their
runtime calls run exactly as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Cancelled(Exception):
    """The helper thread was told to stop; never reaches the caller."""


class StopSignal:
    """Tells one helper's work to stop, from any thread, aborting the runtime call it is in."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._aborts: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        """Stop: the work ends at its next :func:`check`, and the runtime calls in flight
        are aborted (idempotent)."""
        with self._lock:
            self._event.set()
            aborts = list(self._aborts)
        for abort in aborts:
            abort()

    @contextmanager
    def aborting(self, abort: Callable[[], None]) -> Iterator[None]:
        """Call ``abort`` if the signal is set while the block runs (one runtime call);
        :class:`Cancelled` at once where it is set already."""
        with self._lock:
            if self._event.is_set():
                raise Cancelled()
            self._aborts.append(abort)
        try:
            yield
        finally:
            with self._lock:
                self._aborts.remove(abort)


_LOCAL = threading.local()


def _current() -> StopSignal | None:
    stop: StopSignal | None = getattr(_LOCAL, "stop", None)
    return stop


@contextmanager
def cancellable(stop: StopSignal) -> Iterator[None]:
    """Let :func:`check` and :func:`runtime_call`, in this thread, end the block's work once
    ``stop`` is set."""
    previous = _current()
    _LOCAL.stop = stop
    try:
        yield
    finally:
        _LOCAL.stop = previous


def is_cancellable() -> bool:
    """Whether this thread's work runs in :func:`cancellable` (a helper of the library's)."""
    return _current() is not None


def check() -> None:
    """Raise :class:`Cancelled` where this thread's work was told to stop."""
    stop = _current()
    if stop is not None and stop.is_set():
        raise Cancelled()


@contextmanager
def runtime_call(abort: Callable[[], None]) -> Iterator[None]:
    """One call into a runtime, which ``abort`` (from another thread) makes return early
    with the runtime's own error: in a cancellable thread, setting its signal calls
    ``abort``, and the error the call then raises becomes :class:`Cancelled`. Elsewhere
    the block runs as it is."""
    stop = _current()
    if stop is None:
        yield
        return
    with stop.aborting(abort):
        try:
            yield
        except Exception:
            if stop.is_set():
                raise Cancelled() from None
            raise
