"""The inter-process locks of the model cache, and what a process waiting on one is told.

One :class:`filelock.FileLock` per key (and per derived folder) serialises builders across
processes. A lock can be held for minutes (an int8 calibration, a TensorRT engine), so a
waiter must not look hung: after :data:`NOTICE_AFTER` seconds it logs at INFO which lock it
waits on and who holds it, and again every :data:`REMIND_EVERY` seconds. The holder is known
from a small record written beside the lock file once it is held (``<lock>.owner``: pid, host,
since), removed before it is released. filelock truncates the lock file itself on every
attempt, so the record cannot live inside it.

Lock files are never deleted: removing a lock file another process waits on would let two
processes hold "the same" lock on different files. Neither the lock folder nor a lock file
is ever reached through a link (:func:`~spacy_accelerate.cache.root.refuse_links`): a link
there would put lock files and holders' records outside the cache.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import filelock

from spacy_accelerate.cache.root import LOCK_DIR, make_dirs, refuse_links, unwritable
from spacy_accelerate.cache.untrusted import CorruptEntry, read_json_object
from spacy_accelerate.errors import Advice, CacheError, spelled

logger = logging.getLogger("spacy_accelerate")

#: Seconds of waiting before a waiter says so (INFO), then the interval of its reminders.
NOTICE_AFTER = 3.0
REMIND_EVERY = 60.0

OWNER_SUFFIX = ".owner"


@dataclass(frozen=True)
class LockHolder:
    """Who recorded holding a lock."""

    pid: int
    host: str
    since: str

    def describe(self) -> str:
        here = self.host == socket.gethostname()
        where = "this machine" if here else f"host {self.host}"
        alive = "" if not here or _pid_alive(self.pid) else ", no longer running"
        return f"pid {self.pid} on {where} since {self.since}{alive}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, but not ours to signal
        return True
    return True


def read_holder(lock_path: Path) -> LockHolder | None:
    """The recorded holder of the lock at ``lock_path``, or None where nothing is recorded."""
    try:
        record = read_json_object(Path(f"{lock_path}{OWNER_SUFFIX}"))
        return LockHolder(pid=int(record["pid"]), host=str(record["host"]), since=record["since"])
    except (OSError, ValueError, KeyError, TypeError, CorruptEntry):
        return None


class KeyLock:
    """A per-key inter-process lock that reports failures as :class:`CacheError`, says
    when it waits, and records its holder while it is held."""

    def __init__(self, path: Path, timeout: float, root: Path) -> None:
        self.path = path
        self._timeout = timeout
        self._root = root
        self._lock = filelock.FileLock(str(path), timeout=timeout)
        self._owner = Path(f"{path}{OWNER_SUFFIX}")

    def _acquire(self) -> None:
        start = time.monotonic()
        deadline = start + self._timeout
        step = NOTICE_AFTER
        while True:
            remaining = deadline - time.monotonic()
            try:
                self._lock.acquire(timeout=max(0.0, min(step, remaining)))
                return
            except filelock.Timeout:
                if time.monotonic() >= deadline:
                    raise
            holder = read_holder(self.path)
            logger.info(
                "spacy-accelerate: waiting %.0f s so far for the cache lock %s, held by %s "
                "(another process is building or removing this model; giving up after %g s, "
                "%s)",
                time.monotonic() - start,
                self.path,
                holder.describe() if holder else "a process that did not record itself",
                self._timeout,
                spelled([Advice("lock_timeout")]),
            )
            step = REMIND_EVERY

    def __enter__(self) -> KeyLock:
        make_dirs(self._root, self.path.parent)  # never through a link, nor the lock file
        refuse_links(self._root, self.path)
        try:
            self._acquire()
        except filelock.Timeout:
            holder = read_holder(self.path)
            raise CacheError(
                f"timed out after {self._timeout:g} s waiting for the cache lock {self.path}, "
                f"held by {holder.describe() if holder else 'another process'}, which is still "
                "building or removing this model. Wait for it, or pass a larger ",
                Advice("lock_timeout"),
                ".",
            ) from None
        except OSError as err:
            raise unwritable(self._root, err) from err
        self._record()
        return self

    def _record(self) -> None:
        """Write who holds the lock beside it (``<lock>.owner``), for the notices of
        processes that wait on it; the temporary file is opened without following a link
        at its name, so that the record lands in the lock folder and nowhere else."""
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        temporary = self._owner.with_name(f".{self._owner.name}.{os.getpid()}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        try:  # never written through a link planted at its name
            with os.fdopen(os.open(temporary, flags, 0o644), "w", encoding="utf8") as handle:
                handle.write(json.dumps(record))
            os.replace(temporary, self._owner)
        except OSError:  # only a courtesy to waiters: never a reason to fail
            pass

    def __exit__(self, *_exc: object) -> None:
        try:
            self._owner.unlink()
        except OSError:
            pass
        self._lock.release()

    def try_acquire(self) -> bool:
        """Take the lock only if it is free now (no waiting, no record); True if taken.
        A :class:`CacheError` where the lock file or its folder is a link."""
        refuse_links(self._root, self.path)
        try:
            self._lock.acquire(blocking=False)
        except (filelock.Timeout, OSError):
            return False
        return True

    def release(self) -> None:
        self._lock.release()


def lock_file(root: Path, name: str, timeout: float) -> KeyLock:
    """The lock ``<root>/.locks/<name>.lock``. Lock files are never deleted: removing one
    another process waits on would hand out the same lock twice."""
    return KeyLock(root / LOCK_DIR / f"{name}.lock", timeout, root)
