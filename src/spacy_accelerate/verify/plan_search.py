"""The one search both int8 backends run: candidate plans built and judged in turn.

A backend lists its candidate plans (ONNX Runtime: all int8, then MatMuls back in float;
OpenVINO: static int8, dynamic int8, then layers back in float) and says how one is
built and judged. The fallback ladder is shared (:func:`sensitivity_ladder`): the units
(MatMuls, layers) whose int8 harms the outputs on the calibration texts most go back to
float first, and :func:`bisect_ladder` finds the fewest that pass. :class:`PlanSearch`
keeps what every search must keep: each refused plan with its reason and rates (shown in
the error and recorded in the cache entry's manifest), the plan served, and the error
raised when none may be served.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, Protocol, TypeVar

from spacy_accelerate import progress
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.errors import AccuracyError, AgreementError
from spacy_accelerate.verify.parity import ParityReport

S = TypeVar("S")
P = TypeVar("P")


class Verdict(Protocol):
    """An attempt at a plan: whether it passed."""

    @property
    def passed(self) -> bool: ...


V = TypeVar("V", bound=Verdict)


@dataclass(frozen=True)
class Judged(Generic[S]):
    """One candidate plan, built and judged: its session and parity report (None where
    the gate refused it before a report was kept), and why it is refused (None: it may
    be served)."""

    label: str
    session: S
    report: ParityReport | None
    refusal: str | None = None

    @property
    def passed(self) -> bool:
        return self.refusal is None


@dataclass
class PlanSearch(Generic[S]):
    """The record of one search: the refused plans with their reasons, in order."""

    refused: list[str] = field(default_factory=list)
    #: The refusals the pipeline's agreement decided (annotation, rate and bound).
    disagreements: list[str] = field(default_factory=list)
    #: How many plans were begun (:meth:`trying`).
    begun: int = 0

    def trying(self, label: str) -> None:
        """Say which plan is built and judged now (the progress display, see
        :mod:`spacy_accelerate.progress`)."""
        self.begun += 1
        progress.note(f"plan {self.begun}: {label}")

    def judged(
        self,
        label: str,
        session: S,
        report: ParityReport | None,
        refusal: str | None,
        *,
        described: str | None = None,
        by_agreement: bool = False,
    ) -> Judged[S]:
        """Record ``label``'s verdict (a refusal with its reason, the plan named as
        ``described`` where that says more than its label; ``by_agreement``: the
        pipeline's annotations refused it) and return it."""
        progress.advance()
        if refusal is not None:
            self.refused.append(f"{described or label}: {refusal}")
            if by_agreement:
                self.disagreements.append(f"{described or label}: {refusal}")
        return Judged(label, session, report, refusal)

    def note(self, text: str) -> None:
        """Record a plan that was not tried, and why."""
        self.refused.append(text)

    def first_passing(
        self, plans: Iterable[P], attempt: Callable[[P], Judged[S]]
    ) -> Judged[S] | None:
        """The first plan whose attempt passes, or the last failed attempt (None: no plan)."""
        last: Judged[S] | None = None
        for plan in plans:
            last = attempt(plan)
            if last.passed:
                return last
        return last

    def served(self, chosen: Judged[S]) -> tuple[S, ParityReport]:
        """``chosen``'s session, its report naming the plan and every refused one."""
        if chosen.report is None:
            raise ValueError(f"plan {chosen.label!r} was refused; it cannot be served")
        return chosen.session, replace(
            chosen.report, plan=chosen.label, refused=tuple(self.refused)
        )

    def tried(self) -> str:
        """The refused plans as the error messages list them."""
        return " | ".join(self.refused)

    def no_plan(self, advice: str) -> AccuracyError:
        """The error when no plan keeps the model within the gate; ``advice`` says what
        the user can do (in the terms of ``optimize()``'s keywords). An
        :class:`AgreementError` naming the last plan's annotation, rate and bound where
        the pipeline's agreement refused plans."""
        message = (
            "No int8 plan keeps this model within the gate, so no int8 model was served and "
            f"the pipeline is unchanged. {advice} Plans tried: {self.tried()}"
        )
        if self.disagreements:
            return AgreementError(message, finding=self.disagreements[-1])
        return AccuracyError(message)


def bisect_ladder(ladder: Sequence[P], attempt: Callable[[P], V]) -> V | None:
    """The attempt at the plan of ``ladder`` with the fewest steps that passes, or the failed
    attempt at its last plan (None for an empty ladder), for ladders of nested plans (each
    keeps the previous one's layers in float).

    The last plan (the most float layers) is tried first: when even that fails, fewer
    would too, and the refusal costs one attempt. Otherwise bisection finds the fewest
    that pass."""
    if not ladder:
        return None
    chosen = attempt(ladder[-1])
    low, high = 0, len(ladder) - 1
    while chosen.passed and low < high:
        middle = (low + high) // 2
        candidate = attempt(ladder[middle])
        if candidate.passed:
            chosen, high = candidate, middle
        else:
            low = middle + 1
    return chosen


def layer_harm(report: ParityReport, spec: EncoderSpec) -> list[float]:
    """Per layer (1-based order): how much the mean cosine of the pieces spaCy reads
    drops across it in ``report``'s model (the hidden states are the first outputs),
    measured on the calibration texts: each layer's own share of the error all-int8
    adds, which the agreement follows."""
    hidden = report.mean_cosine[: len(spec.hidden_state_names)]
    return [hidden[k - 1] - hidden[k] for k in range(1, len(hidden))]


def float_layer_ladder(harm: Sequence[float], most: int) -> list[tuple[int, ...]]:
    """The nested plans after all-int8 was refused, for :func:`bisect_ladder`: the most
    harmful layer (by ``harm``, 1-based order, see :func:`layer_harm`) back in float,
    then the two most harmful, ... up to ``most`` layers (each plan's layers sorted)."""
    by_layer = {layer: value for layer, value in enumerate(harm, start=1)}
    return [tuple(sorted(plan)) for plan in sensitivity_ladder(by_layer, most)]


U = TypeVar("U")


def sensitivity_ladder(harm: Mapping[U, float], most: int) -> list[tuple[U, ...]]:
    """The one fallback ladder of int8: the unit (a layer, a MatMul) whose int8 harms
    the calibration texts' outputs most back in float, then the two most harmful, ...
    up to ``most`` units, most harmful first in each plan. Nested, so that
    :func:`bisect_ladder` finds the fewest that pass."""
    ranked = sorted(harm, key=lambda unit: harm[unit], reverse=True)
    return [tuple(ranked[:count]) for count in range(1, min(most, len(ranked)) + 1)]
