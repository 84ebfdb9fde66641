"""On-disk cache of exported ONNX models, keyed by a SHA256 of everything that shaped the export.

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
  to the folder name). A mismatch means a truncated copy, a crash on a filesystem without
  ordered writes, or tampering: the entry is evicted under its lock and rebuilt.
- Only JSON is ever parsed from the cache; nothing is unpickled or imported from it.
- Keys are validated as 64 lowercase hex characters so a key can never name a path outside
  the cache folder, and file names in a manifest must be plain relative paths for the same
  reason.

Leftover temporary folders (``.tmp-*``) come from builds that crashed. They are never served
(their names are not keys) and are removed whenever this process can hold their key's lock,
which proves no build is writing into them: on every cache miss (for all keys), on
:meth:`ModelCache.evict` (for that key) and on :meth:`ModelCache.clear`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

import filelock
import platformdirs

from ._version import __version__
from .errors import CacheError

__all__ = [
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

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT_VERSION = 1
CACHE_ENV_VAR = "SPACY_ACCELERATE_CACHE"

_APP_NAME = "spacy-accelerate"
_KEY_PATTERN = re.compile(r"[0-9a-f]{64}")
_TMP_PREFIX = ".tmp-"
_LOCK_DIR = ".locks"
#: TensorRT's engines and timing caches, per GPU and onnxruntime build (see session_layout).
ENGINE_DIR = "tensorrt"
#: OpenVINO's compiled blobs, per CPU model and OpenVINO release, then per key.
COMPILED_DIR = "openvino"
_HASH_CHUNK = 1024 * 1024


# --------------------------------------------------------------------------- locations


def default_cache_dir() -> Path:
    """The folder used when no ``cache_dir`` is given.

    Read at call time, not import time, so the environment variable can be changed by a
    launcher or a test after the package was imported.
    """
    from_env = os.environ.get(CACHE_ENV_VAR, "").strip()
    if from_env:
        return Path(from_env).expanduser().absolute()
    return Path(platformdirs.user_cache_dir(_APP_NAME)).absolute()


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """An explicit argument wins over the environment, which wins over the platform default."""
    if cache_dir is None:
        return default_cache_dir()
    return Path(os.fspath(cache_dir)).expanduser().absolute()


def _validate_key(key: str) -> str:
    """Reject anything but 64 lowercase hex so a key can never climb out of the cache folder."""
    if not isinstance(key, str) or not _KEY_PATTERN.fullmatch(key):
        raise ValueError(
            f"invalid cache key {key!r}: expected a SHA256 hex digest "
            "(64 lowercase characters 0-9a-f)"
        )
    return key


def _safe_relative(name: str) -> PurePosixPath:
    """Parse a manifest file name, refusing anything that could point outside the entry."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        raise ValueError(f"unsafe file name {name!r}")
    rel = PurePosixPath(name)
    if rel.is_absolute() or any(part in ("", ".", "..") for part in rel.parts):
        raise ValueError(f"unsafe file name {name!r}")
    if str(rel) != name:
        raise ValueError(f"file name {name!r} is not in normal form")
    return rel


# --------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class CacheEntry:
    """A verified cache entry: its files matched the manifest when it was looked up."""

    key: str
    path: Path
    manifest: Mapping[str, Any]

    def file(self, name: str) -> Path:
        """Path of a listed file; unlisted names raise so callers never read unverified data."""
        if name not in self.manifest["files"]:
            raise KeyError(f"{name!r} is not a file of cache entry {self.key}")
        return self.path.joinpath(*_safe_relative(name).parts)

    @property
    def size_bytes(self) -> int:
        """Disk use of the entry, counting the manifest so totals match what ``du`` sees."""
        listed = sum(int(info["size"]) for info in self.manifest["files"].values())
        try:
            manifest_size = (self.path / MANIFEST_NAME).stat().st_size
        except OSError:
            manifest_size = 0
        return listed + manifest_size

    @property
    def created(self) -> str:
        """When the entry was built (UTC, ISO 8601), useful to spot stale exports."""
        return str(self.manifest["created"])


@dataclass(frozen=True)
class CacheResult:
    """What :meth:`ModelCache.get_or_build` did, so callers can report export vs. reuse."""

    entry: CacheEntry
    hit: bool
    seconds: float


class _CorruptEntry(Exception):
    """Internal: an entry folder exists but must not be served; the message says why."""


# --------------------------------------------------------------------------- hashing


def sha256_file(path: Path) -> str:
    """Stream the file so multi-GB models are never read into memory at once."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- verification


def _read_manifest(folder: Path) -> dict[str, Any]:
    manifest_path = folder / MANIFEST_NAME
    try:
        raw = manifest_path.read_bytes()
    except FileNotFoundError:
        raise _CorruptEntry("manifest.json is missing") from None
    except OSError as err:
        raise _CorruptEntry(f"manifest.json cannot be read ({err})") from None
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _CorruptEntry(f"manifest.json is not valid JSON ({err})") from None
    if not isinstance(manifest, dict):
        raise _CorruptEntry("manifest.json is not a JSON object")
    return manifest


def _check_manifest_fields(manifest: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """Check the manifest's shape; returns its ``files`` table."""
    version = manifest.get("format_version")
    if version != MANIFEST_FORMAT_VERSION:
        raise _CorruptEntry(f"manifest format version {version!r} is not supported")
    if manifest.get("key") != key:
        raise _CorruptEntry(f"manifest key {manifest.get('key')!r} differs from the folder name")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise _CorruptEntry("manifest lists no files")
    for name, info in files.items():
        try:
            _safe_relative(name)
        except ValueError as err:
            raise _CorruptEntry(f"manifest lists an {err}") from None
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("size"), int)
            or not isinstance(info.get("sha256"), str)
        ):
            raise _CorruptEntry(f"manifest record of {name!r} is malformed")
    return files


def _check_sizes(folder: Path, files: Mapping[str, Any]) -> None:
    """Cheap pass first, so a truncated multi-GB file is caught before any hashing."""
    for name, info in files.items():
        path = folder.joinpath(*PurePosixPath(name).parts)
        try:
            st = path.lstat()
        except FileNotFoundError:
            raise _CorruptEntry(f"{name} is missing") from None
        except OSError as err:
            raise _CorruptEntry(f"{name} cannot be read ({err})") from None
        if not stat.S_ISREG(st.st_mode):
            raise _CorruptEntry(f"{name} is not a regular file")
        if st.st_size != info["size"]:
            raise _CorruptEntry(
                f"{name} has {st.st_size} bytes, the manifest records {info['size']}"
            )


def _check_hashes(folder: Path, files: Mapping[str, Any]) -> None:
    for name, info in files.items():
        path = folder.joinpath(*PurePosixPath(name).parts)
        try:
            actual = sha256_file(path)
        except OSError as err:
            raise _CorruptEntry(f"{name} cannot be read ({err})") from None
        if actual != info["sha256"]:
            raise _CorruptEntry(f"{name} does not match its recorded sha256")


def _verify(folder: Path, key: str) -> CacheEntry:
    """Return the entry in ``folder`` or raise :class:`_CorruptEntry` saying what is wrong."""
    try:
        st = folder.lstat()
    except OSError as err:
        raise _CorruptEntry(f"entry cannot be read ({err})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise _CorruptEntry("entry is not a folder")
    manifest = _read_manifest(folder)
    files = _check_manifest_fields(manifest, key)
    _check_sizes(folder, files)
    _check_hashes(folder, files)
    return CacheEntry(key=key, path=folder, manifest=manifest)


# --------------------------------------------------------------------------- building


def _collect_files(folder: Path) -> Iterator[tuple[str, Path]]:
    """Every file the builder wrote, as (manifest name, path), in a stable order."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        base = Path(dirpath)
        for entry_name in [*dirnames, *filenames]:
            if (base / entry_name).is_symlink():
                # A link could make a verified entry read data from outside the cache.
                raise CacheError(f"the model builder created a symbolic link {base / entry_name}")
        for filename in sorted(filenames):
            path = base / filename
            yield path.relative_to(folder).as_posix(), path


def _describe_files(folder: Path) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for name, path in _collect_files(folder):
        if name == MANIFEST_NAME:
            raise CacheError(
                f"the model builder wrote a file named {MANIFEST_NAME}, which is reserved"
            )
        files[name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    if not files:
        raise CacheError(f"the model builder wrote no files into {folder}")
    return files


def _remove_if_empty(folder: Path) -> None:
    """Remove ``folder`` when nothing is left in it (another process may be adding)."""
    try:
        folder.rmdir()
    except OSError:
        pass


def _remove_path(path: Path) -> None:
    """Remove a file, link or folder; missing is fine because another process may have won."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


def _key_of_temp(name: str) -> str | None:
    """Key a temp folder belongs to, or None for names we did not create."""
    if not name.startswith(_TMP_PREFIX):
        return None
    candidate = name[len(_TMP_PREFIX) : len(_TMP_PREFIX) + 64]
    rest = name[len(_TMP_PREFIX) + 64 :]
    if _KEY_PATTERN.fullmatch(candidate) and rest.startswith("-"):
        return candidate
    return None


def _unwritable(path: Path, err: OSError) -> CacheError:
    reason = err.strerror or str(err)
    return CacheError(
        f"cannot create or write the model cache folder {path} ({reason}); set cache_dir= or "
        f"the {CACHE_ENV_VAR} environment variable to a writable folder"
    )


# --------------------------------------------------------------------------- the cache


class ModelCache:
    """Process-safe store of exported model folders.

    Nothing is created on disk until the first build, so merely looking things up in a
    missing or read-only folder never fails.
    """

    def __init__(
        self, cache_dir: str | os.PathLike[str] | None = None, *, lock_timeout: float = 3600.0
    ) -> None:
        self.root: Path = resolve_cache_dir(cache_dir)
        self.lock_timeout = lock_timeout

    def __repr__(self) -> str:
        return f"ModelCache(root={str(self.root)!r})"

    # ---------------------------------------------------------------- public API

    def lookup(self, key: str) -> CacheEntry | None:
        """The verified entry for ``key``, or None; a corrupt entry is evicted on the way."""
        _validate_key(key)
        folder = self.root / key
        if not os.path.lexists(folder):
            return None
        try:
            return _verify(folder, key)
        except _CorruptEntry:
            pass
        try:
            with self._lock(key):
                return self._lookup_locked(key)
        except CacheError as err:
            # Still never served; only the clean-up had to be skipped (e.g. read-only cache).
            logger.warning("Corrupt model cache entry %s not served or evicted: %s", folder, err)
            return None

    def get_or_build(
        self,
        key: str,
        key_inputs: Mapping[str, Any],
        build: Callable[[Path], Mapping[str, Any] | None],
    ) -> CacheResult:
        """Return the entry for ``key``, running ``build(tmp_dir)`` only if no valid one exists.

        What ``build`` returns (if anything) is recorded in the manifest under ``built``.

        If ``build`` raises, its exception propagates unchanged and the cache is left as it was.
        """
        start = time.perf_counter()
        _validate_key(key)
        inputs_json = self._inputs_as_json(key_inputs)
        entry = self._peek(key)
        if entry is not None:
            return CacheResult(entry=entry, hit=True, seconds=time.perf_counter() - start)
        self._ensure_root()
        with self._lock(key):
            entry = self._lookup_locked(key)
            if entry is not None:  # another process built it while we waited
                return CacheResult(entry=entry, hit=True, seconds=time.perf_counter() - start)
            self._sweep_temp_dirs(locked_key=key)
            entry = self._build_locked(key, inputs_json, build)
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
                found.append(_verify(self.root / key, key))
            except _CorruptEntry:
                continue
        return found

    def evict(self, key: str) -> bool:
        """Remove the entry for ``key`` (valid or not); True if there was one."""
        _validate_key(key)
        if not self.root.is_dir():
            return False
        with self._lock(key):
            self._remove_temp_dirs_of(key)
            self._remove_engines(key)
            self._remove_compiled(key)
            return self._remove_entry_locked(key)

    def clear(self) -> int:
        """Remove every entry and leftover temp folder; returns how many entries were removed.

        Lock files stay: deleting a lock file another process waits on would let two
        processes hold "the same" lock on different files.
        """
        if not self.root.is_dir():
            return 0
        keys = set(self._entry_keys())
        orphans: list[Path] = []
        for path in self._temp_dirs():
            temp_key = _key_of_temp(path.name)
            if temp_key is None:
                orphans.append(path)
            else:
                keys.add(temp_key)
        removed = 0
        for key in sorted(keys):
            removed += self.evict(key)
        for path in orphans:
            _remove_path(path)
        self._clear_engines()
        self._clear_compiled()
        return removed

    def engine_dir(self, key: str, device: str, settings: str) -> Path:
        """TensorRT's engine folder for entry ``key`` on ``device``, built with ``settings``
        (a digest). Made on demand."""
        _validate_key(key)
        return self._made(self.root / ENGINE_DIR / device / key / settings)

    def timing_dir(self, device: str) -> Path:
        """TensorRT's timing cache for ``device``, shared by every model. Made on demand."""
        return self._made(self.root / ENGINE_DIR / device / "timing")

    def compiled_dir(self, key: str, cpu: str) -> Path | None:
        """Where OpenVINO keeps entry ``key``'s compiled blobs for ``cpu`` (None when the
        cache cannot be written: OpenVINO then compiles on every start). Per key, so that
        evicting the entry takes its blobs along, and a blob can be checked as its entry is."""
        _validate_key(key)
        try:
            return self._made(self.root / COMPILED_DIR / cpu / key)
        except CacheError:
            return None

    def compiled_lock(self, compiled_dir: Path) -> _KeyLock:
        """The lock held while the blobs in ``compiled_dir`` are checked, written or removed."""
        return self._folder_lock(compiled_dir)

    def engine_lock(self, engine_dir: Path) -> _KeyLock:
        """The lock held while an engine in ``engine_dir`` is built, loaded or removed.

        Lock files live under ``.locks`` with the others and are never deleted: removing
        a lock file another process waits on would hand out the same lock twice.
        """
        return self._folder_lock(engine_dir)

    def _folder_lock(self, folder: Path) -> _KeyLock:
        """The lock of a derived folder under the cache root, named by its path there
        (``tensorrt-<gpu>-<key>-<settings>.lock``, ``openvino-<cpu>-<key>.lock``)."""
        name = "-".join(folder.relative_to(self.root).parts) + ".lock"
        return _KeyLock(self.root / _LOCK_DIR / name, self.lock_timeout, self.root)

    def _made(self, folder: Path) -> Path:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _unwritable(self.root, err) from err
        return folder

    def _device_dirs(self, kind: str = ENGINE_DIR) -> list[Path]:
        """The per-device folders under ``kind`` (TensorRT's GPUs, OpenVINO's CPUs)."""
        base = self.root / kind
        try:
            return sorted(path for path in base.iterdir() if path.is_dir())
        except OSError:
            return []

    def _remove_engines(self, key: str) -> None:
        """Remove the engines of ``key`` on every device, each under its lock."""
        for device in self._device_dirs():
            folder = device / key
            if not folder.is_dir():
                continue
            for engines in sorted(folder.iterdir()):
                with self.engine_lock(engines):
                    _remove_path(engines)
            _remove_if_empty(folder)  # an engine made meanwhile stays, for its entry's next build

    def _remove_compiled(self, key: str) -> None:
        """Remove OpenVINO's blobs of ``key`` for every CPU, each under its lock."""
        for cpu in self._device_dirs(COMPILED_DIR):
            folder = cpu / key
            if folder.is_dir():
                with self.compiled_lock(folder):
                    _remove_path(folder)

    def _clear_compiled(self) -> None:
        """Remove every key's blobs (keys without an entry included), each under its lock,
        and anything else under ``openvino/`` (blobs of the layout before per-key folders).
        A folder a build makes meanwhile stays, as with engines."""
        base = self.root / COMPILED_DIR
        for cpu in sorted(base.glob("*")):
            children = sorted(cpu.iterdir()) if cpu.is_dir() else [cpu]
            for child in children:
                if child.is_dir() and _KEY_PATTERN.fullmatch(child.name):
                    with self.compiled_lock(child):
                        _remove_path(child)
                else:
                    _remove_path(child)
            _remove_if_empty(cpu)
        _remove_if_empty(base)

    def _clear_engines(self) -> None:
        """Remove the engines of every key, and the timing caches; nothing else."""
        for device in self._device_dirs():
            for child in sorted(device.iterdir()):
                if _KEY_PATTERN.fullmatch(child.name):
                    self._remove_engines(child.name)
            _remove_path(device / "timing")
            _remove_if_empty(device)
            _remove_if_empty(device.parent)

    def size_bytes(self) -> int:
        """Total bytes of every file under the cache folder, leftovers included."""
        total = 0
        for dirpath, _dirnames, filenames in os.walk(self.root):
            for filename in filenames:
                try:
                    total += os.lstat(os.path.join(dirpath, filename)).st_size
                except OSError:
                    continue  # removed while we walked
        return total

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def _inputs_as_json(key_inputs: Mapping[str, Any]) -> Any:
        """Fail before the (slow) build if the inputs cannot be recorded in the manifest."""
        try:
            return json.loads(json.dumps(dict(key_inputs), sort_keys=True, allow_nan=False))
        except (TypeError, ValueError) as err:
            raise TypeError(f"key_inputs must be JSON-serialisable: {err}") from None

    def _peek(self, key: str) -> CacheEntry | None:
        """Lock-free fast path: a complete entry cannot change under us, since writes rename.

        A corrupt entry is only reported here; it is decided again under the lock.
        """
        return self._verified(key, evict=False)

    def _lookup_locked(self, key: str) -> CacheEntry | None:
        return self._verified(key, evict=True)

    def _verified(self, key: str, *, evict: bool) -> CacheEntry | None:
        folder = self.root / key
        if not os.path.lexists(folder):
            return None
        try:
            return _verify(folder, key)
        except _CorruptEntry as why:
            if evict:
                self._remove_entry_locked(key)
                logger.warning(
                    "Evicted corrupt model cache entry %s (%s); it will be rebuilt when next "
                    "needed.",
                    folder,
                    why,
                )
            return None

    def _remove_entry_locked(self, key: str) -> bool:
        """Rename away first so no reader ever sees a half-deleted entry."""
        folder = self.root / key
        if not os.path.lexists(folder):
            return False
        trash = self.root / f"{_TMP_PREFIX}{key}-evicted-{secrets.token_hex(4)}"
        try:
            os.rename(folder, trash)
        except OSError:
            _remove_path(folder)
            return True
        _remove_path(trash)
        return True

    def _build_locked(
        self, key: str, inputs_json: Any, build: Callable[[Path], Mapping[str, Any] | None]
    ) -> CacheEntry:
        tmp = self._make_temp_dir(key)
        try:
            built = build(tmp)
            manifest = self._write_manifest(tmp, key, inputs_json, built)
            target = self.root / key
            try:
                os.rename(tmp, target)
            except OSError as err:
                raise _unwritable(self.root, err) from err
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return CacheEntry(key=key, path=target, manifest=manifest)

    @staticmethod
    def _write_manifest(
        folder: Path, key: str, inputs_json: Any, built: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        manifest: dict[str, Any] = {
            "format_version": MANIFEST_FORMAT_VERSION,
            "key": key,
            "key_inputs": inputs_json,
            "files": _describe_files(folder),
            "created": _utc_now_iso(),
            "spacy_accelerate_version": __version__,
        }
        if built:  # what the builder chose (an int8 quantization plan, say)
            manifest["built"] = dict(built)
        data = json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8")
        with open(folder / MANIFEST_NAME, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return manifest

    def _make_temp_dir(self, key: str) -> Path:
        """Beside the target so the final rename stays on one filesystem and is atomic."""
        tmp = self.root / f"{_TMP_PREFIX}{key}-{secrets.token_hex(8)}"
        try:
            tmp.mkdir()
        except OSError as err:
            raise _unwritable(self.root, err) from err
        return tmp

    def _ensure_root(self) -> None:
        try:
            (self.root / _LOCK_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _unwritable(self.root, err) from err

    def _lock(self, key: str) -> _KeyLock:
        return _KeyLock(self.root / _LOCK_DIR / f"{key}.lock", self.lock_timeout, self.root)

    def _entry_keys(self) -> list[str]:
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        return sorted(name for name in names if _KEY_PATTERN.fullmatch(name))

    def _temp_dirs(self) -> list[Path]:
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        return [self.root / name for name in sorted(names) if name.startswith(_TMP_PREFIX)]

    def _remove_temp_dirs_of(self, key: str) -> None:
        """Caller holds ``key``'s lock, so no build can be writing into these."""
        for path in self._temp_dirs():
            if _key_of_temp(path.name) == key:
                _remove_path(path)

    def _sweep_temp_dirs(self, locked_key: str) -> None:
        """Remove crashed builds' leftovers, for other keys only if their lock is free now."""
        for path in self._temp_dirs():
            temp_key = _key_of_temp(path.name)
            if temp_key is None:
                continue  # not ours to judge; clear() removes it
            if temp_key == locked_key:
                _remove_path(path)
                continue
            lock = filelock.FileLock(str(self.root / _LOCK_DIR / f"{temp_key}.lock"))
            try:
                lock.acquire(blocking=False)
            except (filelock.Timeout, OSError):
                continue  # a live build holds it, or we cannot tell: leave it alone
            try:
                _remove_path(path)
            finally:
                lock.release()


class _KeyLock:
    """Per-key inter-process lock that reports failures as :class:`CacheError`."""

    def __init__(self, path: Path, timeout: float, root: Path) -> None:
        self._path = path
        self._timeout = timeout
        self._root = root
        self._lock = filelock.FileLock(str(path), timeout=timeout)

    def __enter__(self) -> _KeyLock:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        except filelock.Timeout:
            raise CacheError(
                f"timed out after {self._timeout:g} s waiting for the cache lock {self._path}; "
                "another process is still building this model. Wait for it, or pass a larger "
                "lock_timeout"
            ) from None
        except OSError as err:
            raise _unwritable(self._root, err) from err
        return self

    def __exit__(self, *_exc: object) -> None:
        self._lock.release()
