"""PyTorch vs spacy-accelerate on one sample pipeline, side by side, in one process.

    python benchmarks/side_by_side.py --sample minilm --sentences 500 --batch-size 64 \
        --repeats 3 --output benchmarks/results/side_by_side.json

Words per second of ``nlp.pipe`` over UD-EWT test documents (full pipeline),
median of alternating runs after a warm-up, plus annotation agreement.
Quote the ratio, not the absolute numbers: these machines are shared.
"""

from __future__ import annotations

import argparse
import os
import platform
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import spacy  # noqa: E402

from spacy_accelerate.benchmark import side_by_side, write_report  # noqa: E402
from spacy_accelerate.fingerprint import package_versions  # noqa: E402
from spacy_accelerate.samples import ewt  # noqa: E402
from spacy_accelerate.samples.pipelines import SAMPLE_NAMES, ensure_sample  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", choices=SAMPLE_NAMES, default="minilm")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    nlp = spacy.load(ensure_sample(args.sample))
    docs = ewt.load_documents("test", max_sentences=8, limit_sentences=args.sentences)
    texts = [doc.text for doc in docs]
    result = side_by_side(nlp, texts, batch_size=args.batch_size, repeats=args.repeats)
    assert result.agreement is not None
    report = {
        "sample": args.sample,
        "documents": len(texts),
        "words": result.words,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "pytorch_seconds": result.pytorch_seconds,
        "accelerated_seconds": result.accelerated_seconds,
        "pytorch_wps": round(result.pytorch_wps, 1),
        "accelerated_wps": round(result.accelerated_wps, 1),
        "speedup": round(result.speedup, 3),
        "agreement": {name: result.agreement.rate(name) for name in result.agreement.same},
        "tokens": result.agreement.tokens,
        "machine": {"platform": platform.platform(), "cpus": len(os.sched_getaffinity(0))},
        "versions": package_versions(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    write_report(report, args.output)


if __name__ == "__main__":
    main()
