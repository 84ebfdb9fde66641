"""``min_agreement``: how often each annotation of a lossy plan must stay as PyTorch's.

Every lossy plan (int8, bf16, fp16, on every backend) is judged the same way: the whole
pipeline annotates the calibration texts, and each annotation it sets is compared with
what PyTorch fp32 set (:mod:`spacy_accelerate.verify.agreement`). ``min_agreement`` is
the bound of each: one number for all of them, or a mapping from annotation name to
bound (the others keep their defaults); 1.0 means no unit may change.

The defaults (:data:`DEFAULT_BOUNDS`) and the measurements behind them are in
``docs/accuracy.md``: each is below what PyTorch's own bf16 autocast keeps of the reference
pipeline's annotations (the 95% lower bound of its rate), so a plan as faithful as the
change a PyTorch user accepts passes; dependencies (head and label together) sit lower
than tags, because a transition parser turns one changed decision into several changed
arcs; span and text categories are fewer, larger units.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from spacy_accelerate.errors import Advice, InvalidOptionError


class Annotation(str, Enum):
    """An annotation a spaCy pipeline sets, compared per token (per span for span
    categories, per document for text categories)."""

    TAG = "tag"
    POS = "pos"
    MORPH = "morph"
    LEMMA = "lemma"
    DEP = "dep"
    SENT_START = "sent_start"
    ENT = "ent"
    SPANS = "spans"
    CATS = "cats"


DEFAULT_BOUNDS: Mapping[Annotation, float] = {
    Annotation.TAG: 0.995,
    Annotation.POS: 0.995,
    Annotation.MORPH: 0.995,
    Annotation.LEMMA: 0.995,
    Annotation.DEP: 0.98,
    Annotation.SENT_START: 0.995,
    Annotation.ENT: 0.995,
    Annotation.SPANS: 0.99,
    Annotation.CATS: 0.99,
}


@dataclass(frozen=True)
class AgreementBounds:
    """The bound of each annotation: ``uniform`` for all (None: the defaults), then
    ``overrides`` per annotation name."""

    uniform: float | None = None
    overrides: tuple[tuple[Annotation, float], ...] = ()

    def bound(self, annotation: Annotation) -> float:
        given = dict(self.overrides)
        if annotation in given:
            return given[annotation]
        return self.uniform if self.uniform is not None else DEFAULT_BOUNDS[annotation]

    def resolved(self) -> dict[str, float]:
        """Every annotation's bound (what the cache key records)."""
        return {annotation.value: self.bound(annotation) for annotation in Annotation}

    def as_option(self) -> float | dict[str, float] | None:
        """The value of ``min_agreement`` that gives these bounds."""
        if not self.overrides:
            return self.uniform
        named = {annotation.value: bound for annotation, bound in self.overrides}
        if self.uniform is not None:
            others = (a for a in Annotation if a not in dict(self.overrides))
            named.update({annotation.value: self.uniform for annotation in others})
        return named


DEFAULT_AGREEMENT = AgreementBounds()


def _is_bound(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1


def parse_min_agreement(value: float | Mapping[str, float] | None) -> AgreementBounds:
    """``min_agreement`` as given (a number, a mapping of annotation names to numbers,
    or None for the defaults), checked."""
    names = ", ".join(repr(a.value) for a in Annotation)
    if value is None:
        return DEFAULT_AGREEMENT
    if _is_bound(value):
        return AgreementBounds(uniform=float(value))  # type: ignore[arg-type]
    if isinstance(value, Mapping) and value:
        overrides: list[tuple[Annotation, float]] = []
        for name, bound in value.items():
            try:
                annotation = Annotation(str(name).strip().lower())
            except ValueError:
                raise InvalidOptionError(
                    Advice("min_agreement"),
                    f" has no annotation {name!r}; name one of {names}.",
                ) from None
            if not _is_bound(bound):
                raise InvalidOptionError(
                    Advice("min_agreement", item=str(name)),
                    f" must be a number in (0, 1], got {bound!r}.",
                )
            if annotation in dict(overrides):
                raise InvalidOptionError(
                    Advice("min_agreement"), f" names {annotation.value!r} twice."
                )
            overrides.append((annotation, float(bound)))
        return AgreementBounds(overrides=tuple(sorted(overrides, key=lambda o: o[0].value)))
    defaults = ", ".join(f"{a.value} {b:.1%}" for a, b in DEFAULT_BOUNDS.items())
    raise InvalidOptionError(
        Advice("min_agreement"),
        " must be a number in (0, 1] or a mapping of annotation names to such "
        f"numbers (names: {names}), got {value!r}. The share of calibration units whose "
        f"annotation must stay as PyTorch fp32's for a lossy plan to be served; defaults: "
        f"{defaults}.",
    )
