"""Build (or reuse) the "minilm-ewt" sample and score it on UD-EWT test.

    python benchmarks/train_minilm_heads.py --output benchmarks/results/minilm-ewt.json

The heads (tagger, parser, NER) are trained on UD-EWT dev over the frozen all-MiniLM-L6-v2
encoder, see :mod:`spacy_accelerate_samples.trained`.  The report gives tag accuracy, UAS/LAS
and NER P/R/F on test, the build's training record, and whether the encoder weights are
identical to the untrained "minilm" sample's (they must be: only the heads are trained).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import spacy  # noqa: E402
from spacy_accelerate_samples.pipelines import ensure_sample  # noqa: E402
from spacy_accelerate_samples.trained import (  # noqa: E402
    encoder_state_digest,
    ensure_trained_sample,
    evaluate_on_ewt_test,
    same_encoder_weights,
)

from spacy_accelerate.bench.side_by_side import write_report  # noqa: E402
from spacy_accelerate.export.fingerprint import package_versions  # noqa: E402


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-root", type=Path, help="sample cache (default: the usual one)")
    parser.add_argument(
        "--sentences", type=int, help="score only the first N test sentences (default: all)"
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--skip-encoder-check",
        action="store_true",
        help="don't load the untrained minilm sample to compare encoder weights",
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    started = time.perf_counter()
    folder = ensure_trained_sample(args.cache_root)
    _log(f"pipeline at {folder} (ready after {time.perf_counter() - started:.1f}s)")
    nlp = spacy.load(folder)
    _log("evaluating on UD-EWT test")
    scores = evaluate_on_ewt_test(nlp, args.sentences, batch_size=args.batch_size)
    _log(
        f"tag_acc {scores['tag_acc']:.3f}  UAS {scores['dep_uas']:.3f}  "
        f"LAS {scores['dep_las']:.3f}  NER F1 {scores['ents_f']:.3f}"
    )
    report: dict[str, object] = {
        "sample": "minilm-ewt",
        "path": str(folder),
        "test_scores": scores,
        "build": json.loads((folder / "sample.json").read_text(encoding="utf8")),
        "encoder_sha256": encoder_state_digest(nlp),
    }
    if not args.skip_encoder_check:
        untrained = spacy.load(ensure_sample("minilm", args.cache_root))
        same = same_encoder_weights(nlp, untrained)
        report["encoder_identical_to_minilm"] = same
        _log(f"encoder weights identical to the untrained minilm sample: {same}")
    report["machine"] = {"platform": platform.platform(), "cpus": len(os.sched_getaffinity(0))}
    report["versions"] = package_versions()
    report["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_report(report, args.output)
    if report.get("encoder_identical_to_minilm") is False:
        raise SystemExit("the trained sample's encoder differs from MiniLM's")


if __name__ == "__main__":
    main()
