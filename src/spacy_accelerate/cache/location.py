"""Where a pickled pipeline finds its cache on the machine it is unpickled on.

A pipeline pickled for a worker process records where its entry was; the process that
unpickles it may have no such folder, or keep its cache elsewhere. It looks for the
entry (by its key) in the recorded folder, the ``SPACY_ACCELERATE_CACHE`` environment
variable's and the platform's default (``~/.cache/spacy-accelerate``), and only builds (or
falls back to PyTorch) where none has it: in the recorded folder if it still works here
(:func:`usable`), else the environment's or the default.

A pipeline saved with ``to_disk`` records no folder: where it loads, its cache is the
caller's (:func:`spacy_accelerate.pipeline.persist.callers_request`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from spacy_accelerate.cache.ownership import is_real_dir
from spacy_accelerate.cache.root import (
    CACHE_ENV_VAR,
    KEY_PATTERN,
    default_cache_dir,
    resolve_cache_dir,
)


def usable(folder: Path) -> bool:
    """Whether a recorded cache folder still works here: a folder this process can write
    into, or a read-only one that holds entries (a cache built ahead of time and mounted
    read-only), or one that can be made (its nearest existing parent takes a folder).
    Tried for real, not by permission bits: ``os.access`` says yes to root everywhere."""
    if folder.exists():
        if not folder.is_dir():
            return False
        if _writable(folder):
            return True
        try:
            return any(KEY_PATTERN.fullmatch(name) for name in os.listdir(folder))
        except OSError:
            return False
    parent = folder.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return is_real_dir(parent) and _writable(parent)


def _writable(folder: Path) -> bool:
    """Whether a folder can be made in ``folder`` (made and removed at once)."""
    try:
        probe = tempfile.mkdtemp(prefix=".spacy-accelerate-probe-", dir=folder)
    except OSError:
        return False
    os.rmdir(probe)
    return True


def _from_env() -> Path | None:
    return default_cache_dir() if os.environ.get(CACHE_ENV_VAR, "").strip() else None


def saved_cache_dir(override: str | os.PathLike[str] | None, recorded: str | None) -> Path:
    """The cache a pickled pipeline builds in (see the module's docstring): ``override``,
    else ``recorded`` where it works here, else the environment's or the default."""
    if override is not None:
        return resolve_cache_dir(override)
    if recorded is not None and usable(Path(recorded)):
        return Path(recorded)
    return _from_env() or default_cache_dir()


def search_order(recorded: Path) -> list[Path]:
    """The folders a pickled pipeline looks for its entry in, in order, without repeats."""
    found: list[Path] = []
    for folder in (recorded, _from_env(), default_cache_dir()):
        if folder is not None and folder not in found:
            found.append(folder)
    return found
