"""Whether an int8 plan runs faster here than the float model it would replace.

An int8 plan is only worth serving where it beats the float plan the CPU already runs
well: bf16 where the CPU has bf16 units, fp32 elsewhere
(:func:`~spacy_accelerate.backends.openvino.session.speed_baseline`). Which plan wins
depends on the CPU, not only on the model: on an AMX Xeon, int8 weights decompressed to
bf16 ran slower than plain bf16, and on a CPU without VNNI int8 arithmetic gains little.
So each candidate that passes the accuracy gate is raced against the float model on the
calibration spans, the two alternating (these machines are shared and noisy), and
refused unless it is faster.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.runtime.session import Session

#: Calibration items per timed pass, and alternating rounds (the medians are compared).
TIMED_ITEMS = 4
ROUNDS = 3


def seconds_per_pass(session: Session, items: Sequence[EncoderInputs]) -> float:
    """Wall time of one run of ``session`` over ``items`` (the last hidden state only, as a
    pipeline whose listeners read the last layer asks for)."""
    last = session.output_names[-1:]
    start = time.perf_counter()
    for item in items:
        session.run(item, last)
    return time.perf_counter() - start


@dataclass(frozen=True)
class Race:
    """A candidate's and the baseline's median seconds over the same timed items."""

    candidate: float
    baseline: float
    baseline_name: str
    items: int

    @property
    def faster(self) -> bool:
        return self.candidate < self.baseline

    def finding(self) -> str:
        return (
            f"not faster than {self.baseline_name} on this CPU ({1000 * self.candidate:.0f} ms "
            f"vs {self.baseline_name} {1000 * self.baseline:.0f} ms over {self.items} "
            "calibration batches)"
        )


def race(candidate: Session, baseline: Session, items: Sequence[EncoderInputs], name: str) -> Race:
    """Time ``candidate`` and ``baseline`` (sessions) on the first calibration ``items``,
    each warmed up once, then alternating for :data:`ROUNDS` rounds."""
    timed = list(items[:TIMED_ITEMS])
    seconds_per_pass(candidate, timed[:1])
    seconds_per_pass(baseline, timed[:1])
    mine, theirs = [], []
    for _ in range(ROUNDS):
        mine.append(seconds_per_pass(candidate, timed))
        theirs.append(seconds_per_pass(baseline, timed))
    return Race(statistics.median(mine), statistics.median(theirs), name, len(timed))
