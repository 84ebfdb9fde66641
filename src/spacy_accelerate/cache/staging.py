"""Where a build writes before its entry exists, and how the leftovers of crashed builds go.

A build writes into ``<cache_dir>/.tmp-<key>-<random>/``, on the same filesystem as its
entry, so that the final ``os.rename`` into ``<cache_dir>/<key>`` is atomic: readers see no
entry or a whole one. An eviction renames the entry to ``.tmp-<key>-evicted-<random>``
before deleting it, for the same reason. Such folders are never served (their names are
not keys). One that outlives its process came from a crash; it is removed once this
process holds its key's lock, which proves that no build still writes into it. A link at a
build folder's name is refused (:func:`~spacy_accelerate.cache.root.refuse_links`); one at
a leftover's is left where it is, never followed.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path

from spacy_accelerate.cache.lock import KeyLock
from spacy_accelerate.cache.manifest import is_own_entry
from spacy_accelerate.cache.ownership import (
    is_marked,
    is_real_dir,
    remove_if_empty,
    remove_tree,
    write_mark,
)
from spacy_accelerate.cache.root import KEY_PATTERN, refuse_links, unwritable

TMP_PREFIX = ".tmp-"
#: A temporary folder's name: the prefix, its entry's key, a dash, then anything.
_TEMP_NAME = re.compile(f"{re.escape(TMP_PREFIX)}({KEY_PATTERN.pattern})-")


def key_of_temp(name: str) -> str | None:
    """The key a temporary folder belongs to, or None for names the library did not make."""
    found = _TEMP_NAME.match(name)
    return found.group(1) if found else None


def _remove_own_temp(root: Path, path: Path) -> None:
    """Remove a build's leftover folder if the library made it; an empty one either way
    (a build killed between making the folder and marking it leaves it empty)."""
    if is_marked(path) or is_own_entry(path, key_of_temp(path.name) or ""):
        remove_tree(root, path)
    else:
        remove_if_empty(root, path)


class Staging:
    """The temporary folders of one cache root; ``lock(key)`` is that key's entry lock."""

    def __init__(self, root: Path, lock: Callable[[str], KeyLock]) -> None:
        self.root = root
        self._lock = lock

    def make(self, key: str) -> Path:
        """A fresh, marked build folder for ``key``, beside where its entry will be; a
        :class:`CacheError` where a link has its name (``mkdir`` would refuse it anyway, but
        saying so tells the user what to remove)."""
        tmp = self.root / f"{TMP_PREFIX}{key}-{secrets.token_hex(8)}"
        refuse_links(self.root, tmp)
        try:
            tmp.mkdir()
            write_mark(tmp, "entry")
        except OSError as err:
            remove_tree(self.root, tmp)
            raise unwritable(self.root, err) from err
        return tmp

    def trash(self, key: str) -> Path:
        """Where an evicted entry is renamed before it is deleted."""
        return self.root / f"{TMP_PREFIX}{key}-evicted-{secrets.token_hex(4)}"

    def folders(self) -> list[Path]:
        """The leftovers of builds and evictions: named after a key, real folders."""
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        return [
            self.root / name
            for name in sorted(names)
            if key_of_temp(name) is not None and is_real_dir(self.root / name)
        ]

    def keys(self) -> set[str]:
        """The keys that have leftovers."""
        return {key for path in self.folders() if (key := key_of_temp(path.name))}

    def remove_of(self, key: str) -> None:
        """Remove ``key``'s leftovers; the caller holds its lock, so no build writes there."""
        for path in self.folders():
            if key_of_temp(path.name) == key:
                _remove_own_temp(self.root, path)

    def sweep(self, locked_key: str) -> None:
        """Remove crashed builds' leftovers: ``locked_key``'s (the caller holds its lock),
        and other keys' where their lock is free now."""
        for path in self.folders():
            temp_key = key_of_temp(path.name)
            if temp_key == locked_key:
                _remove_own_temp(self.root, path)
                continue
            lock = self._lock(str(temp_key))
            if not lock.try_acquire():
                continue  # a live build holds it, or we cannot tell: leave it alone
            try:
                _remove_own_temp(self.root, path)
            finally:
                lock.release()
