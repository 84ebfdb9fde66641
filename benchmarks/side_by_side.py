"""PyTorch vs spacy-accelerate on one sample pipeline, side by side, in one process.

    python benchmarks/side_by_side.py --sample minilm-ewt --precision fp32 int8 \\
        --sentences 2077 --batch-size 64 --repeats 3 --output benchmarks/results/x.json

Words per second of ``nlp.pipe`` over UD-EWT test documents (full pipeline),
median of alternating runs after a warm-up, for PyTorch fp32 and each
precision asked for; plus every variant's annotation agreement with PyTorch,
the cosine similarity of each piece's last hidden state to PyTorch's, and
(``--gold``) the accuracy of PyTorch and of each variant against UD-EWT's gold
annotations. Quote the ratios, not the absolute numbers: these machines are
shared.
"""

from __future__ import annotations

import argparse
import os
import platform
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spacy_accelerate_samples import ewt  # noqa: E402
from spacy_accelerate_samples.pipelines import SAMPLE_NAMES  # noqa: E402
from spacy_accelerate_samples.trained import (  # noqa: E402
    REFERENCES,
    TRAINED_SAMPLE_NAME,
    evaluate_on_ewt_test,
    load_benchmark_pipeline,
)

import spacy_accelerate  # noqa: E402
from spacy_accelerate.bench.side_by_side import side_by_side, write_report  # noqa: E402
from spacy_accelerate.export.fingerprint import package_versions  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sample", choices=[*SAMPLE_NAMES, *REFERENCES], default=TRAINED_SAMPLE_NAME
    )
    parser.add_argument("--precision", nargs="+", default=["fp32"])
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gold", action="store_true", help="also score against UD-EWT gold")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    nlp = load_benchmark_pipeline(args.sample)
    docs = ewt.load_documents("test", max_sentences=8, limit_sentences=args.sentences)
    texts = [doc.text for doc in docs]
    variants = {p: {"provider": "cpu", "precision": p} for p in args.precision}
    result = side_by_side(nlp, texts, variants, batch_size=args.batch_size, repeats=args.repeats)
    report = {
        "sample": args.sample,
        "documents": len(texts),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        **result.as_dict(),
        "machine": {"platform": platform.platform(), "cpus": len(os.sched_getaffinity(0))},
        "versions": package_versions(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if args.gold:
        spacy_accelerate.restore(nlp)
        scores = {"pytorch": evaluate_on_ewt_test(nlp, limit_sentences=args.sentences)}
        for name, options in variants.items():
            spacy_accelerate.optimize(nlp, **options)
            scores[name] = evaluate_on_ewt_test(nlp, limit_sentences=args.sentences)
        report["gold_scores"] = scores
    write_report(report, args.output)


if __name__ == "__main__":
    main()
