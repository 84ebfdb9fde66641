"""The one int8 search both backends run: plans raced first, judged in speed order.

A backend supplies a :class:`Quantizer`: its whole plans (each made by one quantization:
ONNX Runtime's dynamic int8; OpenVINO's static and dynamic int8), the float plan it serves
here (every plan must outrun it, :mod:`.speed`), and its ladders of plans with units back
in float (ONNX Runtime's MatMuls, OpenVINO's layers), ranked by how much each unit's int8
harms the outputs on the calibration texts (:func:`sensitivity_ladder`). The search
(:class:`Int8Search`) is the same for both:

1. every whole plan is built and raced against the rivals (the backend's float plan and,
   under ``precision="auto"``, the fastest plan that already passed); a plan that loses is
   never judged, and one slower by construction than a plan that lost
   (:meth:`Quantizer.faster_plan`: the same kernel on finer blocks) is not even built;
2. the winners are judged in speed order (the token cosine, then the pipeline's
   agreement), and the first that passes is served: every later one is slower;
3. where none passes, a ladder is searched only if its base (the all-int8 plan, the
   fastest plan of its ladder, since every float unit costs time) won its race. Races
   alone then find how many of its plans can still win (:meth:`Int8Search.fast_prefix`,
   starting from the base's race),
   and :func:`bisect_ladder` finds, among those only, the fewest float units that pass.
   Where the base lost, the ladder and ONNX Runtime's per-MatMul harm measurement are
   skipped, and the record says so. Under ``precision="auto"`` a search may leave its
   ladders for later (:attr:`~.speed.Limits.ladders`); its second round takes up where
   the first left (:class:`~.speed.Resumed`), its whole plans not built again.

Every plan refused, with its reason and rates, is kept (shown in the error and recorded in
the cache entry's manifest), and the files of every plan but the served one are removed.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Generic, Protocol, TypeVar, cast

from spacy_accelerate import progress
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.cpu_features import cpu_features
from spacy_accelerate.errors import (
    AccuracyError,
    Advice,
    AgreementError,
    NoFasterPlanError,
    OutpacedError,
    Said,
    joined,
    spelled,
)
from spacy_accelerate.options.gate import Gate
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.verify.agreement import AgreementReport
from spacy_accelerate.verify.calibration import Judge
from spacy_accelerate.verify.parity import ParityReport
from spacy_accelerate.verify.record import BuildRecord, BuiltModel
from spacy_accelerate.verify.speed import (
    LOSSY_MARGIN,
    NO_LIMITS,
    Limits,
    Race,
    Resumed,
    Rival,
    races,
)

logger = logging.getLogger("spacy_accelerate")

#: The search's rule, in both backends' cache keys: a changed search may serve another plan.
SEARCH_RULE = (
    f"whole plans raced against the float plan (by {LOSSY_MARGIN:.0%}) and judged fastest "
    "first; then units back in float by harm measured on unpadded rows, bisected, where "
    "all-int8 outruns it"
)

S = TypeVar("S", bound=Session)
P = TypeVar("P")
U = TypeVar("U")


class PlanUnavailable(Exception):
    """A whole plan this runtime cannot make here (its message says which and why): the
    search notes it and goes on with the others."""


class Verdict(Protocol):
    """An attempt at a plan: whether it passed."""

    @property
    def passed(self) -> bool: ...


V = TypeVar("V", bound=Verdict)


@dataclass(frozen=True)
class Built(Generic[S, P]):
    """A plan's model, written and opened: its session, how to measure its parity to
    PyTorch without a gate (``measure``: only a plan that is judged or ranks a ladder's
    units needs it, so a plan that loses its race never pays for it), and, where the
    backend can tell, what its MatMuls were compiled as."""

    plan: P
    label: str
    session: S
    measure: Callable[[], ParityReport]
    compiled_as: str | None = None

    @cached_property
    def report(self) -> ParityReport:
        """The parity to PyTorch (measured once, on first use): a refused all-int8
        model's report still ranks the layers."""
        return self.measure()


@dataclass(frozen=True)
class Judged(Generic[S, P]):
    """A built plan and why it is refused (None: it may be served)."""

    built: Built[S, P]
    refusal: Said | None = None
    #: The report under the gate, and the pipeline's agreement where it was judged.
    report: ParityReport | None = None
    agreement: AgreementReport | None = None

    @property
    def passed(self) -> bool:
        return self.refusal is None


class Quantizer(ABC, Generic[S, P]):
    """What a backend gives the int8 search: its plans, how one is built, the float plan
    to beat, and what to tell a user whose model no plan serves."""

    #: What the user can do when no plan passes, the options it names as
    #: :class:`~spacy_accelerate.errors.Advice`.
    advice: Said = ()
    #: What to ask for where no int8 plan outruns the float plan (``precision='fp32'``).
    instead: Said = (Advice("precision", "fp32"),)

    @abstractmethod
    def whole_plans(self) -> Sequence[P]:
        """The plans made by one quantization each, in the order they are built."""

    @abstractmethod
    def label(self, plan: P) -> str:
        """How the manifest, the served summary and the errors name ``plan``."""

    @abstractmethod
    def build(self, plan: P) -> Built[S, P]:
        """Write ``plan``'s model and open it, its parity measured without a gate."""

    @abstractmethod
    def baseline(self) -> Rival:
        """The float plan this backend serves here, which every int8 plan must outrun."""

    @abstractmethod
    def ladder_base(self) -> P:
        """The whole plan whose units the ladders put back in float (all-int8)."""

    @abstractmethod
    def ladders(self, base: Built[S, P]) -> Iterator[Sequence[P]]:
        """The ladders after every whole plan was refused, one after another (each
        nested, for :func:`bisect_ladder`; the next one only where the last one had
        no plan that passes)."""

    def faster_plan(self, plan: P) -> P | None:
        """A whole plan listed before ``plan`` that is faster by construction (the same
        kernels on coarser blocks): where that one loses its race, ``plan`` is not built."""
        return None

    def float_share(self, plan: P) -> float | None:
        """The share (0 to 1) of the model's quantizable work a ladder's ``plan`` keeps in
        float, where the backend knows it: a plan's time grows with that work, not with
        its count of units (a feed-forward MatMul is four times an attention one). None:
        the search interpolates by the plans' places in the ladder."""
        return None

    def carry(self) -> object | None:
        """What this search made that a second round of ``auto``'s search can reuse
        instead of making again (models in memory), taken when its ladders are left for
        later and handed back through :attr:`~.speed.Resumed.carried`; None: nothing."""
        return None

    def not_as_named(self, built: Built[S, P]) -> str | None:
        """Why ``built`` does not compute what its label says here (None: it does)."""
        return None

    @abstractmethod
    def serve(self, built: Built[S, P]) -> None:
        """Make ``built``'s files the ones the cache entry serves."""

    @abstractmethod
    def discard(self) -> None:
        """Remove every candidate's files (after :meth:`serve`, all but the served)."""


class Int8Search(Generic[S, P]):
    """One search over a :class:`Quantizer`'s plans (see the module's docstring); holds
    the record: every refused plan with its reason, in order."""

    def __init__(
        self,
        quantizer: Quantizer[S, P],
        *,
        gate: Gate,
        judge: Judge | None,
        items: Sequence[EncoderInputs],
        limits: Limits = NO_LIMITS,
    ) -> None:
        self.quantizer, self.gate, self.judge, self.items = quantizer, gate, judge, items
        #: Rivals from outside the backend (``precision="auto"``'s passing plans).
        self.outside = limits.rivals
        self.limits = limits
        self.refused: list[Said] = []
        self.disagreements: list[Said] = []
        self.begun = 0
        self.built: dict[str, Built[S, P]] = {}  # by label: each plan is built once
        self.races: dict[str, list[Race]] = {}  # by label: its races, up to the first lost
        #: Whether a plan was passed over for speed by an outside rival.
        self.outrun_from_outside = False
        #: Where a second round takes up, where the ladders were left for later
        #: (:attr:`Limits.ladders`).
        self.deferred: Resumed | None = None
        #: Whether speed had the last word: the ladder skipped because its base lost its
        #: race, or the ladder's plan that passed losing its own.
        self.too_slow = False
        resumed = limits.resumed
        if resumed is not None:  # the second round: the first one's base and notes
            base: Built[S, P] = resumed.base
            self.refused.extend(resumed.notes)
            self.disagreements.extend(resumed.disagreements)
            self.outrun_from_outside = resumed.outrun_from_outside
            self.built[base.label] = base
            # Only against rivals from outside: the backend's own is built when first raced.
            known = resumed.races_against(self.outside) if self.outside else None
            if known is not None:
                self.races[base.label] = list(known)

    @property
    def rivals(self) -> tuple[Rival, ...]:
        """The plans to outrun: ``auto``'s where given (the fastest that passed, among them
        this backend's own float plan where it was a candidate), else the backend's own."""
        return self.outside or (self.quantizer.baseline(),)

    # ---------------------------------------------------------------- the steps

    def run(self) -> BuiltModel:
        """The served plan's session, report and record (naming it and every refused
        plan), or the refusal (:meth:`refusal`); every other candidate's files are
        removed."""
        try:
            # A second round goes straight to the ladders: the first refused every whole plan.
            whole = self.whole() if self.limits.resumed is None else None
            chosen = whole or self.ladder()
            if chosen is None:
                raise self.refusal()
            self.quantizer.serve(chosen.built)
        finally:
            self.quantizer.discard()
        assert chosen.report is not None
        logger.info("int8 plan %r served", chosen.built.label)
        record = BuildRecord(
            plan=chosen.built.label,
            refused=tuple(spelled(note) for note in self.refused),
            compiled_as=chosen.built.compiled_as,
            agreement=chosen.agreement,
        )
        return BuiltModel(chosen.built.session, chosen.report, record)

    def whole(self) -> Judged[S, P] | None:
        """Step 1 and 2: the whole plans built and raced, the winners judged fastest
        first; the first that passes, or None. A plan slower by construction than one
        that lost its race (:meth:`Quantizer.faster_plan`) is not even built."""
        winners: list[tuple[float, Built[S, P]]] = []
        for plan in self.quantizer.whole_plans():
            candidate = self.whole_plan(plan)
            if candidate is None:
                continue
            lost = self.race(candidate)
            if lost is not None:
                self.note(f"{candidate.label}: {lost.finding()} (not judged)")
            else:
                winners.append((self.speed(candidate), candidate))
        for _speed, candidate in sorted(winners, key=lambda pair: pair[0]):
            judged = self.judged(candidate)
            if judged.passed:
                return judged
        return None

    def whole_plan(self, plan: P) -> Built[S, P] | None:
        """Whole ``plan`` built, or None where it cannot win or be made here (noted)."""
        faster = self.quantizer.faster_plan(plan)
        if faster is not None and self.quantizer.label(faster) in self.races:
            lost = self.race(self.build(faster))
            if lost is not None:
                self.note(
                    f"{self.quantizer.label(plan)}: not tried (slower than "
                    f"{self.quantizer.label(faster)}, which was {lost.finding()})"
                )
                return None
        try:
            return self.build(plan)
        except PlanUnavailable as unavailable:
            self.note(str(unavailable))
            return None

    def ladder(self) -> Judged[S, P] | None:
        """Step 3: the fewest float units that pass, where the ladder's base can win."""
        base_plan = self.quantizer.ladder_base()
        base = self.build(base_plan)
        lost = self.race(base)
        if lost is not None:
            self.note(
                f"units back in float: not tried ({base.label}, the fastest plan of its "
                f"ladder, was {lost.finding()})"
            )
            self.too_slow = True
            return None
        if not self.limits.ladders:
            self.deferred = Resumed(
                tuple(self.refused),
                base,
                races=tuple(self.races[base.label]),
                outrun_from_outside=self.outrun_from_outside,
                disagreements=tuple(self.disagreements),
                carried=self.quantizer.carry(),
            )
            self.note("units back in float: left until every backend's whole plans are known")
            return None
        for ladder in self.quantizer.ladders(base):
            fast = self.fast_prefix(ladder, base)
            chosen = bisect_ladder(ladder[:fast], self.attempt)
            if chosen is not None and chosen.passed:
                return chosen
            if fast < len(ladder):  # the more careful plans were too slow
                lost = self.race(self.build(ladder[fast]))
                assert lost is not None
                label = self.quantizer.label(ladder[fast])
                self.note(f"{label}: {lost.finding()}, and every plan with more float units")
                self.too_slow = True
                return None  # the next ladder's plans are slower still
        return None

    def fast_prefix(self, ladder: Sequence[P], base: Built[S, P] | None = None) -> int:
        """How many of ``ladder``'s plans (nested: each slower than the one before) win
        their race, found on races alone: no plan is judged that could not be served for
        speed. Between the last plan known to win and the first known to lose, the next
        plan raced is where the two plans' race slack interpolates to the bar (a plan's
        time grows about linearly with its float units), and the middle one wherever the
        last two races did not halve the plans left between them, so a noisy curve still
        takes no more races than bisection's twice.

        The ladder's ``base`` (no unit in float), where it won its race, is the first plan
        known to win, so the first plan of the ladder need not be raced on its own. The
        first known to lose is the plan past the ladder's end, every unit in float: the
        backend's float plan, as fast as a rival at best (:meth:`all_float_slack`), which
        no lossy plan may merely equal. It is never raced: where it would win after all,
        the search still ends on the ladder's last plan, raced."""
        if not ladder:
            return 0
        known = base is not None and self.race(base) is None
        if not known and self.race(self.build(ladder[0])) is not None:
            return 0
        # Index -1 is the base, len(ladder) the all-float plan past the ladder's end.
        wins, loses = (-1 if known else 0), len(ladder)
        widths = [loses - wins]
        while loses - wins > 1:
            middle = (wins + loses) // 2
            if len(widths) < 3 or 2 * widths[-1] <= widths[-3]:
                won = base if wins < 0 else self.build(ladder[wins])
                assert won is not None
                low = self.slack_of(won)
                high = self.slack(ladder[loses]) if loses < len(ladder) else self.all_float_slack
                fraction = (1.0 - low) / max(high - low, 1e-9)
                guess = self.interpolated(ladder, wins, loses, fraction)
                middle = min(max(guess, wins + 1), loses - 1)
            if self.race(self.build(ladder[middle])) is None:
                wins = middle
            else:
                loses = middle
            widths.append(loses - wins)
        return wins + 1

    def interpolated(self, ladder: Sequence[P], wins: int, loses: int, fraction: float) -> int:
        """The last plan between ``wins`` and ``loses`` (places in ``ladder``; -1 its base,
        ``len(ladder)`` the all-float plan) at ``fraction`` of the way from one to the
        other: by the plans' float work (:meth:`Quantizer.float_share`) where the backend
        gives it, else by their places."""
        shares = [self.quantizer.float_share(plan) for plan in ladder]
        if any(share is None for share in shares):
            return wins + int(fraction * (loses - wins))
        known = cast(list[float], shares)
        low = 0.0 if wins < 0 else known[wins]
        high = 1.0 if loses >= len(ladder) else known[loses]
        target = low + fraction * (high - low)
        return max((i for i in range(wins + 1, loses) if known[i] <= target), default=wins + 1)

    @property
    def all_float_slack(self) -> float:
        """The race slack of a plan as fast as the rivals (the float plan a ladder's
        units return to): 1 over the share of their time a lossy plan must beat."""
        return max(1.0 / (1.0 - rival.margin) for rival in self.rivals)

    # ---------------------------------------------------------------- one plan

    def build(self, plan: P) -> Built[S, P]:
        """``plan`` built once per search (a whole plan is also its ladder's base)."""
        label = self.quantizer.label(plan)
        if label not in self.built:
            self.begun += 1
            progress.note(f"plan {self.begun}: {label}")
            self.built[label] = self.quantizer.build(plan)
        return self.built[label]

    def race(self, built: Built[S, P]) -> Race | None:
        """The first race ``built`` loses against the rivals (None: it wins them all);
        each plan is raced once."""
        if built.label not in self.races:
            progress.note(f"racing {built.label}")
            self.races[built.label] = races(built.session, self.rivals, self.items)
            lost = self.races[built.label][-1]
            if not lost.faster:
                outside = {rival.name for rival in self.outside}
                self.outrun_from_outside |= lost.baseline_name in outside
        last = self.races[built.label][-1]
        return None if last.faster else last

    def speed(self, built: Built[S, P]) -> float:
        """``built``'s time relative to the first rival's in their race (smaller is
        faster): the order the winners are judged in."""
        first = self.race_record(built)[0]
        return first.candidate / first.baseline

    def slack(self, plan: P) -> float:
        """How close ``plan`` (raced) came to losing: its largest
        :attr:`~spacy_accelerate.verify.speed.Race.slack` (1 or more: it lost)."""
        return self.slack_of(self.build(plan))

    def slack_of(self, built: Built[S, P]) -> float:
        return max(race.slack for race in self.race_record(built))

    def race_record(self, built: Built[S, P]) -> list[Race]:
        self.race(built)
        return self.races[built.label]

    def attempt(self, plan: P) -> Judged[S, P]:
        """A ladder's plan built and judged."""
        return self.judged(self.build(plan))

    def judged(self, built: Built[S, P]) -> Judged[S, P]:
        """``built`` held to the token cosine gate, then to the pipeline's agreement."""
        progress.advance()
        report = replace(built.report, gate=self.gate)
        named = self.quantizer.not_as_named(built)
        refusal: Said | None = None if named is None else (named,)
        if refusal is None and not report.passed:
            refusal = (
                f"{self.gate.describe()} not met (mean cosine {report.worst_mean_cosine:.5f}, "
                f"smallest {report.worst_cosine:.5f})",
            )
        agreement = None
        if refusal is None and self.judge is not None:
            try:
                agreement = self.judge(built.session)
            except AgreementError as error:
                refusal = error.finding
                self.disagreements.append((f"{built.label}: ", *refusal))
        if refusal is not None:
            self.note((f"{built.label}: ", *refusal))
        logger.info("int8 plan %r: %s", built.label, spelled(refusal or ("passed",)))
        return Judged(built, refusal, report, agreement)

    def note(self, text: str | Said) -> None:
        """Record a plan refused or not tried, and why."""
        self.refused.append((text,) if isinstance(text, str) else text)

    # ---------------------------------------------------------------- refusals

    def tried(self) -> Said:
        """The refused plans as the error messages list them."""
        return joined(self.refused, " | ")

    def refusal(self) -> AccuracyError | NoFasterPlanError:
        """Why no plan may be served: :class:`OutpacedError` where a rival from outside
        (``auto``'s) passed a plan over (not stored: another request would search on),
        :class:`NoFasterPlanError` where speed had the last word (the ladder could not win),
        otherwise an :class:`AgreementError` naming the last plan's annotation, rate and
        bound (or an :class:`AccuracyError` where the token cosine refused them)."""
        names = " and ".join(rival.name for rival in self.rivals)
        if self.outrun_from_outside or self.deferred is not None:
            return OutpacedError(
                f"No int8 plan keeps this model within the gate and runs faster than {names} "
                "here. Plans tried: ",
                *self.tried(),
                resume=self.deferred,
            )
        if self.too_slow:
            baseline = self.quantizer.baseline().name
            return NoFasterPlanError(
                f"No int8 plan both keeps this model within the gate and runs faster than "
                f"{baseline} on this CPU ({cpu_features().describe()}), so no int8 model was "
                "served and the pipeline is unchanged. Use ",
                *self.quantizer.instead,
                " here. Plans tried: ",
                *self.tried(),
            )
        message: Said = (
            "No int8 plan keeps this model within the gate, so no int8 model was served and "
            "the pipeline is unchanged. ",
            *self.quantizer.advice,
            " Plans tried: ",
            *self.tried(),
        )
        if self.disagreements:
            return AgreementError(*message, finding=self.disagreements[-1])
        return AccuracyError(*message)


def bisect_ladder(ladder: Sequence[P], attempt: Callable[[P], V]) -> V | None:
    """The attempt at the plan of ``ladder`` with the fewest steps that passes, or the failed
    attempt at its last plan (None for an empty ladder), for ladders of nested plans (each
    keeps the previous one's units in float).

    The last plan (the most float units) is tried first: when even that fails, fewer
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


def sensitivity_ladder(harm: Mapping[U, float], most: int) -> list[tuple[U, ...]]:
    """The one fallback ladder of int8: the unit (a layer, a MatMul) whose int8 harms
    the calibration texts' outputs most back in float, then the two most harmful, ...
    up to ``most`` units, most harmful first in each plan. Nested, so that
    :func:`bisect_ladder` finds the fewest that pass."""
    ranked = sorted(harm, key=lambda unit: harm[unit], reverse=True)
    return [tuple(ranked[:count]) for count in range(1, min(most, len(ranked)) + 1)]


def float_layer_ladder(harm: Sequence[float], most: int) -> list[tuple[int, ...]]:
    """The nested plans of whole layers (by ``harm``, 1-based, see :func:`layer_harm`)
    back in float, up to ``most`` layers, each plan's layers sorted."""
    by_layer = {layer: value for layer, value in enumerate(harm, start=1)}
    return [tuple(sorted(plan)) for plan in sensitivity_ladder(by_layer, most)]
