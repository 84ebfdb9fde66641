"""How many calibration rows ONNX Runtime's per-MatMul harm needs: rankings compared.

    python benchmarks/harm_rows.py --pipelines minilm-ewt trf-base \\
        --output benchmarks/results/harm_rows-<machine>.json

The int8 ladder puts the MatMuls that harm most back in float, most harmful first, so
what matters of :func:`~spacy_accelerate.backends.onnxruntime.quantize.matmul_harm` is
which MatMuls lead its ranking. For each pipeline, ``optimize(nlp, "cpu", "int8")`` runs
until its ladder measures the harm (its whole plans cut to all-int8, so the ladder is
reached whatever they would do); the model and calibration items it measures on are
kept, and the harm is measured on each row count in turn, in this one process. Reported
per row count: its seconds, its Spearman correlation with the most rows' ranking, and how
many of the most rows' top k MatMuls it also ranks in its top k.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import onnx  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402
from spacy_accelerate_samples.trained import (  # noqa: E402
    BENCHMARK_PIPELINES,
    load_benchmark_pipeline,
)

import spacy_accelerate  # noqa: E402
from spacy_accelerate.backends.onnxruntime import quantize  # noqa: E402

ROW_COUNTS = (8, 4, 3, 2)
TOP = (4, 8, 12)


class _Measured(Exception):
    """Raised by the spy once the ladder asks for the harm: the search goes no further."""


def harm_inputs(name: str) -> tuple[Any, ...]:
    """The prepared model, calibration items and recipe ``name``'s int8 ladder measures on."""
    captured: list[tuple[Any, ...]] = []
    measure, whole = quantize.matmul_harm, quantize.OnnxRuntimeQuantizer.whole_plans

    def spy(*args: Any, **kwargs: Any) -> dict[str, float]:
        captured.append(args)
        raise _Measured

    quantize.matmul_harm = spy  # type: ignore[assignment]
    quantize.OnnxRuntimeQuantizer.whole_plans = lambda self: [quantize.KeptFloat()]  # type: ignore[method-assign]
    try:
        spacy_accelerate.optimize(
            load_benchmark_pipeline(name), "cpu", "int8", cache_dir=tempfile.mkdtemp()
        )
    except _Measured:
        pass
    finally:
        quantize.matmul_harm = measure  # type: ignore[assignment]
        quantize.OnnxRuntimeQuantizer.whole_plans = whole  # type: ignore[method-assign]
    if not captured:
        raise SystemExit(f"{name}: the int8 search served a plan before its ladder")
    return captured[0]


def compare(name: str) -> dict[str, Any]:
    prepared, items, recipe = harm_inputs(name)
    harm: dict[int, dict[str, float]] = {}
    seconds: dict[int, float] = {}
    for rows in ROW_COUNTS:
        started = time.perf_counter()
        model = onnx.ModelProto()
        model.CopyFrom(prepared)  # made switchable in place
        harm[rows] = quantize.matmul_harm(model, items, replace(recipe, harm_rows=rows))
        seconds[rows] = round(time.perf_counter() - started, 1)
    reference = harm[max(ROW_COUNTS)]
    names = list(reference)

    def top(ranking: dict[str, float], k: int) -> set[str]:
        return set(sorted(ranking, key=ranking.__getitem__, reverse=True)[:k])

    result = {}
    for rows in ROW_COUNTS:
        rho = spearmanr([reference[n] for n in names], [harm[rows][n] for n in names])
        result[str(rows)] = {
            "seconds": seconds[rows],
            "spearman": round(float(rho.correlation), 4),
            "top_k_kept": {str(k): len(top(reference, k) & top(harm[rows], k)) for k in TOP},
        }
        print(name, rows, "rows:", result[str(rows)], flush=True)
    return {"matmuls": len(names), "reference_rows": max(ROW_COUNTS), "rows": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", nargs="+", default=list(BENCHMARK_PIPELINES))
    parser.add_argument("--output", help="where to write the results (JSON)")
    args = parser.parse_args()
    results = {name: compare(name) for name in args.pipelines}
    if args.output:
        with open(args.output, "w") as file:
            json.dump(results, file, indent=2)


if __name__ == "__main__":
    main()
