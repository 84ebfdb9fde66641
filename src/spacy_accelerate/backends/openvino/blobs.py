"""OpenVINO's compiled blobs, checked before OpenVINO reads them.

OpenVINO writes a compiled model to ``CACHE_DIR`` after the first compile and imports it
on later starts without any check of its own: a blob damaged on disk that still imports
would be served, and a pipeline run with ``verify=False`` would annotate silently wrong.
Each entry's blobs live in their own folder
(:meth:`~spacy_accelerate.cache.store.ModelCache.derived_dir`, removed with the entry);
after a compile the size and sha256 of every blob there are recorded beside them, and
before the next compile any blob that is unrecorded or no longer matches is removed, so
OpenVINO compiles afresh and writes it again. The caller holds the folder's lock, so no
process checks a blob while another writes it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spacy_accelerate.cache.store import sha256_file
from spacy_accelerate.cache.untrusted import CorruptEntry, read_json_object
from spacy_accelerate.errors import CacheError

logger = logging.getLogger("spacy_accelerate")

#: The record of the folder's blobs: name -> {"size", "sha256"}.
SUMS_FILE = "blobs.json"

Record = dict[str, dict[str, object]]


@contextmanager
def checked_blobs(folder: Path) -> Iterator[None]:
    """Around OpenVINO's compile with ``CACHE_DIR=folder``: unverified blobs removed
    before, every blob recorded after (not when the compile fails). A
    :class:`~spacy_accelerate.errors.CacheError` when the blobs cannot be checked, so that
    none is read unchecked."""
    try:
        verified = _drop_unverified(folder)
    except OSError as error:
        raise CacheError(f"cannot check the compiled blobs in {folder} ({error})") from error
    yield
    try:
        _record(folder, verified)
    except OSError as error:
        logger.warning(
            "spacy-accelerate: could not record OpenVINO's compiled blobs in %s (%s); a blob "
            "not recorded is compiled again next time.",
            folder,
            error,
        )


def _recorded(folder: Path) -> Record:
    try:
        return read_json_object(folder / SUMS_FILE)
    except (OSError, CorruptEntry):
        return {}


def _blobs(folder: Path) -> list[Path]:
    """The files OpenVINO wrote: all but the record and its temporary copies."""
    return sorted(
        path
        for path in folder.iterdir()
        if path.is_file() and path.name != SUMS_FILE and not path.name.startswith(".")
    )


def _drop_unverified(folder: Path) -> dict[str, tuple[os.stat_result, dict[str, object]]]:
    """Remove each blob whose size and sha256 are not as recorded; the others, with their
    ``stat`` now (so that :func:`_record` need not read them again if untouched)."""
    recorded = _recorded(folder)
    verified = {}
    removed = []
    for path in _blobs(folder):
        info, status = recorded.get(path.name), path.stat()
        if (
            isinstance(info, dict)
            and info.get("size") == status.st_size
            and info.get("sha256") == sha256_file(path)
        ):
            verified[path.name] = (status, info)
        else:
            path.unlink()
            removed.append(path.name)
    if removed:
        logger.warning(
            "spacy-accelerate: removed OpenVINO compiled blobs that did not match their "
            "record in %s (%s); the model is compiled again.",
            folder,
            ", ".join(removed),
        )
    return verified


def _record(folder: Path, verified: dict[str, tuple[os.stat_result, dict[str, object]]]) -> None:
    """Size and sha256 of every blob in ``folder``, written to a temporary file and renamed
    into place; a blob verified before the compile and untouched since is not read again."""
    current: Record = {}
    for path in _blobs(folder):
        status = path.stat()
        before = verified.get(path.name)
        untouched = (status.st_size, status.st_mtime_ns)
        if before is not None and (before[0].st_size, before[0].st_mtime_ns) == untouched:
            current[path.name] = before[1]
        else:
            current[path.name] = {"size": status.st_size, "sha256": sha256_file(path)}
    temporary = folder / f".{SUMS_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps(current, indent=2, sort_keys=True), encoding="utf8")
    os.replace(temporary, folder / SUMS_FILE)
