"""What the tests compare between a PyTorch and an accelerated pipeline."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate.doc_outputs import all_hidden_states as all_hidden
from spacy_accelerate.doc_outputs import last_hidden_state as last_hidden

__all__ = ["all_hidden", "annotations", "disagreements", "last_hidden", "max_abs_diff", "run"]

Annotation = tuple[str, str, str, int, str, str]


def annotations(doc: Doc) -> list[Annotation]:
    """Every annotation the heads make: tag, POS, dependency, head, entity IOB and type."""
    return [(t.tag_, t.pos_, t.dep_, t.head.i, t.ent_iob_, t.ent_type_) for t in doc]


def run(nlp: Language, texts: Iterable[str], batch_size: int) -> list[Doc]:
    return list(nlp.pipe(texts, batch_size=batch_size))


def max_abs_diff(a: list[Doc], b: list[Doc]) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        hx, hy = last_hidden(x), last_hidden(y)
        assert hx.shape == hy.shape
        if hx.size:
            worst = max(worst, float(np.max(np.abs(hx - hy))))
    return worst


def disagreements(a: list[Doc], b: list[Doc]) -> list[tuple[int, int, Annotation, Annotation]]:
    """(doc, token, expected, actual) for every token whose annotations differ."""
    out = []
    for d, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.text == y.text
        for t, (ax, ay) in enumerate(zip(annotations(x), annotations(y), strict=True)):
            if ax != ay:
                out.append((d, t, ax, ay))
    return out
