"""Side-by-side speed and agreement of a PyTorch pipeline and its accelerated twin.

The machines this runs on are shared and noisy, so the reference (PyTorch
fp32) and every other variant (:mod:`spacy_accelerate.bench.baselines`) are
measured in one process, alternating, after a warm-up pass each, and the
median of the repeats is reported as a ratio, with the range over the
repeats so that a noisy run shows as one. All variants are the same
``Language`` object switched in place (``restore()``/``optimize()`` cost
milliseconds once the cache is warm). A variant this machine refuses (a
precision its gate or its hardware turns down) can be reported as refused
while the others still run.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate.api import accelerated_components
from spacy_accelerate.bench.baselines import Accelerated, PyTorch, Variant
from spacy_accelerate.bench.doc_outputs import token_cosines


@dataclass(frozen=True)
class Agreement:
    """How often the accelerated pipeline's annotations equal PyTorch's, per attribute."""

    tokens: int
    same: dict[str, int]

    def rate(self, attribute: str) -> float:
        return self.same[attribute] / self.tokens if self.tokens else 1.0


@dataclass(frozen=True)
class VariantResult:
    """One variant: its timings, its docs (warm-up pass) and how close it stays to PyTorch."""

    options: dict[str, Any]
    seconds: list[float]
    agreement: Agreement
    min_token_cosine: float
    mean_token_cosine: float
    docs: list[Doc] = field(default_factory=list, repr=False, compare=False)
    #: What actually ran, by transformer component: (provider, precision), e.g.
    #: ``("openvino", "int8")`` where ``auto`` was asked; empty for a PyTorch variant.
    served: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Seconds from switching to this variant the first time to the end of its warm-up
    #: pass: its set-up (optimize(), torch.compile's compilation, quantizing) plus a pass.
    first_seconds: float = 0.0

    @property
    def setup_seconds(self) -> float:
        """What the first switch and pass cost beyond a steady pass."""
        return max(0.0, self.first_seconds - statistics.median(self.seconds))


@dataclass(frozen=True)
class SideBySide:
    words: int
    pytorch_seconds: list[float] = field(default_factory=list)
    variants: dict[str, VariantResult] = field(default_factory=dict)
    reference: list[Doc] = field(default_factory=list, repr=False, compare=False)
    #: The variants that did not run, with the error that refused them (see ``refusals``
    #: of :func:`side_by_side`), which each interface spells in its own terms.
    failed: dict[str, BaseException] = field(default_factory=dict)

    @property
    def pytorch_wps(self) -> float:
        return self.words / statistics.median(self.pytorch_seconds)

    def pytorch_wps_range(self) -> tuple[float, float]:
        """PyTorch's slowest and fastest pass, in words per second."""
        return self.words / max(self.pytorch_seconds), self.words / min(self.pytorch_seconds)

    def wps(self, variant: str) -> float:
        return self.words / statistics.median(self.variants[variant].seconds)

    def wps_range(self, variant: str) -> tuple[float, float]:
        """``variant``'s slowest and fastest pass, in words per second."""
        seconds = self.variants[variant].seconds
        return self.words / max(seconds), self.words / min(seconds)

    def speedup(self, variant: str) -> float:
        """Words per second of ``variant`` over PyTorch's, both medians of the same run."""
        return self.wps(variant) / self.pytorch_wps

    def speedup_range(self, variant: str) -> tuple[float, float]:
        """The lowest and highest speedup of one pass over PyTorch's pass of the same
        round: how much the machine's noise moves the ratio."""
        ratios = [
            base / seconds
            for base, seconds in zip(
                self.pytorch_seconds, self.variants[variant].seconds, strict=True
            )
        ]
        return min(ratios), max(ratios)

    def as_dict(self) -> dict[str, Any]:
        return {
            "words": self.words,
            "pytorch": {
                "seconds": self.pytorch_seconds,
                "wps": round(self.pytorch_wps, 1),
                "wps_range": [round(wps, 1) for wps in self.pytorch_wps_range()],
            },
            "variants": {
                name: {
                    "options": result.options,
                    "served": {
                        component: {"provider": provider, "precision": precision}
                        for component, (provider, precision) in result.served.items()
                    },
                    "seconds": result.seconds,
                    "wps": round(self.wps(name), 1),
                    "wps_range": [round(wps, 1) for wps in self.wps_range(name)],
                    "speedup_vs_pytorch": round(self.speedup(name), 3),
                    "speedup_range": [round(ratio, 3) for ratio in self.speedup_range(name)],
                    "agreement": {k: result.agreement.rate(k) for k in result.agreement.same},
                    "tokens": result.agreement.tokens,
                    "min_token_cosine": round(result.min_token_cosine, 6),
                    "mean_token_cosine": round(result.mean_token_cosine, 6),
                    "setup_seconds": round(result.setup_seconds, 2),
                }
                for name, result in self.variants.items()
            },
            "failed": {
                name: str(error) or type(error).__name__ for name, error in self.failed.items()
            },
        }


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


def _served(nlp: Language) -> dict[str, tuple[str, str]]:
    """The provider and precision that serve each accelerated component of ``nlp`` now."""
    return {
        name: (module.session.provider.provider.value, module.session.config.precision.value)
        for name, module in accelerated_components(nlp).items()
    }


def side_by_side(
    nlp: Language,
    texts: Sequence[str],
    variants: Mapping[str, Variant | Mapping[str, Any]],
    *,
    batch_size: int = 64,
    repeats: int = 3,
    reference: Variant | None = None,
    refusals: tuple[type[Exception], ...] = (),
) -> SideBySide:
    """Time ``nlp.pipe`` on ``reference`` (PyTorch fp32) and on each variant, alternating;
    compare every variant's annotations and last hidden states with the reference's.

    A variant given as a mapping is ``optimize()``'s keyword arguments. A variant whose
    switching raises one of ``refusals`` is left out and its reason kept in
    :attr:`SideBySide.failed` (the others still run); any other error propagates.
    """
    if batch_size < 1 or repeats < 1:
        raise ValueError(f"batch_size and repeats must be 1 or more, got {batch_size}, {repeats}")
    chosen = {
        name: v if isinstance(v, Variant) else Accelerated(dict(v)) for name, v in variants.items()
    }
    base = reference if reference is not None else PyTorch()
    run = _Alternation(nlp, texts, batch_size, base, chosen, refusals)
    expected = run.warm_up()
    base_seconds = run.time(repeats)
    return SideBySide(
        words=sum(len(text.split()) for text in texts),
        pytorch_seconds=base_seconds,
        variants={name: run.result(name, expected) for name in run.chosen},
        reference=expected,
        failed=run.failed,
    )


class _Alternation:
    """The variants of one side-by-side run, switched in turn on one ``Language``: a
    variant whose switching is refused is dropped (back to the reference), its reason
    kept in :attr:`failed`; what the others did is kept by name."""

    def __init__(
        self,
        nlp: Language,
        texts: Sequence[str],
        batch_size: int,
        base: Variant,
        chosen: dict[str, Variant],
        refusals: tuple[type[Exception], ...],
    ) -> None:
        self.nlp, self.texts, self.batch_size = nlp, texts, batch_size
        self.base, self.chosen, self.refusals = base, chosen, refusals
        self.failed: dict[str, BaseException] = {}
        self.warm: dict[str, list[Doc]] = {}
        self.served: dict[str, dict[str, tuple[str, str]]] = {}
        self.first: dict[str, float] = {}
        self.seconds: dict[str, list[float]] = {}

    def warm_up(self) -> list[Doc]:
        """One pass of the reference (its annotations, returned) and of every variant,
        each variant's set-up timed with its pass."""
        self.base.apply(self.nlp)
        _, expected = _timed(self.nlp, self.texts, self.batch_size)
        for name in list(self.chosen):
            started = time.perf_counter()
            if self._switched(name):
                self.served[name] = _served(self.nlp)
                self.warm[name] = _timed(self.nlp, self.texts, self.batch_size)[1]
                self.first[name] = time.perf_counter() - started
        self.seconds = {name: [] for name in self.chosen}
        return expected

    def time(self, repeats: int) -> list[float]:
        """``repeats`` rounds of a timed pass each, the reference first; the reference's
        seconds (the variants' are kept), and ``nlp`` left on the reference."""
        base_seconds: list[float] = []
        for _ in range(repeats):
            self.base.apply(self.nlp)
            base_seconds.append(_timed(self.nlp, self.texts, self.batch_size)[0])
            for name in list(self.chosen):
                if self._switched(name):
                    self.seconds[name].append(_timed(self.nlp, self.texts, self.batch_size)[0])
        self.base.apply(self.nlp)
        return base_seconds

    def result(self, name: str, expected: list[Doc]) -> VariantResult:
        """Variant ``name``'s timings, and how close its warm-up pass stayed to
        ``expected`` (the reference's)."""
        pairs = zip(expected, self.warm[name], strict=True)
        cosines = np.concatenate([token_cosines(e, d) for e, d in pairs] or [np.ones(1)])
        return VariantResult(
            options=self.chosen[name].describe(),
            seconds=self.seconds[name],
            agreement=agreement(expected, self.warm[name]),
            min_token_cosine=float(cosines.min()),
            mean_token_cosine=float(cosines.mean()),
            docs=self.warm[name],
            served=self.served[name],
            first_seconds=self.first[name],
        )

    def _switched(self, name: str) -> bool:
        """Switch ``nlp`` to ``name``'s variant; False (and back to the reference) if it
        is refused."""
        try:
            self.chosen[name].apply(self.nlp)
        except self.refusals as error:
            self.failed[name] = error
            del self.chosen[name]
            self.base.apply(self.nlp)
            return False
        return True


def alternate(variants: Mapping[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each of ``repeats`` calls of every variant, taken in turn, so that a
    shared, noisy machine slows them all alike."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def write_report(report: dict[str, Any], output: Path | None, *, echo: bool = True) -> None:
    """Print a benchmark's JSON report (unless ``echo`` is False: a command that prints
    its own table) and, when asked, keep it under ``output``."""
    text = json.dumps(report, indent=2)
    if echo:
        print(text)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
