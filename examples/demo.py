"""Accelerate a real spaCy transformer pipeline and compare it with PyTorch.

The README's first command ends with this script (see :mod:`spacy_accelerate_samples.demo`):
MiniLM-L6 with real weights and heads trained on UD-EWT train (NER on Universal NER
dev), assembled offline on the first run, then UD-EWT test documents through PyTorch
and through the accelerated pipeline (fp32 and ``precision="auto"``), alternating;
prints the plan ``auto`` chose, words per second, the speedups, the agreement with
PyTorch and a few documents' entities.

    python examples/demo.py [--sentences 1000] [--batch-size 64] [--repeats 3]
"""

from __future__ import annotations

import argparse

from spacy_accelerate_samples.demo import run_demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    run_demo(sentences=args.sentences, batch_size=args.batch_size, repeats=args.repeats)


if __name__ == "__main__":
    main()
