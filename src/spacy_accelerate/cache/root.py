"""The cache folder itself: where it is, what its entries are named, where its locks live,
and the error raised when it cannot be written.

The rest of :mod:`spacy_accelerate.cache` builds on these few rules: an entry's folder name
is its key (64 lowercase hex characters, so a key never names a path outside the cache),
and every lock file lives under ``<cache_dir>/.locks/``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import platformdirs

from spacy_accelerate.cache.lock import KeyLock
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


def lock_file(root: Path, name: str, timeout: float) -> KeyLock:
    """The lock ``<root>/.locks/<name>.lock``. Lock files are never deleted: removing one
    another process waits on would hand out the same lock twice."""
    return KeyLock(root / LOCK_DIR / f"{name}.lock", timeout, root)


def unwritable(path: Path, err: OSError) -> CacheError:
    """The error for a cache folder this process cannot create or write."""
    reason = err.strerror or str(err)
    return CacheError(
        f"cannot create or write the model cache folder {path} ({reason}); set ",
        Advice("cache_dir", ...),
        f" or the {CACHE_ENV_VAR} environment variable to a writable folder",
    )
