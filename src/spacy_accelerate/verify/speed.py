"""Whether a lossy plan runs faster here than the plans it would replace.

A lossy plan is only worth serving where it beats what this machine already serves without
losing anything, and, under ``precision="auto"``, the fastest plan that passed so far.
Which plan wins depends on the CPU, not only on the model: on an AMX Xeon, int8 weights
decompressed to bf16 ran slower than plain bf16, and on a CPU without VNNI int8 arithmetic
gains little. So a candidate is raced against each :class:`Rival` on the calibration spans,
the two alternating (these machines are shared and noisy), and must beat it by the rival's
margin. Races run before the agreement is judged: a plan that cannot win is never judged.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.errors import Said
from spacy_accelerate.runtime.session import Session

#: Calibration items per timed pass at most, and alternating rounds (the medians are
#: compared).
TIMED_ITEMS = 4
ROUNDS = 3

#: A timed pass holds as many items (up to :data:`TIMED_ITEMS`) as the rival takes this
#: long for: enough to rise above the timer's noise on a small model, few enough that a
#: large model's race takes seconds.
PASS_SECONDS = 0.25

#: How much faster a lossier plan must be than a less lossy one to be chosen (int8 than
#: bf16 or fp32, bf16 than fp32): within that, the timing's noise could pick a plan that
#: changes more annotations for nothing.
LOSSY_MARGIN = 0.05


#: Seconds between two timed passes: a runtime's worker threads spin for a while after a
#: run (ONNX Runtime's do by default), and would slow the other session's pass down.
SETTLE_SECONDS = 0.05


def seconds_per_pass(session: Session, items: Sequence[EncoderInputs]) -> float:
    """Wall time of one run of ``session`` over ``items`` (the last hidden state only, as a
    pipeline whose listeners read the last layer asks for), after the other session's
    threads have settled."""
    last = session.output_names[-1:]
    time.sleep(SETTLE_SECONDS)
    start = time.perf_counter()
    for item in items:
        session.run(item, last)
    return time.perf_counter() - start


@dataclass(frozen=True)
class Race:
    """A candidate's and a rival's median seconds over the same timed items; the
    candidate wins when it is faster than ``1 - margin`` of the rival's time."""

    candidate: float
    baseline: float
    baseline_name: str
    items: int
    margin: float = 0.0

    @property
    def faster(self) -> bool:
        return self.slack < 1.0

    @property
    def slack(self) -> float:
        """The candidate's time over the time it had to beat (below 1: it won)."""
        return self.candidate / (self.baseline * (1.0 - self.margin))

    def finding(self) -> str:
        by = f" by {self.margin:.0%}" if self.margin else ""
        return (
            f"not faster than {self.baseline_name}{by} on this CPU ({1000 * self.candidate:.0f} "
            f"ms vs {self.baseline_name} {1000 * self.baseline:.0f} ms over {self.items} "
            "calibration batches)"
        )


def race(
    candidate: Session,
    baseline: Session,
    items: Sequence[EncoderInputs],
    name: str,
    margin: float = 0.0,
) -> Race:
    """Time ``candidate`` and ``baseline`` (sessions) on the first calibration ``items``,
    each warmed up once on the first item, then alternating for :data:`ROUNDS` rounds
    over as many items as make a pass of about :data:`PASS_SECONDS` (up to
    :data:`TIMED_ITEMS`). The rounds stop once the rounds left could not change the
    verdict of the medians (:func:`decided`)."""
    seconds_per_pass(candidate, items[:1])
    one = seconds_per_pass(baseline, items[:1])
    count = max(1, min(TIMED_ITEMS, len(items), math.ceil(PASS_SECONDS / max(one, 1e-6))))
    timed = list(items[:count])
    mine: list[float] = []
    theirs: list[float] = []
    while len(mine) < ROUNDS and not decided(mine, theirs, margin):
        mine.append(seconds_per_pass(candidate, timed))
        theirs.append(seconds_per_pass(baseline, timed))
    return Race(statistics.median(mine), statistics.median(theirs), name, len(timed), margin)


def median_bounds(known: Sequence[float], rounds: int = ROUNDS) -> tuple[float, float]:
    """The least and the most the median of ``rounds`` passes can be, with ``known`` of
    them timed (``rounds`` odd): the rounds left may land anywhere."""
    left, middle = rounds - len(known), rounds // 2
    ordered = sorted(known)
    low = ordered[middle - left] if middle - left >= 0 else 0.0
    high = ordered[middle] if middle < len(ordered) else math.inf
    return low, high


def decided(mine: Sequence[float], theirs: Sequence[float], margin: float) -> bool:
    """Whether the candidate's passes (``mine``) and the rival's (``theirs``) so far settle
    the race whatever the rounds left time: so a plan three times slower stops after two
    rounds, and the verdict is the one all :data:`ROUNDS` would give."""
    if not mine:
        return False
    mine_low, mine_high = median_bounds(mine)
    theirs_low, theirs_high = median_bounds(theirs)
    bar = 1.0 - margin
    return mine_high < theirs_low * bar or mine_low >= theirs_high * bar


@dataclass(frozen=True)
class Rival:
    """A plan a lossy candidate must outrun: its name (``openvino bf16``), its session and
    by how much (:data:`LOSSY_MARGIN` against a less lossy plan, nothing against one as
    lossy that already passed)."""

    name: str
    session: Session
    margin: float = LOSSY_MARGIN


@dataclass(frozen=True)
class Resumed:
    """The first round of an int8 search that refused every whole plan and left its
    ladders for later (:attr:`Limits.ladders`): what its second round starts from, so that
    no whole plan is quantized, raced or judged twice."""

    #: Every plan the first round refused or did not try, and why.
    notes: tuple[Said, ...]
    #: The ladders' base (the all-int8 plan) as the first round built it: a plan search's
    #: ``Built``, whose session a wider search races against the bar set since.
    base: Any
    #: The base's latest races, each naming the rival it ran against: reused where the
    #: second round's rivals are the same (:meth:`races_against`), else raced again.
    races: tuple[Race, ...] = ()
    #: Whether a whole plan lost its race to a rival from outside (so a refusal is
    #: ``auto``'s own, never stored), and the agreement findings of the plans judged.
    outrun_from_outside: bool = False
    disagreements: tuple[Said, ...] = ()
    #: What the first round's quantizer made that the second one reuses instead of making
    #: it again (its models, in memory; the backend's own type, or None): hundreds of MB,
    #: so neither printed nor compared.
    carried: object | None = field(default=None, repr=False, compare=False)

    def races_against(self, rivals: Sequence[Rival]) -> tuple[Race, ...] | None:
        """The base's races where they were run against ``rivals`` (each by name and
        margin, up to the first it lost), else None: they must be raced again."""
        if not self.races:
            return None
        ran = [(race.baseline_name, race.margin) for race in self.races]
        wanted = [(rival.name, rival.margin) for rival in rivals]
        complete = len(ran) == len(wanted) or not self.races[-1].faster
        return self.races if complete and wanted[: len(ran)] == ran else None


C = TypeVar("C")


@dataclass(frozen=True)
class Limits:
    """What bounds one lossy build inside a wider search (``precision="auto"``'s): the
    rivals it must outrun (in place of its backend's own float plan), whether an int8
    search may go on to its ladders now, or must leave them for later (``auto`` first
    tries every backend's whole plans, which set the bar a ladder must clear), and where
    such a search's second round takes up (``resumed``)."""

    rivals: tuple[Rival, ...] = ()
    ladders: bool = True
    resumed: Resumed | None = None

    def carried(self, kind: type[C]) -> C | None:
        """What the first round's quantizer handed on (:attr:`Resumed.carried`), where it
        is of the backend's own ``kind``; else None (no second round, another backend's)."""
        carried = self.resumed.carried if self.resumed is not None else None
        return carried if isinstance(carried, kind) else None


#: A build asked for by name: its backend's own float plan to outrun, every ladder.
NO_LIMITS = Limits()


def races(
    candidate: Session, rivals: Sequence[Rival], items: Sequence[EncoderInputs]
) -> list[Race]:
    """``candidate`` raced against each of ``rivals`` in turn, up to the first it loses
    (the last race of the list, where it is not :attr:`Race.faster`)."""
    run: list[Race] = []
    for rival in rivals:
        run.append(race(candidate, rival.session, items, rival.name, rival.margin))
        if not run[-1].faster:
            break
    return run
