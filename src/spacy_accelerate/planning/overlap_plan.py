"""Whether an accelerated pipeline overlaps its transformer with spaCy's components, and on
how many runtime threads: decided once, when ``optimize()`` serves a plan, and kept.

With overlap (:mod:`spacy_accelerate.serving.overlap`), the runtime runs batch k+1 in a
helper thread while the
caller's thread runs the components behind the transformer over batch k. It pays where the
components take a good share of the time; it costs where the encoder is nearly all of it,
and the helper, the GIL the two threads share and their caches cost something everywhere
(on a 2-CPU EPYC it measured 0.97x on minilm-ewt, on a Xeon 1.10x).

The decision (:func:`plan_overlap`): the pipeline's stages are timed one after the other on
the built-in calibration sample (after a pass that warms the runtime; :mod:`.stage_times`);
the one cost model (:class:`~spacy_accelerate.cpu_budget.OverlapCost`) gives the runtime's
threads under overlap and the gain it predicts. Where the gain is below
:data:`~spacy_accelerate.cpu_budget.MIN_OVERLAP_GAIN`, overlap is off with no more timing;
otherwise the sample is annotated both ways, alternating, and overlap is on only where it
measured that gain. ``overlap=True`` or ``False`` forces it (``True`` still times the
split of the threads). The :class:`OverlapPlan` is recorded with the pipeline's options
(``config.cfg``, a pickle), so a saved pipeline loads, bundled or not, in a worker or a Ray
actor, on the same plan with no timing pass and its sessions opened once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from itertools import accumulate
from typing import Any

from spacy.language import Language

from spacy_accelerate.cpu_budget import MIN_OVERLAP_GAIN, OverlapCost, OverlapPlan
from spacy_accelerate.errors import Advice, spelled
from spacy_accelerate.options.config import Workload
from spacy_accelerate.pipeline.pipe import overlapped_stages
from spacy_accelerate.planning.recording import builtin_texts
from spacy_accelerate.planning.stage_times import Breakdown, StageKind, breakdown
from spacy_accelerate.serving.overlap import OverlappedPipe, Stages
from spacy_accelerate.serving.proxy import AcceleratedModule

logger = logging.getLogger("spacy_accelerate")

#: About how many words of the built-in sample the measurement times: enough batches to
#: time every stage, few enough to keep ``optimize()`` quick on a large encoder.
SAMPLE_WORDS = 1500
#: Passes of each way the sample is annotated when the model predicts a gain.
ROUNDS = 2
#: Batches the sample is cut into when it is annotated both ways: overlap runs one batch
#: beside another, so a call of one or two batches cannot show its gain (at the
#: pipeline's own batch size, often 1,000 documents, the sample would be one).
MEASURED_BATCHES = 6


def cost_of(times: Breakdown, threads: int) -> OverlapCost:
    """The overlap cost model of stages timed with the runtime on ``threads`` threads."""
    return OverlapCost(
        threads=threads,
        encoder=times.per_word(StageKind.ENCODER_CALL),
        around=times.per_word(StageKind.AROUND_CALL),
        components=times.per_word(StageKind.TOKENIZER, StageKind.COMPONENT),
    )


def sample_texts(words: int = SAMPLE_WORDS) -> list[str]:
    """The first texts of the built-in sample that hold about ``words`` words."""
    texts = builtin_texts()
    counts = list(accumulate(len(text.split()) for text in texts))
    return texts[: next((i + 1 for i, n in enumerate(counts) if n >= words), len(texts))]


def plan_overlap(
    nlp: Language,
    served: Sequence[AcceleratedModule],
    overlap: bool | None,
    *,
    threads_given: bool,
    workload: Workload,
) -> OverlapPlan:
    """Decide (see the module's docstring) and serve ``nlp`` on the plan: ``served``: its
    accelerated modules; ``overlap`` as the caller gave it (None: where it pays, and never
    for single documents, which ``nlp.pipe`` does not serve); ``threads_given``: the
    runtime's threads are the caller's, never fewer."""
    proxies = [proxy for proxy in served if not proxy.session.config.on_gpu]
    if overlap is None and workload is Workload.DOCUMENTS:
        plan = OverlapPlan(
            False,
            0,
            spelled(["single documents (", Advice("workload", workload.value), ")"]),
            overlap,
        )
        logger.info("spacy-accelerate: %s", describe(plan, 0))
        return plan
    stages = overlapped_stages(nlp) if overlap is not False and proxies else None
    if stages is None:
        why = spelled([Advice("overlap", False)]) if overlap is False else "nothing to overlap"
        return OverlapPlan(bool(overlap), 0, why, overlap)
    threads = min(proxy.session.config.intra_op_threads for proxy in proxies)
    texts = sample_texts()
    breakdown(nlp, texts)  # warms the runtime's kernels for these shapes
    cost = cost_of(breakdown(nlp, texts), threads)
    fewer = 0 if threads_given else threads - cost.runtime_threads
    timed = f"predicted {cost.gain:.2f}x"
    if overlap is None and not cost.pays:
        plan = OverlapPlan(False, 0, f"{timed}, under {MIN_OVERLAP_GAIN}x")
    elif overlap is None:
        gain = _measured_gain(nlp, stages, proxies, threads - fewer, texts)
        on = gain >= MIN_OVERLAP_GAIN
        plan = OverlapPlan(on, fewer if on else 0, f"{timed}, measured {gain:.2f}x")
    else:
        plan = OverlapPlan(True, fewer, spelled([Advice("overlap", True), f"; {timed}"]))
    for proxy in proxies:
        proxy.served.serve_on(plan.runtime_threads(threads))
    logger.info("spacy-accelerate: %s", describe(plan, threads))
    return replace(plan, asked=overlap)


def describe(plan: OverlapPlan, threads: int) -> str:
    """One line for the log: the plan and why."""
    if not plan.overlap:
        return f"overlap off ({plan.why})"
    runtime = plan.runtime_threads(threads)
    return f"overlap on, the runtime on {runtime} of {threads} threads ({plan.why})"


def _measured_gain(
    nlp: Language,
    stages: Stages,
    proxies: list[AcceleratedModule],
    runtime: int,
    texts: list[str],
) -> float:
    """Words per second of ``texts`` overlapped (``stages``, the runtime on ``runtime``
    threads) over one stage after the other (on every thread), in :data:`MEASURED_BATCHES`
    batches, the fastest of :data:`ROUNDS` each, alternating."""
    full = [proxy.served.serving() for proxy in proxies]
    for proxy in proxies:
        proxy.served.serve_on(runtime)
    fewer = [proxy.served.serving() for proxy in proxies]
    spacys = type(nlp).pipe
    batch = max(1, -(-len(texts) // MEASURED_BATCHES))
    size: dict[str, Any] = {"batch_size": batch}
    taken: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(ROUNDS):
        for on, sessions in ((False, full), (True, fewer)):
            for proxy, served in zip(proxies, sessions, strict=True):
                proxy.served.serve(served)
            started = time.perf_counter()
            docs = (
                OverlappedPipe(nlp, texts, stages, size, glue_only=True)  # all served
                if on
                else spacys(nlp, texts, batch_size=batch)
            )
            for _doc in docs:
                pass
            taken[on].append(time.perf_counter() - started)
    for proxy, served in zip(proxies, full, strict=True):
        proxy.served.serve(served)
    return min(taken[False]) / min(taken[True])
