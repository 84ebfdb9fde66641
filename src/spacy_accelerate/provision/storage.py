"""A build that cannot write its files, reported as what it is: a full (or read-only)
cache, with what to do, rather than an export bug."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from spacy_accelerate.errors import Advice, CacheError

#: The errno values that mean the cache's disk cannot take the model.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def storage_failure(error: BaseException) -> str | None:
    """Why writing failed, when ``error`` (or what caused it) is a full disk, a quota, a
    file-size limit or a read-only filesystem; None for any other failure. Runtimes that
    write from C++ report it only in their message, so the message is read too."""
    for cause in _causes(error):
        if isinstance(cause, OSError) and cause.errno in _STORAGE_ERRNOS:
            return cause.strerror or os.strerror(cause.errno)
        text = str(cause)
        for code in _STORAGE_ERRNOS:
            if os.strerror(code) in text:
                return os.strerror(code)
    return None


def stored_as_cache_errors(build: Callable[[Path], Any], root: Path) -> Callable[[Path], Any]:
    """``build``, with a failure to write its files reported as what it is: a cache whose
    disk is full (or read-only), not an export bug to report."""

    def storing(folder: Path) -> Any:
        try:
            return build(folder)
        except BaseException as error:
            reason = storage_failure(error)
            if reason is None:
                raise
            raise CacheError(
                f"The model cache at {root} could not take the exported model ({reason}). "
                "Free space there, or set ",
                Advice("cache_dir", ...),
                " (or the SPACY_ACCELERATE_CACHE environment variable) to a folder with room; "
                "nothing was stored and the pipeline is unchanged.",
            ) from error

    return storing
