"""Where one ``nlp.pipe`` call's time goes: the tokenizer, each component, and inside each
transformer component the encoder call apart from the component's own work around it.

Each stage runs on its own over the documents the stage before it produced (spaCy's
``util._pipe``, the loop ``Language.pipe`` runs), so that a lazy generator chain does not
blur one component's time into the next. The encoder call is timed by a module wrapped
around whatever the component's PyTorch shim runs (the PyTorch encoder, autocast, or an
accelerated proxy), in the timing thread only
(:func:`~spacy_accelerate.pipeline.patch.scoped`). This is what a user reads to
see what is left to gain once the encoder is fast: the components after it run on one
core whatever the runtime does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from spacy.language import Language
from spacy.tokens import Doc
from spacy.util import _pipe, raise_error

from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.patch import scoped
from spacy_accelerate.pipeline.shim import find_shim


class StageKind(Enum):
    """What a stage of the breakdown is."""

    TOKENIZER = "tokenizer"
    #: A transformer component's call of its encoder (PyTorch, autocast or accelerated).
    ENCODER_CALL = "encoder call"
    #: A transformer component's own work around that call (pieces, spans, pooling).
    AROUND_CALL = "around the call"
    #: Any other component (tagger, parser, ner, lemmatizer...).
    COMPONENT = "component"


@dataclass(frozen=True)
class Stage:
    """One row of a breakdown: a stage and its seconds over the pass."""

    name: str
    kind: StageKind
    seconds: float


class _TimedModule(torch.nn.Module):
    """The shim's module, with the seconds spent in its calls added up."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.seconds = 0.0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started


@contextmanager
def _timed_encoders(nlp: Language) -> Iterator[dict[str, _TimedModule]]:
    """Every transformer component's module wrapped in a :class:`_TimedModule`, by
    component name, for this thread only (other threads keep running theirs)."""
    with ExitStack() as stack:
        timed = {}
        for location in (find_shim(component) for component in transformer_components(nlp)):
            timed[location.component] = _TimedModule(location.module)
            stack.enter_context(scoped(location, timed[location.component]))
        yield timed


@dataclass(frozen=True)
class Breakdown:
    """The stages of one pass over ``words`` words, in pipeline order."""

    words: int
    stages: tuple[Stage, ...]

    def seconds(self, *kinds: StageKind) -> float:
        """The seconds of the stages of ``kinds`` (every stage where none is given)."""
        return sum(stage.seconds for stage in self.stages if not kinds or stage.kind in kinds)

    def per_word(self, *kinds: StageKind) -> float:
        """Seconds per word in the stages of ``kinds``."""
        return self.seconds(*kinds) / max(self.words, 1)

    def as_dict(self) -> dict[str, dict[str, float]]:
        """Microseconds per word and share of the pass, by stage name."""
        total = self.seconds() or 1.0
        return {
            stage.name: {
                "us_per_word": round(1e6 * stage.seconds / max(self.words, 1), 1),
                "share": round(stage.seconds / total, 3),
            }
            for stage in self.stages
        }


def breakdown(nlp: Language, texts: Sequence[str], batch_size: int = 64) -> Breakdown:
    """Time each stage of ``nlp`` over ``texts`` (one pass, stage after stage)."""
    started = time.perf_counter()
    docs: list[Doc] = [nlp.make_doc(text) for text in texts]  # as Language.pipe does
    stages = [Stage(StageKind.TOKENIZER.value, StageKind.TOKENIZER, time.perf_counter() - started)]
    with _timed_encoders(nlp) as timed:
        for name, proc in nlp.pipeline:
            started = time.perf_counter()
            docs = list(_pipe(docs, proc, name, raise_error, {"batch_size": batch_size}))
            taken = time.perf_counter() - started
            if name not in timed:
                stages.append(Stage(name, StageKind.COMPONENT, taken))
                continue
            call = timed[name].seconds
            stages.append(_part(name, StageKind.ENCODER_CALL, call))
            stages.append(_part(name, StageKind.AROUND_CALL, taken - call))
    return Breakdown(words=sum(len(doc) for doc in docs), stages=tuple(stages))


def _part(component: str, kind: StageKind, seconds: float) -> Stage:
    """A stage inside transformer component ``component``."""
    return Stage(f"{component} {kind.value}", kind, seconds)
