"""What a calibrated build is given: the transformer's inputs on real text and PyTorch's
documents for it (recorded by :mod:`spacy_accelerate.planning.recording`, which runs
the pipeline), and the source that records them only when a model must be built."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from spacy.tokens import Doc

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.verify.agreement import AgreementReport

#: Judges a candidate session inside the pipeline: its agreement with PyTorch fp32 on
#: the calibration texts, or an :class:`~spacy_accelerate.errors.AgreementError` naming
#: the annotation below its bound.
Judge = Callable[[Session], AgreementReport]


@dataclass(frozen=True)
class Calibration:
    """The calibration texts, the transformer's inputs for them and PyTorch's documents."""

    texts: tuple[str, ...]
    digest: str
    #: The transformer's inputs, as spaCy handed them over, in items of a few rows.
    items: tuple[EncoderInputs, ...]
    #: PyTorch's documents for ``texts``.
    docs: tuple[Doc, ...]


def spread(items: Sequence[EncoderInputs], count: int) -> tuple[EncoderInputs, ...]:
    """``count`` of ``items``, evenly spaced (all where there are no more): the texts come
    genre after genre, so the first few would all be of one genre."""
    if len(items) <= count:
        return tuple(items)
    step = len(items) / count
    return tuple(items[int(index * step)] for index in range(count))


class CalibrationInputs(Protocol):
    """A request's calibration, as the build sees it: its texts' digest and what else
    judged the plan (both in the cache key, known at once), and the recorded
    :class:`Calibration` (costly: made only when a model is built)."""

    @property
    def digest(self) -> str: ...

    @property
    def judged_by(self) -> str: ...

    @property
    def full(self) -> Calibration: ...
