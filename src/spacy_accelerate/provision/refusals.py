"""A lossy build's refusal, kept in its cache entry instead of a model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spacy_accelerate.cache.store import OWNER_MARK, CacheEntry
from spacy_accelerate.cache.untrusted import CorruptEntry, read_json_object
from spacy_accelerate.errors import (
    AccuracyError,
    AgreementError,
    CacheError,
    NoFasterPlanError,
    SpacyAccelerateError,
)
from spacy_accelerate.verify.record import BuildRecord

#: What a calibrated build stores instead of a model when no plan may be served.
REFUSAL_FILE = "refusal.json"

_REFUSALS: dict[str, type[SpacyAccelerateError]] = {
    "accuracy": AccuracyError,
    "speed": NoFasterPlanError,
}


def store_refusal(folder: Path, refusal: AccuracyError | NoFasterPlanError) -> BuildRecord:
    """Keep the decision instead of a model: a lossy plan is judged by running the
    pipeline over the calibration texts (an int8 search, several times), and its verdict
    holds for the same weights, calibration, bounds and CPU (all in the key), so a warm
    start reads it from the entry instead of judging again."""
    kind = "speed" if isinstance(refusal, NoFasterPlanError) else "accuracy"
    recorded: dict[str, Any] = {"kind": kind, "message": str(refusal)}
    if isinstance(refusal, AgreementError):  # which annotation, its rate and its bound
        recorded.update(kind="agreement", finding=refusal.finding)
    for path in folder.iterdir():
        if path.name != OWNER_MARK:
            path.unlink()
    (folder / REFUSAL_FILE).write_text(json.dumps(recorded))
    return BuildRecord(refusal=recorded["kind"])


def raise_recorded_refusal(entry: CacheEntry) -> None:
    """Raise the refusal a calibrated build stored, if this entry is one."""
    if REFUSAL_FILE not in entry.manifest["files"]:
        return
    try:
        recorded = read_json_object(entry.file(REFUSAL_FILE))
        kind, message = recorded["kind"], str(recorded["message"])
        finding = str(recorded["finding"]) if kind == "agreement" else None
        error = None if finding is not None else _REFUSALS[kind]
    except (OSError, ValueError, KeyError, TypeError, CorruptEntry):
        raise CacheError(
            f"The refusal recorded in the cache entry {entry.path} cannot be read; remove the "
            "entry (spacy-accelerate cache clear) so that the model is tried again."
        ) from None
    decided = (
        f"{message} (Decided when this model was first tried here, {entry.created}; clear "
        "the cache to try again.)"
    )
    if finding is not None:
        raise AgreementError(decided, finding=finding)
    raise (error or AccuracyError)(decided)
