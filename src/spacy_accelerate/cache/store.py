"""On-disk cache of exported models, keyed by a SHA256 of everything that shaped the export.

Exporting a transformer takes tens of seconds to minutes, so the result is kept under
``<cache_dir>/<key>/`` and reused by later processes. The cache is shared between processes
and must survive crashes, so every rule here exists to keep one promise: *a folder that looks
like an entry is either complete and verified, or it is never served*.

- A build writes into ``<cache_dir>/.tmp-<key>-<random>/`` (same filesystem as the target),
  writes ``manifest.json`` last, and only then renames the folder to ``<cache_dir>/<key>``.
  ``os.rename`` of a folder is atomic, so readers see either no entry or a whole one.
- A per-key :class:`filelock.FileLock` in ``<cache_dir>/.locks/`` serialises builders, so
  concurrent processes build once; the ones that waited find the entry and report a hit.
- Every hit is checked against its manifest (size and sha256 of each listed file, key equal
  to the folder name, the files its user needs present, and no file the manifest does not
  list: a runtime loads an unlisted file, external weights say, as readily as a listed one).
  A mismatch means a truncated copy, a crash on a filesystem without ordered writes, or
  tampering: the entry is evicted under its lock and rebuilt.
- Only JSON is ever parsed from the cache; nothing is unpickled or imported from it.
- Keys are validated as 64 lowercase hex characters so a key can never name a path outside
  the cache folder, and file names in a manifest must be plain relative paths for the same
  reason.

Only what the library made is ever removed (:mod:`.ownership`): folders carry its mark
(entries also their manifest), links are never followed, and anything else found in the
cache folder (a user's notes, another tool's files) is left where it is. Nothing is ever
made, locked or written through a link under the root either (the lock folder, a lock
file, a build folder, an entry's place, a derived folder): a link there is a
:class:`CacheError` naming it (:func:`~spacy_accelerate.cache.root.refuse_links`).

Leftover temporary folders (``.tmp-<key>-*``, :mod:`.staging`) come from builds that crashed.
They are never served (their names are not keys) and are removed whenever this process can
hold their key's lock, which proves no build is writing into them: on every cache miss (for
all keys), on :meth:`ModelCache.evict` (for that key) and on :meth:`ModelCache.clear`.
What backends derive from an entry lives beside it (:mod:`.derived`) and goes with it.

This module holds the cache's operations; the manifest (:mod:`.manifest`), the build folders
(:mod:`.staging`), the derived folders (:mod:`.derived`) and the root's rules (:mod:`.root`)
are their own modules.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spacy_accelerate.cache.derived import DerivedFolders, DerivedStore
from spacy_accelerate.cache.lock import KeyLock, lock_file
from spacy_accelerate.cache.manifest import (
    MANIFEST_FORMAT_VERSION,
    MANIFEST_NAME,
    OWNER_MARK,
    CacheEntry,
    CorruptEntry,
    is_own_entry,
    sha256_file,
    verify_entry,
    write_manifest,
)
from spacy_accelerate.cache.ownership import remove_if_empty, remove_tree
from spacy_accelerate.cache.root import (
    CACHE_ENV_VAR,
    KEY_PATTERN,
    LOCK_DIR,
    default_cache_dir,
    make_dirs,
    refuse_links,
    resolve_cache_dir,
    unwritable,
    validate_key,
)
from spacy_accelerate.cache.staging import Staging
from spacy_accelerate.errors import Advice, CacheError
from spacy_accelerate.options.config import DEFAULT_LOCK_TIMEOUT

__all__ = [
    "OWNER_MARK",
    "sha256_file",
    "CACHE_ENV_VAR",
    "MANIFEST_FORMAT_VERSION",
    "MANIFEST_NAME",
    "CacheEntry",
    "CacheResult",
    "ModelCache",
    "default_cache_dir",
    "resolve_cache_dir",
]

logger = logging.getLogger("spacy_accelerate")


@dataclass(frozen=True)
class CacheResult:
    """What :meth:`ModelCache.get_or_build` did, so callers can report export vs. reuse."""

    entry: CacheEntry
    hit: bool
    seconds: float


class ModelCache:
    """Process-safe store of exported model folders.

    Nothing is created on disk until the first build, so merely looking things up in a
    missing or read-only folder never fails.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        self.root: Path = resolve_cache_dir(cache_dir)
        self.lock_timeout = lock_timeout
        self._staging = Staging(self.root, self._lock)
        self._derived = DerivedStore(self.root, lock_timeout)

    def __repr__(self) -> str:
        return f"ModelCache(root={str(self.root)!r})"

    # ---------------------------------------------------------------- public API

    def lookup(self, key: str, required: Iterable[str] = ()) -> CacheEntry | None:
        """The verified entry for ``key`` holding the ``required`` files, or None; a corrupt
        entry is evicted on the way."""
        validate_key(key)
        folder = self.root / key
        if not os.path.lexists(folder):
            return None
        try:
            return verify_entry(folder, key, required)
        except CorruptEntry:
            pass
        try:
            with self._lock(key):
                return self._verified(key, required, evict=True)
        except CacheError as err:
            # Still never served; only the clean-up had to be skipped (e.g. read-only cache).
            logger.warning("Corrupt model cache entry %s not served or evicted: %s", folder, err)
            return None

    def get_or_build(
        self,
        key: str,
        key_inputs: Mapping[str, Any],
        build: Callable[[Path], Mapping[str, Any] | None],
        required: Iterable[str] = (),
    ) -> CacheResult:
        """Return the entry for ``key``, running ``build(tmp_dir)`` only if no valid one exists.

        What ``build`` returns (if anything) is recorded in the manifest under ``built``. An
        entry without every ``required`` file is not valid.

        If ``build`` raises, its exception propagates unchanged and the cache is left as it was.
        """
        start = time.perf_counter()
        validate_key(key)
        required = tuple(required)
        inputs_json = self._inputs_as_json(key_inputs)
        entry = self._verified(key, required, evict=False)  # lock-free: entries never change
        if entry is not None:
            return CacheResult(entry=entry, hit=True, seconds=time.perf_counter() - start)
        self._ensure_root()
        with self._lock(key):
            entry = self._verified(key, required, evict=True)
            if entry is not None:  # another process built it while we waited
                return CacheResult(entry=entry, hit=True, seconds=time.perf_counter() - start)
            self._staging.sweep(locked_key=key)
            entry = self._build_locked(key, inputs_json, build)
        return CacheResult(entry=entry, hit=False, seconds=time.perf_counter() - start)

    def rebuild(
        self,
        stale: CacheEntry,
        key_inputs: Mapping[str, Any],
        build: Callable[[Path], Mapping[str, Any] | None],
        required: Iterable[str] = (),
    ) -> CacheResult:
        """Replace ``stale`` (an entry its user refused: it does not compute what its key
        promises here) by a fresh build, once that build has succeeded: a build that
        fails (the same refusal, say) leaves the entry as it was, for callers whose
        gates it meets. If another process replaced it meanwhile, that entry is returned
        as a hit instead, for the caller to judge in turn."""
        start = time.perf_counter()
        key = validate_key(stale.key)
        required = tuple(required)
        inputs_json = self._inputs_as_json(key_inputs)
        self._ensure_root()
        with self._lock(key):
            current = self._verified(key, required, evict=True)
            if current is not None and current.manifest != stale.manifest:
                return CacheResult(entry=current, hit=True, seconds=time.perf_counter() - start)
            entry = self._build_locked(key, inputs_json, build, replacing=current is not None)
        return CacheResult(entry=entry, hit=False, seconds=time.perf_counter() - start)

    def entries(self) -> list[CacheEntry]:
        """All valid entries, sorted by key.

        Invalid entries are skipped, not evicted: listing is a read-only operation (it also
        works on a read-only cache), and the next lookup or build of that key evicts them.
        Verification hashes every file, so this costs a full read of the cache.
        """
        found: list[CacheEntry] = []
        for key in self._entry_keys():
            try:
                found.append(verify_entry(self.root / key, key))
            except CorruptEntry:
                continue
        return found

    def evict(self, key: str) -> bool:
        """Remove the entry for ``key`` (valid or not) and what was derived from it; True if
        there was an entry. Only what the library made is removed."""
        validate_key(key)
        if not self.root.is_dir():  # the root may be a link: the user chose it
            return False
        with self._lock(key):
            self._staging.remove_of(key)
            self._derived.remove_key(key)
            return self._remove_entry_locked(key)

    def clear(self) -> int:
        """Remove every entry, what was derived from them and the leftovers of crashed
        builds; returns how many entries were removed.

        Only folders the library made go (see :mod:`.ownership`); anything else in the
        cache folder stays, and links are never followed. Lock files stay too: deleting a
        lock file another process waits on would let two processes hold "the same" lock
        on different files.
        """
        if not self.root.is_dir():
            return 0
        keys = set(self._entry_keys()) | self._staging.keys()
        removed = 0
        for key in sorted(keys):
            removed += self.evict(key)
        self._derived.clear()
        return removed

    def derived_dir(
        self, kind: DerivedFolders, key: str, device: str, variant: str | None = None
    ) -> Path | None:
        """The folder of ``kind`` for entry ``key`` on ``device`` (and ``variant``, for a kind
        with variants). Made on demand; None where a real folder found there is not the
        library's: the backend then does without it. A :class:`CacheError` where the cache
        cannot be written, or where that folder or one on the way to it is a link."""
        return self._derived.folder(kind, key, device, variant)

    def shared_dir(self, kind: DerivedFolders, device: str, name: str) -> Path | None:
        """The folder ``name`` of ``kind`` on ``device`` that every key shares (one of
        ``kind.shared``); None and errors as for :meth:`derived_dir`."""
        return self._derived.shared(kind, device, name)

    def derived_lock(self, folder: Path) -> KeyLock:
        """The lock held while what is in a derived ``folder`` is built, checked, loaded or
        removed (a lock file under ``.locks``, never deleted)."""
        return self._derived.lock(folder)

    def size_bytes(self) -> int:
        """Total bytes of every file under the cache folder, leftovers included, a file
        linked into several entries (OpenVINO's fp32 and bf16 IR) counted once."""
        sizes: dict[tuple[int, int], int] = {}
        for dirpath, _dirnames, filenames in os.walk(self.root):
            for filename in filenames:
                try:
                    st = os.lstat(os.path.join(dirpath, filename))
                except OSError:
                    continue  # removed while we walked
                sizes[(st.st_dev, st.st_ino)] = st.st_size
        return sum(sizes.values())

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def _inputs_as_json(key_inputs: Mapping[str, Any]) -> Any:
        """Fail before the (slow) build if the inputs cannot be recorded in the manifest."""
        try:
            return json.loads(json.dumps(dict(key_inputs), sort_keys=True, allow_nan=False))
        except (TypeError, ValueError) as err:
            raise TypeError(f"key_inputs must be JSON-serialisable: {err}") from None

    def _verified(
        self, key: str, required: Iterable[str] = (), *, evict: bool
    ) -> CacheEntry | None:
        """The verified entry, or None. A corrupt one is evicted when ``evict`` (the caller
        holds the key's lock), and only reported otherwise: the lock-free path of a hit
        decides nothing, since a complete entry cannot change under it (writes rename)."""
        folder = self.root / key
        if not os.path.lexists(folder):
            return None
        try:
            return verify_entry(folder, key, required)
        except CorruptEntry as why:
            if evict:
                if not self._remove_entry_locked(key) and os.path.lexists(folder):
                    logger.warning(
                        "Model cache entry %s is not valid (%s) and was not made by "
                        "spacy-accelerate, so it is left alone and not served.",
                        folder,
                        why,
                    )
                    return None
                logger.warning(
                    "Evicted corrupt model cache entry %s (%s); it will be rebuilt when next "
                    "needed.",
                    folder,
                    why,
                )
            return None

    def _remove_entry_locked(self, key: str) -> bool:
        """Remove the library's folder at ``key``'s place; True if there was one. Renamed
        away first so no reader ever sees a half-deleted entry."""
        folder = self.root / key
        if not is_own_entry(folder, key):
            remove_if_empty(self.root, folder)  # an empty folder holds nothing of anyone's
            return False
        trash = self._staging.trash(key)
        try:
            os.rename(folder, trash)
        except OSError:
            remove_tree(self.root, folder)
            return True
        remove_tree(self.root, trash)
        return True

    def _build_locked(
        self,
        key: str,
        inputs_json: Any,
        build: Callable[[Path], Mapping[str, Any] | None],
        *,
        replacing: bool = False,
    ) -> CacheEntry:
        """Build into a temporary folder and rename it into place; ``replacing``: the
        library's entry there goes only once the build has succeeded. A link at the entry's
        place is refused by name, anything else there the library did not make as such."""
        target = self.root / key
        refuse_links(self.root, target)
        if os.path.lexists(target) and not (replacing and is_own_entry(target, key)):
            raise CacheError(
                f"cannot store the model at {target}: something there was not made by "
                "spacy-accelerate. Move it away, or set ",
                Advice("cache_dir", ...),
                f" (or the {CACHE_ENV_VAR} environment variable) to another folder.",
            )
        tmp = self._staging.make(key)
        try:
            built = build(tmp)
            manifest = write_manifest(tmp, key, inputs_json, built)
            if replacing:
                self._remove_entry_locked(key)
            try:
                os.rename(tmp, target)
            except OSError as err:
                raise unwritable(self.root, err) from err
        except BaseException:
            remove_tree(self.root, tmp)
            raise
        return CacheEntry(key=key, path=target, manifest=manifest)

    def _ensure_root(self) -> None:
        """Make the root and its lock folder before a build, so that an unwritable cache,
        or a link at the lock folder, is said before anything else is tried."""
        make_dirs(self.root, self.root / LOCK_DIR)

    def _lock(self, key: str) -> KeyLock:
        return lock_file(self.root, key, self.lock_timeout)

    def _entry_keys(self) -> list[str]:
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        return sorted(name for name in names if KEY_PATTERN.fullmatch(name))
