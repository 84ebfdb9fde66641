"""What a cache entry says of where it came from and when it was last used.

Two entries of the same family, provider and precision (two ``roberta openvino int8``,
say) differ in the pipeline they were built from, their plan, when they were built and
when they were last served: ``cache list`` shows all four.

- **Source**: the pipeline (``nlp.meta``'s ``lang`` and ``name``, as spaCy names its
  packages: ``en_core_web_trf``; a blank pipeline is ``en_pipeline``), its version and the
  transformer component, recorded in the manifest's ``built`` section when the entry is
  built. Not part of the key: the key comes from the weights and the options, so the same
  weights in another pipeline find the same entry (which keeps the first builder's source),
  and adding this record changed no existing key.
- **Last use**: the modification time of the entry's ``manifest.json``, set to now each
  time the entry is served (:func:`record_use`). ``os.utime`` changes no byte of the
  manifest, is atomic, and needs no lock: a reader sees the old time or the new one, and
  verification reads only contents. Where the cache cannot be written (a read-only
  image, another user's cache) the time is left as it is. An entry never served since it
  was built reads its build time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spacy_accelerate.cache.store import MANIFEST_NAME, CacheEntry

logger = logging.getLogger("spacy_accelerate")


@dataclass(frozen=True)
class PipelineSource:
    """The pipeline and component an entry was built from."""

    #: spaCy's package name of the pipeline: ``{lang}_{name}`` of ``nlp.meta``.
    pipeline: str
    version: str
    component: str

    @classmethod
    def of(cls, meta: Mapping[str, Any], component: str) -> PipelineSource:
        """The source of ``component`` in a pipeline whose ``nlp.meta`` is ``meta``."""
        lang, name = meta.get("lang") or "xx", meta.get("name") or "pipeline"
        return cls(f"{lang}_{name}", str(meta.get("version") or "0.0.0"), component)

    def as_dict(self) -> dict[str, str]:
        return {"pipeline": self.pipeline, "version": self.version, "component": self.component}

    @classmethod
    def from_dict(cls, recorded: Any) -> PipelineSource | None:
        """The source :meth:`as_dict` wrote; None where there is none (an entry of an
        earlier release, or one not built from a pipeline) or it cannot be read."""
        if not isinstance(recorded, Mapping):
            return None
        pipeline, version, component = (
            recorded.get(name) for name in ("pipeline", "version", "component")
        )
        if not (isinstance(pipeline, str) and isinstance(version, str)):
            return None
        return cls(pipeline, version, component if isinstance(component, str) else "")

    def describe(self) -> str:
        """``en_core_web_trf 3.8.0``."""
        return f"{self.pipeline} {self.version}"


def record_use(entry: CacheEntry) -> None:
    """Say that ``entry`` was served now (its manifest's modification time); a link at the
    manifest's place gets the time itself, so that no file outside the cache is touched."""
    follow = os.utime not in os.supports_follow_symlinks
    try:
        os.utime(entry.path / MANIFEST_NAME, follow_symlinks=follow)
    except OSError as error:  # read-only, someone else's, or removed meanwhile
        logger.debug("spacy-accelerate: last use of %s not recorded: %s", entry.path, error)


def last_used(entry_path: Path) -> str | None:
    """When the entry at ``entry_path`` was last served (UTC, ISO 8601, seconds), or None
    where it cannot be read."""
    try:
        seconds = (entry_path / MANIFEST_NAME).stat().st_mtime
    except OSError:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")
