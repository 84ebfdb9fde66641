"""How an overlapped pipeline splits the CPUs between the runtime and spaCy's components.

With overlap (:mod:`.overlap`), the runtime runs batch k+1 in a helper thread while the
caller's thread runs the components behind the transformer over batch k. On a runtime
that uses every CPU, that thread takes a core from it, and a runtime's parallel loop waits
for its slowest thread, so the encoder then runs late whenever the components do. Giving
the runtime one thread fewer leaves the components a core of their own, which pays where
they take about as long as the encoder, and costs the encoder's share of one core where
the encoder is most of the time.

Which, is measured on this machine and pipeline when ``optimize()`` serves it: one pass of
the built-in calibration sample (after a pass that warms the runtime) timed stage by stage
(:mod:`.stage_times`). The runtime gets one thread fewer when the slower of the two
overlapped sides, with the encoder's time scaled to the fewer threads, is still faster
than the stages one after the other (:func:`runtime_threads`). Measured evidence:
``benchmarks/results/overlap-*.json``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import accumulate

from spacy.language import Language

from spacy_accelerate.pipeline.patch import accelerated_components
from spacy_accelerate.pipeline.recording import builtin_texts
from spacy_accelerate.pipeline.stage_times import Breakdown, StageKind, breakdown

logger = logging.getLogger("spacy_accelerate")

#: About how many words of the built-in sample the measurement times: enough batches to
#: time every stage, few enough to keep ``optimize()`` quick on a large encoder.
SAMPLE_WORDS = 1500


#: The splits measured in this process, by the served pipeline (its components, threads
#: and models): optimizing it again, as a benchmark switching variants does, reuses the
#: choice instead of timing it anew (and, with the machine's noise, choosing otherwise).
_MEASURED: dict[tuple[tuple[str, ...], int, tuple[str, ...]], ThreadSplit] = {}


@dataclass(frozen=True)
class ThreadSplit:
    """The runtime's threads under overlap, and the per-word times that chose them."""

    threads: int
    runtime: int
    encoder: float
    around: float
    components: float

    def describe(self) -> str:
        """One line for the log: the choice and the times behind it."""
        side = "one thread fewer" if self.runtime < self.threads else "every thread"
        return (
            f"overlap: {self.runtime} of {self.threads} threads for the runtime ({side}); "
            f"measured per word: encoder {1e6 * self.encoder:.0f} us, around it "
            f"{1e6 * self.around:.0f} us, spaCy's other stages {1e6 * self.components:.0f} us"
        )


def runtime_threads(threads: int, encoder: float, around: float, components: float) -> int:
    """The runtime's threads under overlap, from the per-word seconds of the encoder call
    (on ``threads`` threads), the transformer's work around it (helper thread), and every
    other stage (caller's thread): one fewer where, with the encoder slowed in proportion,
    the slower side still beats the three one after the other."""
    if threads < 2:
        return threads
    fewer = max(encoder * threads / (threads - 1) + around, components)
    return threads - 1 if fewer < encoder + around + components else threads


def sample_texts(words: int = SAMPLE_WORDS) -> list[str]:
    """The first texts of the built-in sample that hold about ``words`` words."""
    texts = builtin_texts()
    counts = list(accumulate(len(text.split()) for text in texts))
    return texts[: next((i + 1 for i, n in enumerate(counts) if n >= words), len(texts))]


def split_threads(nlp: Language) -> ThreadSplit | None:
    """Measure ``nlp`` (served accelerated; once per process) and serve it on the runtime
    threads :func:`runtime_threads` chooses; None where nothing is accelerated on the
    CPU."""
    proxies = [m for m in accelerated_components(nlp).values() if not m.session.config.on_gpu]
    if not proxies:
        return None
    threads = min(proxy.session.config.intra_op_threads for proxy in proxies)
    served = (tuple(nlp.pipe_names), threads, tuple(proxy.exported.key for proxy in proxies))
    split = _MEASURED.get(served)
    if split is None:
        texts = sample_texts()
        breakdown(nlp, texts)  # warms the runtime's kernels for these shapes
        split = _MEASURED[served] = _split(threads, breakdown(nlp, texts))
    for proxy in proxies:
        proxy.serve_on(split.runtime)
    logger.info("spacy-accelerate: %s", split.describe())
    return split


def _split(threads: int, times: Breakdown) -> ThreadSplit:
    encoder = times.per_word(StageKind.ENCODER_CALL)
    around = times.per_word(StageKind.AROUND_CALL)
    components = times.per_word(StageKind.TOKENIZER, StageKind.COMPONENT)
    runtime = runtime_threads(threads, encoder, around, components)
    return ThreadSplit(threads, runtime, encoder, around, components)
