"""Annotate a text file on Ray Data with an accelerated pipeline, and print a few rows.

    python examples/ray_annotate.py [PIPELINE] [TEXTS] [--workers 1] [--fields entities,tags]

PIPELINE is what ``spacy.load`` takes (a folder or an installed package such as
``en_core_web_trf``); without it, the repository's tiny ``roberta`` sample (random weights:
the annotations are noise, the plumbing is real), built offline on the first run, which
needs the sample distribution (``pip install -e ./samples``). TEXTS is a UTF-8 file, one
document a line; without it, 200 UD-EWT test sentences. Needs the ``ray`` extra:
``pip install 'spacy-accelerate[ray]'``.

A local Ray starts with this machine's CPUs (give ``--address`` to use a running
cluster); each of ``--workers`` actors loads the pipeline once and runs ``optimize()`` on
it, sharing one model cache. The same job from the shell is ``spacy-accelerate annotate``
(docs/ray.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def default_inputs(folder: Path) -> tuple[str, Path]:
    """The roberta sample and 200 EWT test sentences, from the samples distribution."""
    from spacy_accelerate_samples import ewt
    from spacy_accelerate_samples.pipelines import ensure_sample

    samples = Path(os.environ.get("SPACY_ACCELERATE_SAMPLES", folder / "samples"))
    texts = folder / "ewt-test.txt"
    texts.write_text("\n".join(s.text for s in ewt.read_sentences("test")[:200]) + "\n")
    return str(ensure_sample("roberta", samples)), texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline", nargs="?", help="default: the roberta sample")
    parser.add_argument("texts", nargs="?", type=Path, help="default: 200 EWT sentences")
    parser.add_argument("--workers", type=int, default=1, help="actors (default 1)")
    parser.add_argument("--fields", default="entities,tags", help="annotations to add")
    parser.add_argument("--provider", default="cpu", help="optimize()'s provider")
    parser.add_argument("--precision", default="fp32", help="optimize()'s precision")
    parser.add_argument("--address", help="a running Ray cluster (default: a local Ray)")
    parser.add_argument("--rows", type=int, default=3, help="rows to print")
    args = parser.parse_args()

    import ray

    from spacy_accelerate.ray import annotate

    with tempfile.TemporaryDirectory() as scratch:
        pipeline, texts = args.pipeline, args.texts
        if pipeline is None or texts is None:
            sample, ewt_texts = default_inputs(Path(scratch))
            pipeline, texts = pipeline or sample, texts or ewt_texts
        started = time.perf_counter()
        ray.init(address=args.address, include_dashboard=False)
        try:
            rows = annotate(
                ray.data.read_text(str(texts)),  # one row a line, column "text"
                pipeline,
                fields=args.fields.split(","),
                optimize_options={"provider": args.provider, "precision": args.precision},
                concurrency=args.workers,
            ).take_all()
        finally:
            ray.shutdown()
        seconds = time.perf_counter() - started
    errors = sum(row["error"] is not None for row in rows)
    print(f"{len(rows)} rows ({errors} with errors) in {seconds:.1f} s, start-up included")
    for row in rows[: args.rows]:
        print(f"\n{row['text']}")
        for field in args.fields.split(","):
            print(f"  {field}: {row[field]}")


if __name__ == "__main__":
    main()
