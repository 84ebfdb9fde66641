"""Build (or find in the cache) the benchmark pipelines, offline.

    python benchmarks/build_pipelines.py

- ``trf-base``: the shape of en_core_web_trf (curated RoBERTa 12 x 768, 12 heads,
  FFN 3072, 514 positions, strided spans 128 / 96, tagger + parser + ner),
  random transformer weights (speed depends on shape, not values), byte-level
  BPE vocabulary trained on EWT text.
- the trained references (``minilm-ewt``, ``minilm-ewt-trf``): all-MiniLM-L6-v2's real
  weights in a curated BERT, tagger, parser and ner trained on UD-EWT train + Universal NER
  dev with the transformer frozen, in two head designs (see
  ``spacy_accelerate_samples.trained`` for why and how).

All are cached under ``$SPACY_ACCELERATE_SAMPLES`` (default
``~/.cache/spacy-accelerate-samples``); ``benchmarks/run.py`` builds them too.
"""

from __future__ import annotations

import time

from spacy_accelerate_samples.trained import BENCHMARK_PIPELINES, load_benchmark_pipeline


def main() -> None:
    for name in BENCHMARK_PIPELINES:
        started = time.perf_counter()
        nlp = load_benchmark_pipeline(name)
        print(f"{name}: {nlp.pipe_names} ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
