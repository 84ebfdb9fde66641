"""Where one document's time goes: ``nlp(text)`` on held-out sentences, stage by stage,
PyTorch against an accelerated plan, the two alternating sentence by sentence (issue 61,
item 5).

    python benchmarks/one_document.py --pipeline minilm-ewt --provider cpu --precision fp32 \\
        --output benchmarks/results/one-document-minilm-ewt-<machine>.json

Each stage is timed as spaCy runs it (``nlp.make_doc``, then every component's
``__call__``); the accelerated transformer's stage is split into the runtime's own call
(``run_whole`` of its runner: ONNX Runtime's ``InferenceSession.run`` or OpenVINO's
``infer``) and the rest (curated-transformers' pieces and spans, and this library's proxy,
shared calls and layer mixes). Medians over the sentences, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from run import machine  # noqa: E402
from spacy.language import Language  # noqa: E402
from spacy_accelerate_samples import ewt  # noqa: E402
from spacy_accelerate_samples.trained import load_benchmark_pipeline  # noqa: E402

import spacy_accelerate  # noqa: E402

RUNTIME = "runtime call"


def timed_runtime(nlp: Language, spent: list[float]) -> None:
    """Every runtime call of ``nlp``'s accelerated transformer adds its seconds to
    ``spent``."""
    for proxy in spacy_accelerate.accelerated_components(nlp).values():
        runner = proxy.session.runner
        run_whole: Callable[..., Any] = runner.run_whole

        def timed(*args: Any, _run: Callable[..., Any] = run_whole) -> Any:
            started = time.perf_counter()
            try:
                return _run(*args)
            finally:
                spent.append(time.perf_counter() - started)

        runner.run_whole = timed


def stages(nlp: Language, text: str, spent: list[float]) -> dict[str, float]:
    """Seconds of each stage of ``nlp(text)``; the transformer's split where it is timed."""
    found: dict[str, float] = {}
    started = time.perf_counter()
    doc = nlp.make_doc(text)
    found["tokenizer"] = time.perf_counter() - started
    for name, component in nlp.pipeline:
        spent.clear()
        started = time.perf_counter()
        doc = component(doc)
        found[name] = time.perf_counter() - started
        if spent and name == "transformer":
            found[RUNTIME] = sum(spent)
            found["transformer, the rest"] = found[name] - found[RUNTIME]
    found["whole"] = sum(seconds for name, seconds in found.items() if name in nlp.pipe_names)
    found["whole"] += found["tokenizer"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", default="minilm-ewt")
    parser.add_argument("--provider", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    texts = [s.text for s in ewt.read_sentences("test")[: args.sentences]]
    plain = load_benchmark_pipeline(args.pipeline)
    accelerated = load_benchmark_pipeline(args.pipeline)
    spacy_accelerate.optimize(
        accelerated,
        args.provider,
        args.precision,
        workload="documents",
        cache_dir=tempfile.mkdtemp(prefix="one-document-"),
    )
    spent: list[float] = []
    timed_runtime(accelerated, spent)
    variants = {"pytorch fp32": plain, f"{args.provider} {args.precision}": accelerated}
    for nlp in variants.values():  # untimed pass
        for text in texts[:30]:
            nlp(text)
    seconds: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in variants}
    for text in texts:
        for name, nlp in variants.items():
            for stage, spent_s in stages(nlp, text, spent).items():
                seconds[name][stage].append(spent_s)
    report: dict[str, Any] = {"machine": machine(), "args": vars(args) | {"output": None}}
    for name, found in seconds.items():
        report[name] = {stage: statistics.median(v) * 1e3 for stage, v in found.items()}
    print(json.dumps(report, indent=1))
    if args.output:
        args.output.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
