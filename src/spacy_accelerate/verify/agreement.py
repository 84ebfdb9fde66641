"""How often a lossy pipeline annotates text as PyTorch fp32 did, per annotation.

No gold labels: the fp32 pipeline's own output is the reference. Every annotation the
reference documents carry is compared, unit by unit: tags, part-of-speech, morphology,
lemmas, dependencies (head and label together), sentence starts and entities (IOB and
type) per token; span categories per span (the units are the spans either pipeline
found, and a span agrees when both found it with the same label); text categories per
document (the top category).

A bound is met only if the lower end of the 95% Wilson score interval of the rate clears
it, so a small calibration set cannot pass a plan by luck: with 1,000 tokens and 3
changed, the point estimate is 99.7% but the interval reaches down to 99.12%.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spacy.tokens import Doc, Token

from spacy_accelerate.errors import Advice, Said
from spacy_accelerate.options.agreement import AgreementBounds, Annotation

#: The normal quantile of a two-sided 95% interval.
Z_95 = 1.959963984540054

#: bf16 is held to PyTorch's own bf16 autocast: at most this far below it, per annotation.
AUTOCAST_MARGIN = 0.0005


def wilson_lower(same: int, total: int, z: float = Z_95) -> float:
    """The lower end of the Wilson score interval of ``same`` successes in ``total``."""
    if total <= 0:
        return 1.0
    p = same / total
    z2 = z * z
    centre = p + z2 / (2 * total)
    spread = z * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total))
    return max(0.0, (centre - spread) / (1 + z2 / total))


@dataclass(frozen=True)
class Rate:
    """``same`` of ``total`` units agreed."""

    same: int
    total: int

    @property
    def rate(self) -> float:
        return self.same / self.total if self.total else 1.0

    @property
    def lower(self) -> float:
        """The lower end of its 95% confidence interval (Wilson)."""
        return wilson_lower(self.same, self.total)


#: Per-token readers, and the annotation spaCy must report as set for each to be compared.
_TOKEN_READERS: Mapping[Annotation, tuple[str, Callable[[Token], Any]]] = {
    Annotation.TAG: ("TAG", lambda t: t.tag_),
    Annotation.POS: ("POS", lambda t: t.pos_),
    Annotation.MORPH: ("MORPH", lambda t: str(t.morph)),
    Annotation.LEMMA: ("LEMMA", lambda t: t.lemma_),
    Annotation.DEP: ("DEP", lambda t: (t.head.i, t.dep_)),
    Annotation.SENT_START: ("SENT_START", lambda t: bool(t.is_sent_start)),
    Annotation.ENT: ("ENT_IOB", lambda t: (t.ent_iob_, t.ent_type_)),
}

UNITS = {Annotation.SPANS: "spans", Annotation.CATS: "document-label decisions"}


@dataclass(frozen=True)
class AgreementReport:
    """The agreement of each annotation the reference documents carry."""

    rates: tuple[tuple[Annotation, Rate], ...]

    def rate(self, annotation: Annotation) -> Rate | None:
        return dict(self.rates).get(annotation)

    def refusal(self, bounds: AgreementBounds, floor: AgreementReport | None = None) -> Said | None:
        """Why these rates may not be served under ``bounds`` (the first annotation that
        fails, with its figures; the options it names as
        :class:`~spacy_accelerate.errors.Advice`), or None. ``floor``: a reference plan
        (PyTorch's bf16 autocast) whose rates these may fall at most
        :data:`AUTOCAST_MARGIN` below."""
        refused = self.refused(bounds, floor)
        return None if refused is None else refused[1]

    def refused(
        self, bounds: AgreementBounds, floor: AgreementReport | None = None
    ) -> tuple[Annotation, Said] | None:
        """The first annotation that fails (see :meth:`refusal`) and why, or None."""
        for annotation, measured in self.rates:
            why = _refusal(annotation, measured, bounds.bound(annotation), floor)
            if why is not None:
                return annotation, why
        return None

    def describe(self) -> str:
        return ", ".join(f"{a.value} {r.rate:.2%}" for a, r in self.rates)

    def as_dict(self) -> dict[str, dict[str, float | int]]:
        return {
            annotation.value: {
                "same": rate.same,
                "total": rate.total,
                "rate": rate.rate,
                "lower_95": rate.lower,
            }
            for annotation, rate in self.rates
        }

    @classmethod
    def from_dict(cls, recorded: Mapping[str, Mapping[str, Any]]) -> AgreementReport:
        rates = {
            Annotation(name): Rate(int(entry["same"]), int(entry["total"]))
            for name, entry in recorded.items()
        }
        return cls(tuple((a, rates[a]) for a in Annotation if a in rates))


def _refusal(
    annotation: Annotation, measured: Rate, bound: float, floor: AgreementReport | None
) -> Said | None:
    """Why ``measured`` fails ``bound`` (or falls too far below ``floor``), or None."""
    units = UNITS.get(annotation, "tokens")
    best = wilson_lower(measured.total, measured.total)
    agreed = (
        f"{annotation.value} agree with PyTorch's on {measured.rate:.2%} of "
        f"{measured.total:,} calibration {units}"
    )
    if bound < 1.0 and best < bound:  # even no change at all could not pass
        needed = math.ceil(Z_95**2 * bound / (1 - bound))
        return (
            f"{annotation.value}: {measured.total:,} calibration {units} cannot show ",
            Advice("min_agreement"),
            f" {bound:.2%} (even with none changed, the 95% lower bound is {best:.2%}; it "
            f"takes at least {needed:,}): give more calibration texts (",
            Advice("calibration_texts", ...),
            ") or a lower ",
            Advice("min_agreement", item=annotation.value),
        )
    if bound >= 1.0 and measured.same < measured.total:  # 1.0: nothing may change
        changed = measured.total - measured.same
        return (f"{agreed} ({changed:,} changed; ", Advice("min_agreement"), " 100% allows none)")
    if bound < 1.0 and measured.lower < bound:
        lower = f"{measured.lower:.2%}"
        return (f"{agreed} (95% lower bound {lower} < ", Advice("min_agreement"), f" {bound:.2%})")
    reference = floor.rate(annotation) if floor is not None else None
    if reference is not None and measured.rate < reference.rate - AUTOCAST_MARGIN:
        return (
            f"{agreed}, more than {AUTOCAST_MARGIN:.2%} below PyTorch's own bf16 autocast "
            f"({reference.rate:.2%})",
        )
    return None


def compare(reference: Sequence[Doc], candidate: Sequence[Doc]) -> AgreementReport:
    """The agreement of ``candidate`` with ``reference`` (the same texts, in order), for
    every annotation some reference document carries."""
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference documents, {len(candidate)} candidates")
    running = RunningAgreement(reference)
    for index, doc in enumerate(candidate):
        running.add(index, doc)
    return running.report(candidate)


def _spans(docs: Sequence[Doc]) -> Iterator[tuple[int, str, int, int, str]]:
    for index, doc in enumerate(docs):
        for key, group in doc.spans.items():
            for span in group:
                yield index, key, span.start, span.end, span.label_


#: The score at which a text category counts as assigned (spaCy's scorer's default).
CATS_THRESHOLD = 0.5


def _decided(doc: Doc, label: str) -> bool:
    """Whether ``doc`` is assigned ``label``: one decision per document and label, so a
    few hundred documents still give the gate enough units."""
    return doc.cats.get(label, 0.0) >= CATS_THRESHOLD


class RunningAgreement:
    """The agreement of a candidate's documents counted as they come, so a judge can stop
    at the first document after which no outcome of the rest could pass: the reference
    documents are all known, so each annotation's count of units is too, and the best
    the candidate can still reach is every unit left agreeing (:meth:`hopeless`). The
    verdict is the one the whole pass would give; only its cost is cut. Spans are left
    out (their units are the spans either pipeline found, not known beforehand): the
    whole pass still judges them."""

    def __init__(self, reference: Sequence[Doc]) -> None:
        self.reference = reference
        self.readers = {
            annotation: read
            for annotation, (name, read) in _TOKEN_READERS.items()
            if any(doc.has_annotation(name) for doc in reference)
        }
        tokens = sum(len(doc) for doc in reference)
        self.totals = {annotation: tokens for annotation in self.readers}
        if any(doc.cats for doc in reference):
            self.totals[Annotation.CATS] = sum(len(doc.cats) for doc in reference)
        self.same = dict.fromkeys(self.totals, 0)
        self.seen = dict.fromkeys(self.totals, 0)
        self.documents = 0

    def add(self, index: int, candidate: Doc) -> None:
        """Count ``candidate``, the candidate's document of the ``index``-th text."""
        expected = self.reference[index]
        for annotation, read in self.readers.items():
            self.seen[annotation] += len(expected)
            self.same[annotation] += sum(
                read(a) == read(b) for a, b in zip(expected, candidate, strict=True)
            )
        if Annotation.CATS in self.totals:
            self.seen[Annotation.CATS] += len(expected.cats)
            self.same[Annotation.CATS] += sum(
                _decided(expected, label) == _decided(candidate, label) for label in expected.cats
            )
        self.documents += 1

    def so_far(self) -> AgreementReport:
        """The rates of the documents counted so far."""
        return AgreementReport(
            tuple((a, Rate(self.same[a], self.seen[a])) for a in self.totals if self.seen[a])
        )

    def report(self, candidate: Sequence[Doc]) -> AgreementReport:
        """The agreement of every annotation, once each of ``candidate`` (the candidate's
        documents of all the texts, in order) was counted: the counted rates, with the
        spans' (their units are the spans either pipeline found)."""
        if self.documents != len(self.reference) or len(candidate) != len(self.reference):
            raise ValueError(f"{self.documents} of {len(self.reference)} documents counted")
        rates = [(a, Rate(self.same[a], self.seen[a])) for a in self.readers]
        expected_spans, found = set(_spans(self.reference)), set(_spans(candidate))
        if expected_spans or found:  # a candidate that invents spans disagrees too
            units = len(expected_spans | found)
            rates.append((Annotation.SPANS, Rate(len(expected_spans & found), units)))
        if Annotation.CATS in self.totals:
            cats = Annotation.CATS
            rates.append((cats, Rate(self.same[cats], self.seen[cats])))
        return AgreementReport(tuple(rates))

    def hopeless(
        self, bounds: AgreementBounds, floor: AgreementReport | None = None
    ) -> Said | None:
        """Why the candidate fails whatever the documents left hold (the refusal of its
        best case, every unit left agreeing, with the count that forced it), or None while
        it may still pass."""
        refused = self.hopeless_at(bounds, floor)
        return None if refused is None else refused[1]

    def hopeless_at(
        self, bounds: AgreementBounds, floor: AgreementReport | None = None
    ) -> tuple[Annotation, Said] | None:
        """The annotation that makes the candidate fail whatever the documents left hold,
        and why (see :meth:`hopeless`), or None."""
        best = AgreementReport(
            tuple(
                (a, Rate(self.same[a] + total - self.seen[a], total))
                for a, total in self.totals.items()
            )
        )
        refused = best.refused(bounds, floor)
        if refused is None:
            return None
        annotation, why = refused
        if not self.documents:
            return refused
        changed = self.seen[annotation] - self.same[annotation]
        return annotation, (
            *why,
            f" at best: {changed:,} changed in the first {self.documents} of "
            f"{len(self.reference)} texts, and judging stopped there",
        )
