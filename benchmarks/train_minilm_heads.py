"""Train the heads of a reference sample again, or score a built one on UD-EWT test.

    python benchmarks/train_minilm_heads.py --train          # rewrites the committed heads
    python benchmarks/train_minilm_heads.py --output benchmarks/results/minilm-ewt.json
    python benchmarks/train_minilm_heads.py --reference minilm-ewt-trf --train

``--train`` trains tagger, parser and NER over the frozen all-MiniLM-L6-v2 encoder (tags and
trees of UD-EWT train, entities of UNER dev; about ten minutes on two cores) and writes them
to the reference's heads folder (``samples/spacy_accelerate_samples/minilm_ewt_heads/``
for ``minilm-ewt``) with the record of the run, see
:mod:`spacy_accelerate_samples.trained`. Without it, the sample is built from the committed
heads (seconds) and scored: tag accuracy, UAS/LAS and NER P/R/F on test, the build time, and
whether the encoder weights are identical to the untrained "minilm" sample's (they must be:
only the heads are trained). ``--pipeline DIR`` scores another pipeline folder instead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import spacy  # noqa: E402
from spacy_accelerate_samples.pipelines import ensure_sample  # noqa: E402
from spacy_accelerate_samples.trained import (  # noqa: E402
    REFERENCES,
    TRAINED_SAMPLE_NAME,
    encoder_state_digest,
    ensure_trained_sample,
    evaluate_on_ewt_test,
    same_encoder_weights,
    train_heads_artifact,
)

from spacy_accelerate.bench.side_by_side import write_report  # noqa: E402
from spacy_accelerate.export.fingerprint import package_versions  # noqa: E402


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _train(args: argparse.Namespace) -> dict[str, object]:
    reference = REFERENCES[args.reference]
    settings = reference.training
    if args.epochs is not None:
        settings = replace(settings, epochs=args.epochs)
    if args.train_sentences is not None:
        settings = replace(settings, train_sentences=args.train_sentences)
    target = args.heads or reference.heads_dir
    record = train_heads_artifact(reference, settings, target, log=_log)
    return {"trained": str(target), **record}


def _score(args: argparse.Namespace) -> dict[str, object]:
    started = time.perf_counter()
    heads = args.heads or REFERENCES[args.reference].heads_dir
    folder = args.pipeline or ensure_trained_sample(args.cache_root, heads)
    built = time.perf_counter() - started
    _log(f"pipeline at {folder} (ready after {built:.1f}s)")
    nlp = spacy.load(folder)
    _log("evaluating on UD-EWT test")
    scores = evaluate_on_ewt_test(nlp, args.sentences, batch_size=args.batch_size)
    report: dict[str, object] = {
        "pipeline": str(folder),
        "ready_seconds": round(built, 2),
        "test_scores": scores,
        "encoder_sha256": encoder_state_digest(nlp),
    }
    if (folder / "sample.json").exists():
        report["build"] = json.loads((folder / "sample.json").read_text(encoding="utf8"))
    if not args.skip_encoder_check:
        untrained = spacy.load(ensure_sample("minilm", args.cache_root))
        report["encoder_identical_to_minilm"] = same_encoder_weights(nlp, untrained)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", action="store_true", help="train the heads and write them")
    parser.add_argument("--reference", choices=sorted(REFERENCES), default=TRAINED_SAMPLE_NAME)
    parser.add_argument("--heads", type=Path, help="the heads folder (default: the reference's)")
    parser.add_argument("--epochs", type=int, help="--train: epochs (default: the recipe's)")
    parser.add_argument("--train-sentences", type=int, help="--train: first N of EWT train")
    parser.add_argument("--pipeline", type=Path, help="score this pipeline folder instead")
    parser.add_argument("--cache-root", type=Path, help="sample cache (default: the usual one)")
    parser.add_argument("--sentences", type=int, help="score the first N test sentences only")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--skip-encoder-check", action="store_true")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    report = _train(args) if args.train else _score(args)
    scores = report["test_scores"]
    assert isinstance(scores, dict)
    _log(
        f"test: tag_acc {scores['tag_acc']:.3f}  UAS {scores['dep_uas']:.3f}  "
        f"LAS {scores['dep_las']:.3f}  NER F1 {scores['ents_f']:.3f}"
    )
    report["machine"] = {"platform": platform.platform(), "cpus": len(os.sched_getaffinity(0))}
    report["versions"] = package_versions()
    report["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_report(report, args.output)
    if report.get("encoder_identical_to_minilm") is False:
        raise SystemExit("the trained sample's encoder differs from MiniLM's")


if __name__ == "__main__":
    main()
