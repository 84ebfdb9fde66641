"""Managing the model cache from Python: list, measure and clear it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spacy_accelerate.cache.store import ModelCache


@dataclass(frozen=True)
class CachedModel:
    """One exported model in the cache, described from its manifest."""

    key: str
    path: Path
    size_bytes: int
    created: str
    family: str | None
    provider: str | None
    precision: str | None


def _describe(key: str, path: Path, size: int, created: str, inputs: Any) -> CachedModel:
    inputs = inputs if isinstance(inputs, dict) else {}
    encoder = inputs.get("encoder") or {}
    export = inputs.get("export") or {}
    return CachedModel(
        key=key,
        path=path,
        size_bytes=size,
        created=created,
        family=encoder.get("family"),
        provider=export.get("provider"),
        precision=export.get("precision"),
    )


def list_cached(cache_dir: str | os.PathLike[str] | None = None) -> list[CachedModel]:
    """The valid cache entries (corrupt ones are not listed; they are rebuilt on use)."""
    return [
        _describe(e.key, e.path, e.size_bytes, e.created, e.manifest.get("key_inputs"))
        for e in ModelCache(cache_dir).entries()
    ]


def clear_cache(cache_dir: str | os.PathLike[str] | None = None) -> int:
    """Remove every cached model; return how many entries were removed."""
    return ModelCache(cache_dir).clear()


def cache_size(cache_dir: str | os.PathLike[str] | None = None) -> int:
    """Bytes used by the cache folder, leftovers of interrupted exports included."""
    return ModelCache(cache_dir).size_bytes()
