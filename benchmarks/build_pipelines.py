"""Build (or find in the cache) the two benchmark pipelines, offline.

    python benchmarks/build_pipelines.py

- ``trf-base``: the shape of en_core_web_trf (curated RoBERTa 12 x 768, 12 heads,
  FFN 3072, 514 positions, strided spans 128 / 96, tagger + parser + ner),
  random transformer weights (speed depends on shape, not values), byte-level
  BPE vocabulary trained on EWT text.
- ``minilm-ewt``: all-MiniLM-L6-v2's real weights in a curated BERT, tagger,
  parser and ner trained on UD-EWT dev + Universal NER dev with the transformer
  frozen (see ``spacy_accelerate_samples.trained`` for why and how).

Both are cached under ``$SPACY_ACCELERATE_SAMPLES`` (default
``~/.cache/spacy-accelerate-samples``); ``benchmarks/run.py`` builds them too.
"""

from __future__ import annotations

import time

from spacy_accelerate_samples.pipelines import ensure_sample
from spacy_accelerate_samples.trained import ensure_trained_sample


def main() -> None:
    for name, build in (
        ("trf-base", lambda: ensure_sample("trf-base")),
        ("minilm-ewt", ensure_trained_sample),
    ):
        started = time.perf_counter()
        path = build()
        print(f"{name}: {path} ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
