"""The search of ``precision="auto"`` (:mod:`.auto_precision`): the candidates, how
each is served, raced and timed, and the choice it returns.

The search (:class:`AutoSearch`) stops where a candidate cannot win: the exact plans are
served first, and every lossy build then races the plan that would be served so far
before it is judged (an int8 search skips its ladder where its all-int8 plan cannot win;
see :mod:`~spacy_accelerate.verify.plan_search`). The ones that pass are timed side by
side on the calibration texts, in turns, and the fastest is served, a lossier one only
where it is faster by a margin (:func:`fastest`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any, cast

import torch
from spacy.language import Language

from spacy_accelerate import progress
from spacy_accelerate.errors import (
    AccuracyError,
    Advice,
    AgreementError,
    ConversionError,
    NoFasterPlanError,
    OutpacedError,
    ProviderUnavailableError,
    Said,
    joined,
    spelled,
)
from spacy_accelerate.options.config import OptimizeConfig, Precision, Provider, Workload
from spacy_accelerate.pipeline.patch import patch, revert, scoped
from spacy_accelerate.pipeline.shim import ShimLocation
from spacy_accelerate.planning.annotating import annotate
from spacy_accelerate.planning.judging import CalibrationSource
from spacy_accelerate.planning.recording import builtin_texts
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.serving.proxy import AcceleratedModule
from spacy_accelerate.verify.speed import LOSSY_MARGIN, Limits, Resumed, Rival, races

logger = logging.getLogger("spacy_accelerate")

#: How the messages, the log and the progress name the search.
_AUTO = Advice("precision", "auto")

#: The calibration tokens each candidate is timed on, per turn: enough for a stable
#: figure on a small model, few enough that timing every candidate stays a small part of
#: the search (measured: ``docs/accuracy.md``, "precision="auto"").
TIMED_TOKENS = 1500

#: How the log says what the candidates were timed on (``workload=``).
TIMED_AS = {
    Workload.BATCHES: "in batches",
    Workload.DOCUMENTS: "one document per call",
}

#: Turns of timing; each candidate's fastest turn counts.
TURNS = 2

#: Timed texts each candidate warms up on before its first turn.
WARM_UP_TEXTS = 4

#: Serves one concrete request on every transformer component (all or nothing), each
#: component's lossy build within the limits named for it.
Accelerate = Callable[[OptimizeConfig, Mapping[str, Limits]], None]


@dataclass(frozen=True)
class Candidate:
    """One plan ``auto`` may serve."""

    provider: Provider
    precision: Precision

    @property
    def label(self) -> str:
        return f"{self.provider.value} {self.precision.value}"

    def asked_in(self, config: OptimizeConfig) -> OptimizeConfig:
        """``config`` asking for this plan by name."""
        return replace(config, provider=self.provider, precision=self.precision)


@dataclass(frozen=True)
class Choice:
    """What the search found: the plan served, each passing plan's seconds on the timed
    texts, and each refused plan with its reason."""

    chosen: Candidate
    seconds: dict[str, float]
    refused: dict[str, str]
    #: What the plans were timed on: batches of the texts, or one document per call.
    workload: Workload = Workload.BATCHES

    def explain(self) -> str:
        """Why the plan won, and why each faster one lost, in one line."""
        won = self.seconds[self.chosen.label]
        timed = ", ".join(f"{label} {s:.3f} s" for label, s in sorted(self.seconds.items()))
        lost = "; ".join(f"{label}: {why}" for label, why in self.refused.items())
        return spelled(
            [
                _AUTO,
                f" chose {self.chosen.label} ({won:.3f} s on the timed calibration texts, "
                f"{TIMED_AS[self.workload]}; passing plans: {timed})"
                + (f"; refused: {lost}" if lost else ""),
            ]
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "chosen": asdict(self.chosen),
            "seconds": self.seconds,
            "refused": self.refused,
            "workload": self.workload.value,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Choice:
        chosen = data["chosen"]
        return cls(
            chosen=Candidate(Provider(chosen["provider"]), Precision(chosen["precision"])),
            seconds={str(k): float(v) for k, v in data["seconds"].items()},
            refused={str(k): str(v) for k, v in data["refused"].items()},
            workload=Workload(data.get("workload", Workload.BATCHES.value)),
        )


def timed_texts(texts: Sequence[str], tokens: int = TIMED_TOKENS) -> list[str]:
    """The first calibration texts holding about ``tokens`` whitespace-separated words."""
    chosen: list[str] = []
    count = 0
    for text in texts:
        if count >= tokens:
            break
        chosen.append(text)
        count += len(text.split())
    return chosen


#: The search ``auto`` runs: :class:`AutoSearch`'s pruned one, or every candidate built
#: and judged in full (``full_search()``, for benchmarks that check both choose alike).
_FULL_SEARCH: list[bool] = []


@contextmanager
def full_search() -> Iterator[None]:
    """Within this block, ``auto`` builds and judges every candidate in full, passing no
    rivals to their builds: what the pruned search must agree with."""
    _FULL_SEARCH.append(True)
    try:
        yield
    finally:
        _FULL_SEARCH.pop()


def stage(candidate: Candidate) -> int:
    """The order candidates are tried in, which is also how lossy each is: exact plans
    first (one parity check each), then the lossy plans judged as one model (bf16, fp16),
    then int8 (a plan search). So a costly search starts only once the cheap plans have
    set the bar it must clear, and a lossier plan must beat a less lossy one by a margin."""
    if candidate.precision is Precision.FP32:
        return 0
    return 2 if candidate.precision is Precision.INT8 else 1


@dataclass
class Served:
    """A candidate that passed: the modules it put in the shims and its timed turns."""

    candidate: Candidate
    modules: list[torch.nn.Module]
    turns: list[float]

    @property
    def seconds(self) -> float:
        return min(self.turns)


class AutoSearch:
    """One search of ``precision="auto"``: the candidates served in :func:`stage` order,
    each lossy one racing the plan that would be served so far before it is judged (by
    :data:`~spacy_accelerate.verify.speed.LOSSY_MARGIN` where that plan is less lossy), so
    that a plan that cannot win is never judged. The int8 searches run in
    two rounds: every backend's whole plans first (the last search goes on to its ladders
    at once), then, where none passed, the other ladders whose all-int8 plan can still
    beat the bar the first round set, each search taking up where it left. Each plan that passes
    is timed in the pipeline at once, then all of them in turns, and :func:`fastest` picks
    the one served (a lossier plan only where it beats a less lossy one by the margin)."""

    def __init__(
        self,
        nlp: Language,
        config: OptimizeConfig,
        locations: Sequence[ShimLocation],
        source: CalibrationSource,
        accelerate: Accelerate,
    ) -> None:
        self.nlp, self.config, self.locations = nlp, config, locations
        self.source, self.accelerate = source, accelerate
        self.texts = timed_texts(source.texts or builtin_texts())
        self.previous = [location.module for location in locations]
        self.served: dict[str, Served] = {}
        #: Each refused plan's reason, the error itself where one refused it (its advice
        #: spelled in the terms of whoever reads the error that lists it).
        self.refused: dict[str, Said] = {}
        self.unavailable: list[ProviderUnavailableError] = []
        self.prune = not _FULL_SEARCH

    def run(self, candidates: Sequence[Candidate]) -> Choice:
        judging = spelled([_AUTO, ": building and judging each candidate"])
        deferred: dict[str, tuple[Candidate, Resumed]] = {}
        ordered = sorted(candidates, key=stage)
        for candidate in progress.track(ordered, judging):
            progress.note(candidate.label)
            # An int8 search leaves its ladders for later while another one's whole plans
            # are still to come (they may set a higher bar); the last one need not.
            later = any(stage(other) == 2 for other in ordered[ordered.index(candidate) + 1 :])
            resume = self.serve(
                candidate, ladders=not (self.prune and stage(candidate) == 2 and later)
            )
            if resume is not None:
                deferred[candidate.label] = (candidate, resume)
        for label in list(deferred):  # the ladders, against the bar set since
            candidate, first = deferred.pop(label)
            resumed = self.can_win(candidate, first)
            if resumed is not None:
                progress.note(f"{candidate.label}: units back in float")
                self.serve(candidate, ladders=True, resumed=resumed)
            del first, resumed  # its models in memory, let go before the final race
        if not self.served:
            raise self.nothing_served()
        self.race()
        winner = self.winner()
        for location, module in zip(self.locations, winner.modules, strict=True):
            if isinstance(module, AcceleratedModule):
                patch(location, module)
            else:
                revert(location, module)
        refused = {label: spelled(why) for label, why in self.refused.items()}
        return Choice(winner.candidate, self.seconds(), refused, self.config.workload)

    def nothing_served(self) -> ProviderUnavailableError | AccuracyError:
        tried = joined(((f"{label}: ", *why) for label, why in self.refused.items()), "; ")
        if len(self.unavailable) == len(self.refused):
            return ProviderUnavailableError(
                _AUTO, " found no provider that can run here; tried: ", *tried
            )
        return AccuracyError(_AUTO, " found no plan that passes the gate; tried: ", *tried)

    def seconds(self) -> dict[str, float]:
        """Each passing plan's fastest turn so far."""
        return {label: served.seconds for label, served in self.served.items()}

    def winner(self) -> Served:
        """The passing plan that would be served now (:func:`fastest`, each plan ranked
        by how lossy it is: its :func:`stage`)."""
        ranks = {label: stage(served.candidate) for label, served in self.served.items()}
        return self.served[fastest(self.seconds(), ranks)]

    def bar(self, candidate: Candidate) -> tuple[Served, float] | None:
        """The plan ``candidate`` must outrun, and by how much: the plan that would be
        served now (:func:`fastest`), by :data:`~spacy_accelerate.verify.speed.LOSSY_MARGIN`
        where that plan is less lossy than ``candidate``, else by nothing (None: nothing
        passed yet). So a candidate that wins its race would also win the final choice."""
        if not self.served:
            return None
        winner = self.winner()
        lossier = stage(winner.candidate) < stage(candidate)
        return winner, LOSSY_MARGIN if lossier else 0.0

    def limits(
        self, candidate: Candidate, ladders: bool, resumed: Resumed | None = None
    ) -> dict[str, Limits]:
        """Per component, the limits of ``candidate``'s build: the bar's session to outrun
        (a lossy candidate, in the pruned search), whether its ladders may run now, and the
        first round a second one takes up (one transformer only: with more, which one's
        search left its ladders is not known, and each searches anew)."""
        bar = self.bar(candidate) if self.prune and stage(candidate) > 0 else None
        single = resumed if len(self.locations) == 1 else None
        limits: dict[str, Limits] = {}
        for index, location in enumerate(self.locations):
            module = bar[0].modules[index] if bar is not None else None
            rivals: tuple[Rival, ...] = ()
            if isinstance(module, AcceleratedModule) and bar is not None:
                rivals = (Rival(bar[0].candidate.label, module.session, bar[1]),)
            limits[location.component] = Limits(rivals=rivals, ladders=ladders, resumed=single)
        return limits

    def can_win(self, candidate: Candidate, first: Resumed) -> Resumed | None:
        """Where a deferred int8 search's second round takes up (``first``, with its base's
        race against the bar every whole plan has set since: raced again only where that
        bar is not the one the first round raced), or None where its all-int8 plan, the
        fastest plan of its ladders, no longer beats that bar: then none can."""
        bar = self.bar(candidate)
        if bar is None or len(self.locations) != 1:
            return first
        module = bar[0].modules[0]
        if not isinstance(module, AcceleratedModule):
            return first
        rival = Rival(bar[0].candidate.label, module.session, bar[1])
        raced = first.races_against((rival,))  # the bar may be the one it already raced
        if raced is None:
            session = cast(Session, first.base.session)
            raced = tuple(races(session, (rival,), self.source.full.items))
        if raced[-1].faster:
            return replace(first, races=raced)
        self.refused[candidate.label] += (
            f" | units back in float: not tried (its all-int8 plan was {raced[-1].finding()})",
        )
        return None

    def serve(
        self, candidate: Candidate, *, ladders: bool, resumed: Resumed | None = None
    ) -> Resumed | None:
        """Serve ``candidate`` as if asked for by name (within its limits; ``resumed``: an
        int8 search's second round), time it once in the pipeline, and put the previous
        modules back; a refusal is recorded. Returns where an int8 search that left its
        ladders for later, with an all-int8 plan that could win, takes up again, else
        None."""
        limits = self.limits(candidate, ladders, resumed)
        try:
            self.accelerate(candidate.asked_in(self.config), limits)
        except (AccuracyError, ProviderUnavailableError, ConversionError) as error:
            if isinstance(error, ProviderUnavailableError) and not isinstance(
                error, NoFasterPlanError
            ):
                self.unavailable.append(error)
            # Its parts, not the error: its traceback would hold the candidate's models.
            self.refused[candidate.label] = (
                error.finding if isinstance(error, AgreementError) else error.parts
            )
            logger.info("spacy-accelerate: auto precision: %s refused", candidate.label)
            if isinstance(error, OutpacedError) and isinstance(error.resume, Resumed):
                return error.resume
            return None
        self.refused.pop(candidate.label, None)
        modules = [location.module for location in self.locations]
        self.timed(modules, self.texts[:WARM_UP_TEXTS])  # the first pass pays for new shapes
        self.served[candidate.label] = Served(candidate, modules, [self.timed(modules)])
        for location, module in zip(self.locations, self.previous, strict=True):
            revert(location, module)
        return None

    def timed(self, modules: Sequence[torch.nn.Module], texts: Sequence[str] = ()) -> float:
        """Seconds of the pipeline over ``texts`` (the timed texts by default) with
        ``modules`` in the shims (in this thread only: other threads keep annotating with
        what they run)."""
        with ExitStack() as stack:
            for location, module in zip(self.locations, modules, strict=True):
                stack.enter_context(scoped(location, module))
            start = time.perf_counter()
            if self.config.workload is Workload.DOCUMENTS:
                for text in texts or self.texts:  # as a service calls it
                    self.nlp(text)
            else:
                annotate(self.nlp, texts or self.texts)
            return time.perf_counter() - start

    def race(self) -> None:
        """Every passing plan timed again, in turns (the first turn was taken when each was
        served, after a warm-up, right after its build); each one's fastest turn counts. No
        plan is left out on its first turn alone: on a shared machine one turn can take
        several times its usual time (docs/performance.md), and would serve another plan."""
        labels = ", ".join(self.served)
        racing = spelled([_AUTO, f": racing {labels} on the calibration texts"])
        for _ in progress.track(range(TURNS - 1), racing):
            for served in self.served.values():
                served.turns.append(self.timed(served.modules))


def fastest(seconds: Mapping[str, float], ranks: Mapping[str, int]) -> str:
    """The label of the plan to serve: the fastest of the least lossy rank (``ranks``:
    each label's :func:`stage`), replaced by the fastest of each lossier rank in turn only
    where it beats the plan chosen so far by more than
    :data:`~spacy_accelerate.verify.speed.LOSSY_MARGIN`. Within the margin, the timing's
    noise could pick a plan that changes more annotations for nothing."""
    chosen: str | None = None
    for rank in sorted(set(ranks[label] for label in seconds)):
        best = min((label for label in seconds if ranks[label] == rank), key=seconds.__getitem__)
        if chosen is None or seconds[best] < seconds[chosen] * (1 - LOSSY_MARGIN):
            chosen = best
    if chosen is None:
        raise ValueError("fastest() needs at least one timed plan")
    return chosen
