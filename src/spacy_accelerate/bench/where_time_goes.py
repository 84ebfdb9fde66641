"""Where a pipeline's time goes, PyTorch against accelerated, stage by stage
(:mod:`~spacy_accelerate.planning.stage_times`), and what that means on more cores.

Once the encoder is fast, spaCy's own components are what is left, and they run on one
core whatever the runtime does. With overlap, one process annotates at most as fast as
its caller's thread runs the tokenizer and those components; the encoder, which scales
with threads, reaches that rate at some thread count. Beyond it, more cores help only as
more processes (``n_process``, Ray actors), each with its share of the threads
(:class:`CoreAdvice`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spacy.language import Language

from spacy_accelerate.api import accelerated_components
from spacy_accelerate.bench.baselines import PyTorch, Variant
from spacy_accelerate.cpu_budget import OverlapCost, available_cpus
from spacy_accelerate.pipeline.layer_mix import listeners_own_weighting
from spacy_accelerate.planning.overlap_plan import cost_of
from spacy_accelerate.planning.stage_times import Breakdown, breakdown


def breakdowns(
    nlp: Language, texts: Sequence[str], variants: Mapping[str, Variant], batch_size: int = 64
) -> dict[str, Breakdown]:
    """Each variant's stages over ``texts`` (after a warm-up pass), by variant name."""
    found = {}
    for name, variant in variants.items():
        variant.apply(nlp)
        breakdown(nlp, texts, batch_size)
        found[name] = breakdown(nlp, texts, batch_size)
    return found


def table(found: Mapping[str, Breakdown]) -> list[str]:
    """Microseconds per word of every stage, a column per variant, and the share of the
    variant's time in brackets."""
    names = list(found)
    stages = list(dict.fromkeys(stage.name for b in found.values() for stage in b.stages))
    width = max(26, *(len(name) + 2 for name in names))
    lines = [f"  {'us per word':28s}" + "".join(f"{name:>{width}s}" for name in names)]
    for stage in [*stages, "total"]:
        cells = []
        for name in names:
            rows = found[name].as_dict()
            if stage == "total":
                cells.append(f"{1e6 * found[name].per_word():>17.0f}         ")
            elif stage in rows:
                row = rows[stage]
                cells.append(f"{row['us_per_word']:>17.1f} ({row['share']:>5.0%})")
            else:
                cells.append("")
        lines.append(f"  {stage:28s}" + "".join(f"{cell:>{width}s}" for cell in cells))
    return lines


@dataclass(frozen=True)
class CoreAdvice:
    """One process or several on ``cpus`` CPUs, from the overlap cost model
    (:class:`~spacy_accelerate.cpu_budget.OverlapCost`, the one ``optimize()`` decides
    overlap with) of an accelerated pipeline's stages."""

    cpus: int
    cost: OverlapCost

    @classmethod
    def of(cls, timed: Breakdown, threads: int, cpus: int | None = None) -> CoreAdvice:
        return cls(cpus if cpus is not None else available_cpus(), cost_of(timed, threads))

    @property
    def ceiling(self) -> float:
        return self.cost.ceiling

    @property
    def saturating_threads(self) -> int | None:
        return self.cost.saturating_threads

    @property
    def processes(self) -> int:
        return self.cost.processes(self.cpus)

    def describe(self) -> list[str]:
        """What to run on this machine, and why, in a few lines."""
        saturating = self.saturating_threads
        lines = [
            f"one process reaches at most {self.ceiling:,.0f} words/s: spaCy's components "
            f"take {1e6 * self.cost.components:.0f} us per word on the caller's thread"
        ]
        if saturating is not None:
            lines.append(
                f"the encoder keeps pace with them at about {saturating} runtime threads "
                "(one more CPU for the components)"
            )
        if self.processes == 1:
            overlap = "on" if self.cost.pays else "off"
            lines.append(
                f"on these {self.cpus} CPUs: one process, overlap {overlap} (predicted "
                f"{self.cost.gain:.2f}x; optimize() measures it)"
            )
        else:
            each = self.cpus // self.processes
            lines.append(
                f"on these {self.cpus} CPUs: nlp.pipe(n_process={self.processes}) or "
                f"{self.processes} Ray actors, about {each} threads each"
            )
        return lines


@dataclass(frozen=True)
class WhereTimeGoes:
    """PyTorch fp32's stages beside one accelerated variant's, and the advice."""

    found: dict[str, Breakdown]
    advice: CoreAdvice

    def lines(self) -> list[str]:
        return ["where the time goes (stage after stage):", *table(self.found)] + [
            f"  {line}" for line in self.advice.describe()
        ]

    def as_dict(self) -> dict[str, object]:
        advice = self.advice
        return {
            "stages": {name: found.as_dict() for name, found in self.found.items()},
            "one_process_ceiling_wps": round(advice.ceiling),
            "saturating_threads": advice.saturating_threads,
            "processes": advice.processes,
        }


#: The column of an accelerated variant whose all-layer listeners weight a padded batch, as
#: spacy-curated-transformers does (:mod:`~spacy_accelerate.pipeline.layer_mix`).
PADDED_LISTENERS = "{}, padded listeners"


def measure(
    nlp: Language, texts: Sequence[str], name: str, accelerated: Variant, batch_size: int = 64
) -> WhereTimeGoes:
    """PyTorch fp32 and ``accelerated`` (named ``name``) stage by stage, leaving ``nlp``
    on PyTorch. Where its all-layer listeners mix each document unpadded, the same variant
    with their own padded weighting too: what the mix saves in each head."""
    found = breakdowns(nlp, texts, {"pytorch fp32": PyTorch(), name: accelerated}, batch_size)
    with listeners_own_weighting(nlp) as compared:
        if compared:
            breakdown(nlp, texts, batch_size)
            found[PADDED_LISTENERS.format(name)] = breakdown(nlp, texts, batch_size)
    threads = min(m.session.config.intra_op_threads for m in accelerated_components(nlp).values())
    PyTorch().apply(nlp)
    return WhereTimeGoes(found, CoreAdvice.of(found[name], threads))
