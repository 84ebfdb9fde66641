"""Stopping the library's helper thread between two runtime calls.

An overlapped ``nlp.pipe`` (:mod:`.overlap`) runs the transformer components of a whole
batch in a helper thread. When the caller stops early (a generator closed, Ctrl-C, an
error behind), waiting for that batch would keep the caller waiting for seconds; the
proxies instead check, before each call into the runtime, whether the thread they run in
was told to stop (:func:`check`), and end its work with :class:`Cancelled`, which the
helper catches. Threads that were never made cancellable (the caller's) are never
stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Cancelled(Exception):
    """The helper thread was told to stop; never reaches the caller."""


_LOCAL = threading.local()


@contextmanager
def cancellable(stop: threading.Event) -> Iterator[None]:
    """Let :func:`check`, in this thread, end the block's work once ``stop`` is set."""
    previous = getattr(_LOCAL, "stop", None)
    _LOCAL.stop = stop
    try:
        yield
    finally:
        _LOCAL.stop = previous


def check() -> None:
    """Raise :class:`Cancelled` where this thread's work was told to stop."""
    stop = getattr(_LOCAL, "stop", None)
    if stop is not None and stop.is_set():
        raise Cancelled()
