"""Side-by-side speed and agreement of a PyTorch pipeline and its accelerated twin.

The machines this runs on are shared and noisy, so the two variants are
measured in one process, alternating, after a warm-up pass each, and the
median of the repeats is reported as a ratio. Both variants are the same
``Language`` object: ``restore()`` and ``optimize()`` switch it between
PyTorch and ONNX Runtime, which costs milliseconds once the cache is warm.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spacy.language import Language
from spacy.tokens import Doc

from .accelerate import optimize, restore


@dataclass(frozen=True)
class Agreement:
    """How often the accelerated pipeline's annotations equal PyTorch's, per attribute."""

    tokens: int
    same: dict[str, int]

    def rate(self, attribute: str) -> float:
        return self.same[attribute] / self.tokens if self.tokens else 1.0


@dataclass(frozen=True)
class SideBySide:
    words: int
    pytorch_seconds: list[float] = field(default_factory=list)
    accelerated_seconds: list[float] = field(default_factory=list)
    agreement: Agreement | None = None

    @property
    def pytorch_wps(self) -> float:
        return self.words / statistics.median(self.pytorch_seconds)

    @property
    def accelerated_wps(self) -> float:
        return self.words / statistics.median(self.accelerated_seconds)

    @property
    def speedup(self) -> float:
        return self.accelerated_wps / self.pytorch_wps


ATTRIBUTES: dict[str, Callable] = {
    "tag": lambda t: t.tag_,
    "pos": lambda t: t.pos_,
    "dep": lambda t: t.dep_,
    "head": lambda t: t.head.i,
    "ent": lambda t: (t.ent_iob_, t.ent_type_),
}


def agreement(reference: Sequence[Doc], candidate: Sequence[Doc]) -> Agreement:
    same = dict.fromkeys(ATTRIBUTES, 0)
    tokens = 0
    for ref, cand in zip(reference, candidate, strict=True):
        for a, b in zip(ref, cand, strict=True):
            tokens += 1
            for name, read in ATTRIBUTES.items():
                same[name] += read(a) == read(b)
    return Agreement(tokens=tokens, same=same)


def _timed(nlp: Language, texts: Sequence[str], batch_size: int) -> tuple[float, list[Doc]]:
    start = time.perf_counter()
    docs = list(nlp.pipe(texts, batch_size=batch_size))
    return time.perf_counter() - start, docs


def side_by_side(
    nlp: Language,
    texts: Sequence[str],
    *,
    batch_size: int = 64,
    repeats: int = 3,
    optimize_kwargs: dict | None = None,
) -> SideBySide:
    """Time ``nlp.pipe`` on PyTorch and accelerated, alternating; compare annotations."""
    kwargs = {"provider": "cpu", "precision": "fp32", **(optimize_kwargs or {})}
    words = sum(len(text.split()) for text in texts)
    restore(nlp)
    _, reference = _timed(nlp, texts, batch_size)  # warm-up, and the reference annotations
    optimize(nlp, **kwargs)
    _, accelerated = _timed(nlp, texts, batch_size)  # warm-up
    result = SideBySide(words=words, agreement=agreement(reference, accelerated))
    for _ in range(repeats):
        restore(nlp)
        result.pytorch_seconds.append(_timed(nlp, texts, batch_size)[0])
        optimize(nlp, **kwargs)
        result.accelerated_seconds.append(_timed(nlp, texts, batch_size)[0])
    return result


def write_report(report: dict[str, Any], output: Path | None) -> None:
    """Print a benchmark's JSON report and, when asked, keep it under ``output``."""
    text = json.dumps(report, indent=2)
    print(text)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
