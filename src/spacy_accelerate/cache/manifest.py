"""An entry's manifest: the size and SHA256 of every file it holds, and the checks that a
folder holds exactly what its manifest lists.

The cache verifies every hit with :func:`verify_entry`; a saved pipeline's bundle
(:mod:`spacy_accelerate.provision.bundle`) checks its folder with the same
:func:`check_listed_files`. Only JSON is parsed here; names are plain relative paths
(:func:`safe_relative`), so nothing listed can point outside the folder, and a link or
anything but a regular file is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from spacy_accelerate._version import __version__
from spacy_accelerate.cache.ownership import MARK, is_marked, is_real_dir
from spacy_accelerate.cache.root import KEY_PATTERN, unwritable
from spacy_accelerate.cache.untrusted import CorruptEntry, read_json_object
from spacy_accelerate.errors import CacheError

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT_VERSION = 1
#: The file in every entry (and build folder) that says the library made it.
OWNER_MARK = MARK
_HASH_CHUNK = 1024 * 1024
#: The most folders a listed file may sit in (this release writes one or two).
MAX_NAME_PARTS = 16


def safe_relative(name: str) -> PurePosixPath:
    """Parse a manifest file name, refusing anything that could point outside the entry."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        raise ValueError(f"unsafe file name {name!r}")
    rel = PurePosixPath(name)
    if rel.is_absolute() or any(part in ("", ".", "..") for part in rel.parts):
        raise ValueError(f"unsafe file name {name!r}")
    if len(rel.parts) > MAX_NAME_PARTS:  # os.walk recurses once a folder
        raise ValueError(f"file name {name[:80]!r}... nested more than {MAX_NAME_PARTS} deep")
    if str(rel) != name:
        raise ValueError(f"file name {name!r} is not in normal form")
    return rel


def sha256_file(path: Path) -> str:
    """Stream the file so multi-GB models are never read into memory at once."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_manifest(folder: Path) -> dict[str, Any]:
    try:
        return read_json_object(folder / MANIFEST_NAME)
    except FileNotFoundError:
        raise CorruptEntry(f"{MANIFEST_NAME} is missing") from None
    except OSError as err:
        raise CorruptEntry(f"{MANIFEST_NAME} cannot be read ({err})") from None


def _check_manifest_fields(
    manifest: Mapping[str, Any], key: str, required: Iterable[str]
) -> Mapping[str, Any]:
    """Check the manifest's shape; returns its ``files`` table."""
    version = manifest.get("format_version")
    if version != MANIFEST_FORMAT_VERSION:
        raise CorruptEntry(f"manifest format version {version!r} is not supported")
    if manifest.get("key") != key:
        raise CorruptEntry(f"manifest key {manifest.get('key')!r} differs from the folder name")
    files = file_records(manifest.get("files"), "manifest")
    missing = sorted(set(required) - set(files))
    if missing:
        raise CorruptEntry(f"manifest does not list {', '.join(missing)}, which it needs")
    return files


def file_records(files: Any, where: str) -> Mapping[str, Any]:
    """``files`` as a table of safe names to ``{"size", "sha256"}`` records, or
    :class:`CorruptEntry` naming the first that is not (``where``: what lists them)."""
    if not isinstance(files, dict) or not files:
        raise CorruptEntry(f"{where} lists no files")
    for name, info in files.items():
        try:
            safe_relative(name)
        except ValueError as err:
            raise CorruptEntry(f"{where} lists an {err}") from None
        if not (
            isinstance(info, dict)
            and type(info.get("size")) is int
            and info["size"] >= 0
            and isinstance(info.get("sha256"), str)
            and KEY_PATTERN.fullmatch(info["sha256"])  # a hex SHA256, as keys are
        ):
            raise CorruptEntry(f"{where} record of {name!r} is malformed")
    return files


def check_listed_files(
    folder: Path, files: Mapping[str, Any], index: str, hashed: Mapping[str, Any] | None = None
) -> None:
    """``folder`` holds ``index`` (the file that lists the others), the ``files`` listed
    and their folders, nothing else; each listed file is a regular file (not a link) of
    its recorded size and SHA256. Else :class:`CorruptEntry` naming the file. Sizes are
    checked first, so a truncated multi-GB file is caught before any hashing.

    ``hashed``: records of these files (same names) checked against their contents just
    before, by a listing that covers this folder (a bundle's): each file's record must
    equal its ``hashed`` one, and nothing is read a second time."""
    _check_nothing_unlisted(folder, files, index)
    _check_sizes(folder, files)
    if hashed is None:
        _check_hashes(folder, files)
    else:
        _check_records(files, hashed, index)


def _check_nothing_unlisted(folder: Path, files: Mapping[str, Any], index: str) -> None:
    """Every path in the folder is the index, a listed file or a folder of one: a runtime
    reads files it finds beside the model (external data, weights files), so an
    unlisted one would be served unverified."""
    allowed = {index, *files}
    for name in files:
        parents = PurePosixPath(name).parents
        allowed.update(parent.as_posix() for parent in parents if parent.as_posix() != ".")
    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath)
        for entry_name in (*dirnames, *filenames):
            relative = (base / entry_name).relative_to(folder).as_posix()
            if relative not in allowed:
                raise CorruptEntry(f"{relative} is in {folder} but not listed in {index}")


def _check_sizes(folder: Path, files: Mapping[str, Any]) -> None:
    """Cheap pass first, so a truncated multi-GB file is caught before any hashing."""
    for name, info in files.items():
        path = folder.joinpath(*PurePosixPath(name).parts)
        try:
            st = path.lstat()
        except FileNotFoundError:
            raise CorruptEntry(f"{name} is missing") from None
        except OSError as err:
            raise CorruptEntry(f"{name} cannot be read ({err})") from None
        if not stat.S_ISREG(st.st_mode):
            raise CorruptEntry(f"{name} is not a regular file")
        if st.st_size != info["size"]:
            raise CorruptEntry(
                f"{name} has {st.st_size} bytes, the manifest records {info['size']}"
            )


def _check_hashes(folder: Path, files: Mapping[str, Any]) -> None:
    for name, info in files.items():
        path = folder.joinpath(*PurePosixPath(name).parts)
        try:
            actual = sha256_file(path)
        except OSError as err:
            raise CorruptEntry(f"{name} cannot be read ({err})") from None
        if actual != info["sha256"]:
            raise CorruptEntry(f"{name} does not match its recorded sha256")


def _check_records(files: Mapping[str, Any], hashed: Mapping[str, Any], index: str) -> None:
    for name, info in files.items():
        known = hashed.get(name)
        if known is None or (known["size"], known["sha256"]) != (info["size"], info["sha256"]):
            raise CorruptEntry(f"{name} is recorded otherwise in {index} than in the listing")


def verify_entry(
    folder: Path, key: str, required: Iterable[str] = (), hashed: Mapping[str, Any] | None = None
) -> CacheEntry:
    """Return the entry in ``folder`` or raise :class:`CorruptEntry` saying what is wrong
    (``hashed``: as for :func:`check_listed_files`)."""
    if not is_real_dir(folder):
        raise CorruptEntry("entry is not a folder")
    manifest = read_manifest(folder)
    files = _check_manifest_fields(manifest, key, required)
    check_listed_files(folder, files, MANIFEST_NAME, hashed)
    return CacheEntry(key=key, path=folder, manifest=manifest)


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


def describe_files(folder: Path) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for name, path in _collect_files(folder):
        if name == MANIFEST_NAME:
            raise CacheError(
                f"the model builder wrote a file named {MANIFEST_NAME}, which is reserved"
            )
        files[name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    if set(files) <= {OWNER_MARK}:
        raise CacheError(f"the model builder wrote no files into {folder}")
    return files


def write_manifest(
    folder: Path, key: str, inputs_json: Any, built: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Describe every file of a finished build in ``folder/manifest.json`` (written last,
    flushed to disk before the folder is renamed into place) and return the manifest."""
    manifest: dict[str, Any] = {
        "format_version": MANIFEST_FORMAT_VERSION,
        "key": key,
        "key_inputs": inputs_json,
        "files": describe_files(folder),
        "created": utc_now_iso(),
        "spacy_accelerate_version": __version__,
    }
    if built:  # what the builder chose (an int8 quantization plan, say)
        manifest["built"] = dict(built)
    data = json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8")
    try:
        with open(folder / MANIFEST_NAME, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        raise unwritable(folder.parent, err) from err
    return manifest


def is_own_entry(folder: Path, key: str) -> bool:
    """Whether the folder at an entry's place is the library's to remove: marked, or (entries
    of releases before the mark) holding a manifest that names it."""
    if is_marked(folder):
        return True
    if not is_real_dir(folder):
        return False
    try:
        return read_manifest(folder).get("key") == key
    except CorruptEntry:
        return False


@dataclass(frozen=True)
class CacheEntry:
    """A verified cache entry: its files matched the manifest when it was looked up."""

    key: str
    path: Path
    manifest: Mapping[str, Any]

    def file(self, name: str) -> Path:
        """Path of a listed file; an unlisted name is refused so that nothing unverified is
        ever read (callers name the files they need in ``required``, checked on lookup)."""
        if name not in self.manifest["files"]:
            raise CacheError(
                f"{name!r} is not a file of the cache entry {self.path}; remove the entry "
                "(spacy-accelerate cache clear) so that it is rebuilt"
            )
        return self.path.joinpath(*safe_relative(name).parts)

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
