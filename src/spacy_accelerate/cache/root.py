"""The cache folder itself: where it is, what its entries are named, where its locks live,
and the errors raised when it cannot be written or holds a link.

The rest of :mod:`spacy_accelerate.cache` builds on these few rules: an entry's folder name
is its key (64 lowercase hex characters, so a key never names a path outside the cache),
every lock file lives under ``<cache_dir>/.locks/``, and nothing under the root is reached
through a symbolic link: the root itself may be one (the user chose it), but a link below
it (planted, or left by another tool) would carry a ``mkdir``, a lock file, a write or a
deletion outside the cache. :func:`link_on_the_way` is the one check; :func:`refuse_links`
turns what it finds into a :class:`CacheError`, and :func:`make_dirs` creates folders
under the root without ever following one.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import platformdirs

from spacy_accelerate.errors import Advice, CacheError

CACHE_ENV_VAR = "SPACY_ACCELERATE_CACHE"

_APP_NAME = "spacy-accelerate"
KEY_PATTERN = re.compile(r"[0-9a-f]{64}")
LOCK_DIR = ".locks"


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


def validate_key(key: str) -> str:
    """Reject anything but 64 lowercase hex so a key can never climb out of the cache folder."""
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise ValueError(
            f"invalid cache key {key!r}: expected a SHA256 hex digest "
            "(64 lowercase characters 0-9a-f)"
        )
    return key


def unwritable(path: Path, err: OSError) -> CacheError:
    """The error for a cache folder this process cannot create or write."""
    reason = err.strerror or str(err)
    return CacheError(
        f"cannot create or write the model cache folder {path} ({reason}); set ",
        Advice("cache_dir", ...),
        f" or the {CACHE_ENV_VAR} environment variable to a writable folder",
    )


def link_on_the_way(root: Path, path: Path) -> Path | None:
    """The first symbolic link among ``path`` and the folders between ``root`` and it, or
    None. ``root`` itself is not looked at: it may be a link the user chose. The walk stops
    at the first part that is not there (nothing below it is) or cannot be read (the
    operation that follows fails and says so)."""
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        try:
            mode = current.lstat().st_mode
        except OSError:
            return None
        if stat.S_ISLNK(mode):
            return current
    return None


def refuse_links(root: Path, path: Path) -> None:
    """Raise :class:`CacheError` where ``path``, or a folder between ``root`` and it, is a
    symbolic link: called before the cache makes, locks or writes anything there, so that
    nothing outside ``root`` is ever created or changed through one."""
    link = link_on_the_way(root, path)
    if link is None:
        return
    raise CacheError(
        f"{link} is a symbolic link inside the model cache folder {root}; the cache never "
        "makes, locks, writes or removes anything through a link, so that nothing outside "
        "its folder is touched. Remove the link (the cache then makes what it needs there "
        "itself), or set ",
        Advice("cache_dir", ...),
        f" (or the {CACHE_ENV_VAR} environment variable) to another folder.",
    )


def make_dirs(root: Path, folder: Path) -> bool:
    """Create ``root`` and then ``folder`` and the folders between them one at a time, so
    that none is made through a link (``mkdir(parents=True, exist_ok=True)`` follows one);
    True if ``folder`` itself was made here. A :class:`CacheError` where a link is on the
    way (:func:`refuse_links`) or a folder cannot be made (a file in the way, say)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise unwritable(root, err) from err
    current, made = root, False
    for part in folder.relative_to(root).parts:
        current = current / part
        try:
            current.mkdir()
        except OSError as err:  # there already (a read-only cache may say so otherwise)
            if not os.path.lexists(current):
                raise unwritable(current, err) from err
            refuse_links(root, current)
            made = False
        else:
            made = True
    return made
