"""What a build decided, as one typed record: the plan it serves, the plans it refused and
why, what the plan compiled to, the pipeline's agreement, where it came from.

A backend's build returns it (:class:`BuiltModel`), the build stores it once, as the
``built`` section of the entry's manifest (:meth:`BuildRecord.as_dict`), and everything
that reads an entry reads it back with :meth:`BuildRecord.from_dict`: the cache lookup
that serves it, the listing and a saved pipeline's bundle. The parity measurements stay
in the entry's ``parity.json``; nothing here is stored twice.

An entry that holds no model carries a record too: a lossy build's refusal
(:attr:`BuildRecord.refusal`) or ``precision="auto"``'s stored choice
(:attr:`BuildRecord.chosen`). Records of earlier releases (no ``record_version``) read as
they were written; a field this release cannot read is left empty rather than refusing
the entry, which is verified by its files' hashes, not by its record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spacy_accelerate.cache.provenance import PipelineSource
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.verify.agreement import AgreementReport
from spacy_accelerate.verify.parity import ParityReport

#: The version of :meth:`BuildRecord.as_dict`'s layout (records before it have none).
RECORD_VERSION = 1


@dataclass(frozen=True)
class BuildRecord:
    """How an entry came to be: all of it optional, since a float build has no plan."""

    #: int8: the plan served, as its search names it (``every MatMul int8``).
    plan: str | None = None
    #: int8: the other plans tried, and why each was refused or not tried.
    refused: tuple[str, ...] = ()
    #: OpenVINO's int8: what the served plan's MatMuls run as on the CPU that built it.
    compiled_as: str | None = None
    #: A lossy plan: the pipeline's agreement with PyTorch fp32 on the calibration texts.
    agreement: AgreementReport | None = None
    #: A lossy plan: the SHA256 of the calibration texts it was judged on.
    calibration_sha256: str | None = None
    #: The pipeline and component it was built from.
    source: PipelineSource | None = None
    #: An entry that keeps a lossy build's refusal instead of a model: its kind
    #: (``accuracy``, ``agreement`` or ``speed``).
    refusal: str | None = None
    #: An entry that keeps ``precision="auto"``'s choice: the plan it chose
    #: (``openvino bf16``).
    chosen: str | None = None

    @property
    def holds_model(self) -> bool:
        return self.refusal is None and self.chosen is None

    def as_dict(self) -> dict[str, Any]:
        """The manifest's ``built`` section: plain JSON, the fields that are set."""
        recorded: dict[str, Any] = {"record_version": RECORD_VERSION}
        if self.plan is not None:
            recorded.update(plan=self.plan, refused=list(self.refused))
            recorded["compiled_as"] = self.compiled_as
        if self.agreement is not None:
            recorded["agreement"] = self.agreement.as_dict()
        if self.calibration_sha256 is not None:
            recorded["calibration_sha256"] = self.calibration_sha256
        if self.source is not None:
            recorded["source"] = self.source.as_dict()
        if self.refusal is not None:
            recorded["refusal"] = self.refusal
        if self.chosen is not None:
            recorded["chosen"] = self.chosen
        return recorded

    @classmethod
    def from_dict(cls, recorded: Any) -> BuildRecord:
        """The record a manifest's ``built`` section holds (an earlier release's too)."""
        if not isinstance(recorded, Mapping):
            return cls()
        refused = recorded.get("refused")
        return cls(
            plan=_text(recorded.get("plan")),
            refused=tuple(str(item) for item in refused) if isinstance(refused, list) else (),
            compiled_as=_text(recorded.get("compiled_as")),
            agreement=_agreement(recorded.get("agreement")),
            calibration_sha256=_text(recorded.get("calibration_sha256")),
            source=PipelineSource.from_dict(recorded.get("source")),
            refusal=_text(recorded.get("refusal")),
            chosen=_text(recorded.get("chosen")) or _earlier_choice(recorded),
        )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _agreement(recorded: Any) -> AgreementReport | None:
    try:
        return AgreementReport.from_dict(recorded)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def _earlier_choice(recorded: Mapping[str, Any]) -> str | None:
    """The choice of an entry stored before this record (``auto_precision.chosen``)."""
    earlier = recorded.get("auto_precision")
    chosen = earlier.get("chosen") if isinstance(earlier, Mapping) else None
    if not isinstance(chosen, Mapping):
        return None
    return " ".join(str(chosen.get(part)) for part in ("provider", "precision"))


@dataclass(frozen=True)
class BuiltModel:
    """What a backend's build hands back: the session over the model it wrote, its parity
    to PyTorch, and its record."""

    session: Session
    parity: ParityReport
    record: BuildRecord = BuildRecord()
