"""Derived folders: what a backend makes from a cache entry and keeps beside it.

Compiled engines and blobs are derived data: rebuilt from the entry's model when
missing, valid only on the device and runtime release that made them. They never live
inside an entry (whose files are checksummed and immutable) but under
``<cache_dir>/<name>/<device>/<key>/``, one folder per device and key, optionally one
folder per variant below the key (builder settings, say), and go when the entry is
evicted or the cache cleared. A backend describes its folders with a
:class:`DerivedFolders` and registers it (the provider registry does, for every
backend, when it is imported; importing any part of ``spacy_accelerate`` imports it,
through the package's ``__init__``), so the cache removes them without knowing any backend
by name.

Derived folders have their unrecorded files deleted by the backends that fill them, so a
folder that is not the library's (a user's) is never handed out as one, and a link at one,
or on the way to one, is a :class:`CacheError` (the backends then do without the folder).
"""

from __future__ import annotations

import logging
import stat
from dataclasses import dataclass
from pathlib import Path

from spacy_accelerate.cache.lock import KeyLock, lock_file
from spacy_accelerate.cache.ownership import (
    is_marked,
    is_real_dir,
    make_owned_dir,
    real_subdirs,
    remove_if_empty,
    remove_tree,
)
from spacy_accelerate.cache.root import KEY_PATTERN, validate_key
from spacy_accelerate.errors import CacheError

logger = logging.getLogger("spacy_accelerate")


@dataclass(frozen=True)
class DerivedFolders:
    """One backend's derived folders under ``<cache_dir>/<name>/``."""

    #: The folder under the cache root (one per backend).
    name: str
    #: The mark written into each folder the library makes (what made it, for people).
    label: str
    #: One folder per variant below each key, each locked on its own; otherwise the key's
    #: folder is the unit (locked and removed whole).
    variants: bool = False
    #: Per-device folders shared by every key (a timing cache, say), with their marks.
    shared: tuple[tuple[str, str], ...] = ()
    #: A file whose presence says a key folder is the library's even without the mark
    #: (folders written by releases before the mark).
    legacy_record: str | None = None


_REGISTERED: dict[str, DerivedFolders] = {}


def register(folders: DerivedFolders) -> None:
    """Make the cache remove ``folders`` with the entries they derive from (idempotent)."""
    known = _REGISTERED.get(folders.name)
    if known is not None and known != folders:
        raise CacheError(f"Two kinds of derived folders claim {folders.name!r} in the cache.")
    _REGISTERED[folders.name] = folders


def registered() -> tuple[DerivedFolders, ...]:
    """Every registered kind, by name."""
    return tuple(_REGISTERED[name] for name in sorted(_REGISTERED))


def _is_own_derived(kind: DerivedFolders, folder: Path) -> bool:
    """A key's derived folder made by the library: marked, or (folders of the release
    before the mark) holding the kind's legacy record."""
    if is_marked(folder):
        return True
    if kind.legacy_record is None:
        return False
    try:
        return is_real_dir(folder) and stat.S_ISREG((folder / kind.legacy_record).lstat().st_mode)
    except OSError:
        return False


class DerivedStore:
    """The derived folders of one cache root: made on demand, locked, removed with their
    entry (see the module's docstring)."""

    def __init__(self, root: Path, lock_timeout: float) -> None:
        self.root = root
        self.lock_timeout = lock_timeout

    def folder(
        self, kind: DerivedFolders, key: str, device: str, variant: str | None = None
    ) -> Path | None:
        """The folder of ``kind`` for entry ``key`` on ``device`` (and ``variant``, for a kind
        with variants), made on demand; None where a real folder there is not the library's,
        a :class:`CacheError` where a link is on the way or the folder cannot be made."""
        validate_key(key)
        folder = self.root / kind.name / device / key
        return self._made(folder / variant if variant else folder, kind.label)

    def shared(self, kind: DerivedFolders, device: str, name: str) -> Path | None:
        """The folder ``name`` of ``kind`` on ``device`` that every key shares (one of
        ``kind.shared``); None as for :meth:`folder`."""
        labels = dict(kind.shared)
        if name not in labels:
            raise ValueError(f"{name!r} is not a shared folder of {kind.name!r}")
        return self._made(self.root / kind.name / device / name, labels[name])

    def lock(self, folder: Path) -> KeyLock:
        """The lock held while what is in ``folder`` is built, checked, loaded or removed,
        named by the folder's path under the root (``<name>-<device>-<key>[-<variant>]``)."""
        name = "-".join(folder.relative_to(self.root).parts)
        return lock_file(self.root, name, self.lock_timeout)

    def remove_key(self, key: str) -> None:
        """Remove every kind's folders of ``key``, on every device."""
        for kind in registered():
            for device in real_subdirs(self.root, self.root / kind.name):
                self._remove(kind, device / key)

    def clear(self) -> None:
        """Remove every key's folders of every kind (keys without an entry included) and the
        shared folders; nothing else."""
        for kind in registered():
            base = self.root / kind.name
            for device in real_subdirs(self.root, base):
                for child in real_subdirs(self.root, device):
                    if KEY_PATTERN.fullmatch(child.name):
                        self._remove(kind, child)
                for name, _label in kind.shared:
                    if is_marked(device / name):
                        remove_tree(self.root, device / name)
                remove_if_empty(self.root, device)
            remove_if_empty(self.root, base)

    def _made(self, folder: Path, kind: str) -> Path | None:
        """``folder`` made and marked, or found made by the library; None (said at WARNING)
        where a real folder there is someone else's. A :class:`CacheError` where a link is
        on the way to it or it cannot be made."""
        made = make_owned_dir(self.root, folder, kind)
        if made is None:
            logger.warning(
                "spacy-accelerate: not using %s for %s: spacy-accelerate did not make it (or "
                "something other than a folder is there); it is left as it is.",
                folder,
                kind,
            )
        return made

    def _remove(self, kind: DerivedFolders, folder: Path) -> None:
        """Remove one key's folder on one device, each unit under its lock. A variant made
        meanwhile stays, for its entry's next build."""
        if kind.variants:
            for variant in real_subdirs(self.root, folder):
                if is_marked(variant):
                    with self.lock(variant):
                        remove_tree(self.root, variant)
            remove_if_empty(self.root, folder)
        elif _is_own_derived(kind, folder):
            with self.lock(folder):
                remove_tree(self.root, folder)
