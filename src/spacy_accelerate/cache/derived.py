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
"""

from __future__ import annotations

from dataclasses import dataclass

from spacy_accelerate.errors import CacheError


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
