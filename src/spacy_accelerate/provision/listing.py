"""Managing the model cache from Python: list, measure and clear it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spacy_accelerate.cache.provenance import last_used
from spacy_accelerate.cache.store import CacheEntry, ModelCache
from spacy_accelerate.errors import Advice, spelled
from spacy_accelerate.verify.record import BuildRecord


@dataclass(frozen=True)
class CachedModel:
    """One exported model in the cache, described from its manifest.

    Entries of earlier releases lack some records: their ``source`` and ``component`` are
    None; ``last_used`` is None only where the manifest cannot be read."""

    key: str
    path: Path
    size_bytes: int
    created: str
    family: str | None
    provider: str | None
    precision: str | None
    #: The plan served: int8's (``every MatMul int8``, ``2 of 72 MatMuls kept float:
    #: ...``, OpenVINO's ``all layers int8``...), ``whole model fp32`` (or bf16, fp16)
    #: for the other precisions; None for an entry that holds no model (see ``note``).
    plan: str | None = None
    #: A lossy plan: the pipeline's agreement with PyTorch fp32 per annotation on the
    #: calibration texts.
    agreement: dict[str, float] | None = None
    #: What the entry holds besides a model: ``precision="auto"``'s stored choice, or a
    #: lossy plan's refusal (its reason).
    note: str | None = None
    #: The pipeline it was built from, as spaCy names it, and its version
    #: (``en_core_web_trf 3.8.0``), and the transformer component.
    source: str | None = None
    component: str | None = None
    #: When it was last served (UTC, ISO 8601), its build time if never since.
    last_used: str | None = None

    @property
    def summary(self) -> str:
        """One line: ``cpu int8 (every MatMul int8), en_core_web_trf 3.8.0 transformer,
        key 1a2b3c4d5e6f``."""
        served = " ".join(part for part in (self.provider, self.precision) if part) or "?"
        plan = f" ({self.plan})" if self.plan else ""
        source = " ".join(part for part in (self.source, self.component) if part)
        origin = f", {source}" if source else ""
        return f"{served}{plan}{origin}, key {self.key[:12]}"

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON values (``cache list --json``): every field, the path as a string."""
        return {
            "key": self.key,
            "path": str(self.path),
            "size_bytes": self.size_bytes,
            "created": self.created,
            "last_used": self.last_used,
            "family": self.family,
            "provider": self.provider,
            "precision": self.precision,
            "plan": self.plan,
            "source": self.source,
            "component": self.component,
            "agreement": dict(self.agreement) if self.agreement is not None else None,
            "note": self.note,
        }


def _describe(entry: CacheEntry) -> CachedModel:
    inputs = entry.manifest.get("key_inputs")
    inputs = inputs if isinstance(inputs, dict) else {}
    record = BuildRecord.from_dict(entry.manifest.get("built"))
    encoder = inputs.get("encoder") or {}
    export = inputs.get("export") or {}
    note = None
    if record.chosen is not None:
        # The listing's own words, in Python's terms like the log's.
        note = spelled([Advice("precision", "auto"), f" choice: {record.chosen}"])
    elif record.refusal is not None:
        reason = "not faster than float here" if record.refusal == "speed" else "the gate"
        note = f"a refusal ({reason}): no model is served for this request here"
    precision = export.get("precision")
    source = record.source
    agreement = record.agreement
    return CachedModel(
        key=entry.key,
        path=entry.path,
        size_bytes=entry.size_bytes,
        created=entry.created,
        family=encoder.get("family"),
        provider=export.get("provider"),
        precision=precision,
        plan=_plan(record.plan, precision) if record.holds_model else None,
        agreement={a.value: rate.rate for a, rate in agreement.rates} if agreement else None,
        note=note,
        source=source.describe() if source is not None else None,
        component=source.component if source is not None else None,
        last_used=last_used(entry.path),
    )


#: How earlier releases labelled ONNX Runtime's int8 plans, and how they read now.
_EARLIER_ALL_INT8 = "all MatMuls int8"
_EARLIER_KEPT = re.compile(r"^(\d+) MatMuls float: ")


def _plan(recorded: Any, precision: Any) -> str | None:
    """The plan of a model entry: the one its build recorded (int8's), or the whole model
    in its precision; an earlier release's int8 label as this one words it."""
    if isinstance(recorded, str) and recorded:
        if recorded == _EARLIER_ALL_INT8:
            return "every MatMul int8"
        return _EARLIER_KEPT.sub(r"\1 MatMuls kept float: ", recorded, count=1)
    if precision == "int8":
        return "int8, plan not recorded"
    return f"whole model {precision}" if isinstance(precision, str) else None


def list_cached(cache_dir: str | os.PathLike[str] | None = None) -> list[CachedModel]:
    """The valid cache entries (corrupt ones are not listed; they are rebuilt on use)."""
    return [_describe(entry) for entry in ModelCache(cache_dir).entries()]


def clear_cache(cache_dir: str | os.PathLike[str] | None = None) -> int:
    """Remove every cached model; return how many entries were removed."""
    return ModelCache(cache_dir).clear()


def cache_size(cache_dir: str | os.PathLike[str] | None = None) -> int:
    """Bytes used by the cache folder, leftovers of interrupted exports included."""
    return ModelCache(cache_dir).size_bytes()
