"""Managing the model cache from Python: list, measure and clear it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spacy_accelerate.cache.store import CacheEntry, ModelCache


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
    #: A lossy plan: the plan served (int8's float layers, say), and the pipeline's
    #: agreement with PyTorch fp32 per annotation on the calibration texts.
    plan: str | None = None
    agreement: dict[str, float] | None = None
    #: What the entry holds besides a model: ``precision="auto"``'s stored choice, or a
    #: lossy plan's refusal (its reason).
    note: str | None = None


def _describe(entry: CacheEntry) -> CachedModel:
    inputs = entry.manifest.get("key_inputs")
    inputs = inputs if isinstance(inputs, dict) else {}
    built = entry.manifest.get("built")
    built = built if isinstance(built, dict) else {}
    encoder = inputs.get("encoder") or {}
    export = inputs.get("export") or {}
    rates = _rates(built.get("agreement"))
    note = None
    if isinstance(built.get("auto_precision"), dict):
        chosen = built["auto_precision"].get("chosen") or {}
        note = f"precision='auto' choice: {chosen.get('provider')} {chosen.get('precision')}"
    elif isinstance(built.get("refusal"), str):
        reason = "not faster than float here" if built["refusal"] == "speed" else "the gate"
        note = f"a refusal ({reason}): no model is served for this request here"
    return CachedModel(
        key=entry.key,
        path=entry.path,
        size_bytes=entry.size_bytes,
        created=entry.created,
        family=encoder.get("family"),
        provider=export.get("provider"),
        precision=export.get("precision"),
        plan=built.get("plan") if isinstance(built.get("plan"), str) else None,
        agreement=rates,
        note=note,
    )


def _rates(recorded: Any) -> dict[str, float] | None:
    """The recorded agreement's rate per annotation; None when it is missing or unreadable
    (an entry written by another release is listed, not refused)."""
    try:
        return {str(name): float(rate["rate"]) for name, rate in recorded.items()}
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def list_cached(cache_dir: str | os.PathLike[str] | None = None) -> list[CachedModel]:
    """The valid cache entries (corrupt ones are not listed; they are rebuilt on use)."""
    return [_describe(entry) for entry in ModelCache(cache_dir).entries()]


def clear_cache(cache_dir: str | os.PathLike[str] | None = None) -> int:
    """Remove every cached model; return how many entries were removed."""
    return ModelCache(cache_dir).clear()


def cache_size(cache_dir: str | os.PathLike[str] | None = None) -> int:
    """Bytes used by the cache folder, leftovers of interrupted exports included."""
    return ModelCache(cache_dir).size_bytes()
