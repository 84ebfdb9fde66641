"""``nlp.pipe`` of an accelerated pipeline: spaCy's own, run in worker processes that share
the CPUs (the CPU budget's :meth:`~spacy_accelerate.cpu_budget.CpuBudget.sharing`), or with
the transformer overlapping the components behind it (:mod:`spacy_accelerate.serving.overlap`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from spacy.language import Language

from spacy_accelerate.cpu_budget import BUDGET, available_cpus, worker_count
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.patch import is_optimized
from spacy_accelerate.serving.overlap import OverlappedPipe, Stages

#: The ``nlp`` attribute that :class:`AcceleratedPipe` stands in for.
PIPE_METHOD = "pipe"


@dataclass(frozen=True)
class AcceleratedPipe:
    """Stands in for ``nlp.pipe``, with spaCy's signature and results. With ``n_process``
    other than 1: spaCy's own, the count of its workers recorded while it runs (each
    worker's share of threads). In one process, with ``overlap`` and two CPUs or more,
    where a component follows the transformer:
    :class:`spacy_accelerate.serving.overlap.OverlappedPipe`.
    Otherwise spaCy's ``pipe`` itself."""

    nlp: Language
    overlap: bool = False

    def __call__(
        self,
        texts: Iterable[Any],
        *,
        as_tuples: bool = False,
        batch_size: int | None = None,
        disable: Iterable[str] = (),
        component_cfg: dict[str, dict[str, Any]] | None = None,
        n_process: int = 1,
    ) -> Iterator[Any]:
        pipe: Callable[..., Iterator[Any]] = type(self.nlp).pipe  # spaCy's own
        disable = list(disable)  # read once: it may be a generator
        options: dict[str, Any] = {
            "batch_size": batch_size,
            "disable": disable,
            "component_cfg": component_cfg,
        }
        if n_process != 1:
            docs = pipe(self.nlp, texts, as_tuples=as_tuples, n_process=n_process, **options)
            return _shared(docs, n_process)
        # as_tuples: spaCy's pipe calls this one again with documents that carry contexts.
        stages = overlapped_stages(self.nlp, disable) if self.overlap and not as_tuples else None
        if stages is None:
            return pipe(self.nlp, texts, as_tuples=as_tuples, **options)
        glue_only = is_optimized(self.nlp)  # every transformer served by a runtime
        return OverlappedPipe(self.nlp, texts, stages, options, glue_only)


def overlapped_stages(nlp: Language, disable: Iterable[str] = ()) -> Stages | None:
    """The stages of an overlapped ``pipe`` call of ``nlp`` (less ``disable``), or None
    where overlap cannot run: fewer than two CPUs, or no component behind a transformer."""
    if available_cpus() < 2:
        return None
    stages = Stages.of(nlp, [c.name for c in transformer_components(nlp)], disable)
    return stages if stages.overlaps else None


def _shared(docs: Iterator[Any], n_process: int) -> Iterator[Any]:
    with BUDGET.sharing(worker_count(n_process)):
        yield from docs


def install_pipe(nlp: Language, overlap: bool) -> None:
    setattr(nlp, PIPE_METHOD, AcceleratedPipe(nlp, overlap))


def remove_pipe(nlp: Language) -> None:
    if isinstance(nlp.__dict__.get(PIPE_METHOD), AcceleratedPipe):
        del nlp.__dict__[PIPE_METHOD]
