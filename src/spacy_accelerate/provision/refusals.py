"""A lossy build's refusal, kept in its cache entry instead of a model: its message, and
its parts (the options it advises kept as data, so that a warm start says it in the
caller's terms, as the build did)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spacy_accelerate.cache.store import OWNER_MARK, CacheEntry
from spacy_accelerate.cache.untrusted import CorruptEntry, read_json_object
from spacy_accelerate.errors import (
    UNSET,
    AccuracyError,
    Advice,
    AgreementError,
    CacheError,
    NoFasterPlanError,
    OneOf,
    Part,
    Said,
    SpacyAccelerateError,
    spelled,
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
    parts = _parts_as_json(refusal.parts)
    if parts is not None:
        recorded["parts"] = parts
    if isinstance(refusal, AgreementError):  # which annotation, its rate and its bound
        recorded.update(kind="agreement", finding=spelled(refusal.finding))
        finding = _parts_as_json(refusal.finding)
        if finding is not None:
            recorded["finding_parts"] = finding
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
        parts = _parts_from_json(recorded.get("parts")) or (message,)
        finding = (
            _parts_from_json(recorded.get("finding_parts")) or (str(recorded["finding"]),)
            if kind == "agreement"
            else None
        )
        error = None if finding is not None else _REFUSALS[kind]
    except (OSError, ValueError, KeyError, TypeError, CorruptEntry):
        raise CacheError(
            f"The refusal recorded in the cache entry {entry.path} cannot be read; remove the "
            "entry (spacy-accelerate cache clear) so that the model is tried again."
        ) from None
    decided = (
        *parts,
        f" (Decided when this model was first tried here, {entry.created}; clear the cache "
        "to try again.)",
    )
    if finding is not None:
        raise AgreementError(*decided, finding=finding)
    raise (error or AccuracyError)(*decided)


def _flat(parts: Said) -> list[str | Advice]:
    """``parts`` with the errors and messages among them opened into their own parts."""
    flat: list[str | Advice] = []
    for part in parts:
        if isinstance(part, SpacyAccelerateError):
            flat.extend(_flat(part.parts))
        elif isinstance(part, tuple):
            flat.extend(_flat(part))
        else:
            flat.append(part)
    return flat


def _parts_as_json(parts: Said) -> list[Any] | None:
    """``parts`` as JSON values: text as strings, each advice as an object; None where a
    value cannot be written (the message alone is kept then)."""
    out: list[Any] = []
    for part in _flat(parts):
        if isinstance(part, str):
            out.append(part)
            continue
        advised: dict[str, Any] = {"option": part.option}
        if part.item is not None:
            advised["item"] = part.item
        if part.value is Ellipsis:
            advised["supplied"] = True
        elif isinstance(part.value, OneOf):
            advised["one_of"] = list(part.value.values)
        elif part.value is not UNSET:
            advised["value"] = part.value
        out.append(advised)
    try:
        json.dumps(out)
    except (TypeError, ValueError):
        return None
    return out


def _parts_from_json(recorded: Any) -> Said | None:
    """The parts :func:`_parts_as_json` wrote, or None where there are none to read (an
    entry of an earlier release) or they cannot be read."""
    if not isinstance(recorded, list):
        return None
    parts: list[Part] = []
    for part in recorded:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and isinstance(part.get("option"), str):
            item = part.get("item")
            value = ... if part.get("supplied") else part.get("value", UNSET)
            if isinstance(part.get("one_of"), list):
                value = OneOf(tuple(part["one_of"]))
            parts.append(Advice(part["option"], value, str(item) if item is not None else None))
        else:
            return None
    return tuple(parts)
