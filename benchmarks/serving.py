"""A pipeline in a service: memory, cold start and one-document latency, PyTorch against
every served plan.

    python benchmarks/serving.py --pipelines minilm-ewt trf-base \\
        --plans "cpu fp32" "cpu int8" "openvino fp32" "openvino int8" auto \\
        --output benchmarks/results/serving-<machine>.json

Each pipeline is saved once plain (PyTorch) and once per plan, accelerated with its bundle
(``--work`` keeps the folders between runs). Then, as a service would meet them:

- **load**: each saved folder loaded by ``--processes`` fresh processes, variants
  alternating, each with an empty cache of its own: seconds from ``import spacy`` and
  from ``spacy.load`` to the first annotated document (cold start), and the process's
  memory (``VmRSS``, and its anonymous and file-backed parts: file-backed pages of a
  memory-mapped model are shared by the processes that map it, and the system can drop
  them) right after loading and after annotating ``--documents`` paragraphs;
- **latency**: one process per pipeline holding every variant, calling ``nlp(text)`` on
  held-out EWT test sentences (single) and paragraphs of up to eight sentences, the
  variants alternating text by text so that the machine's noise falls on all alike: the
  median, 90th and 99th percentile, each against PyTorch's;
- **long request**: memory before and after one 100,000-character document, and what
  giving the runtime's working memory back costs (``long_request.py``);
- **traffic**: ``examples/web_service.py`` under uvicorn on 127.0.0.1, 1, 8 and 32
  closed-loop clients over HTTP, the plain service against the plain pipeline batched the
  same way and the accelerated ones (``traffic.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bundle import PLANS  # noqa: E402
from long_request import long_request_rows  # noqa: E402
from run import machine, machine_slug  # noqa: E402
from spacy_accelerate_samples import ewt  # noqa: E402
from spacy_accelerate_samples.trained import (  # noqa: E402
    BENCHMARK_PIPELINES,
    load_benchmark_pipeline,
)
from traffic import Variant, traffic_rows  # noqa: E402

import spacy_accelerate  # noqa: E402
from spacy_accelerate.cache.root import CACHE_ENV_VAR  # noqa: E402

PLAIN = "pytorch fp32"
#: What each accelerated variant asks ``optimize()`` for: bundle.py's plans (for batches),
#: OpenVINO fp32 (the CPUs without bf16), and ``auto`` told the pipeline serves single
#: documents.
SERVED: dict[str, tuple[str, str, str]] = {
    **{plan: (provider, precision, "batches") for plan, (provider, precision) in PLANS.items()},
    "openvino fp32": ("openvino", "fp32", "batches"),
    "cpu fp32 documents": ("cpu", "fp32", "documents"),
    "auto documents": ("auto", "auto", "documents"),
}

#: Run by each loading process: argv[1] the folder, argv[2] a JSON file of paragraphs;
#: prints one JSON line (times in seconds, memory in MiB).
LOADER = """
import json, sys, time
started = time.perf_counter()
import spacy
def memory():
    fields = {}
    for line in open("/proc/self/status"):
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields
texts = json.load(open(sys.argv[2]))
imported = time.perf_counter()
nlp = spacy.load(sys.argv[1])
loaded = time.perf_counter()
after_load = memory()
nlp(texts[0])
first = time.perf_counter()
for text in texts:
    nlp(text)
print(json.dumps({"import_s": imported - started, "load_s": loaded - imported,
    "load_to_first_doc_s": first - imported, "import_to_first_doc_s": first - started,
    "after_load": after_load, "after_annotating": memory()}))
"""


def save_variants(pipeline: str, plans: list[str], work: Path) -> dict[str, Path]:
    """The saved folder of each variant (plain first), made where missing."""
    folders = {PLAIN: work / pipeline / "pytorch"}
    folders.update({plan: work / pipeline / plan.replace(" ", "-") for plan in plans})
    for variant, folder in folders.items():
        if (folder / "config.cfg").exists():
            continue
        folder.parent.mkdir(parents=True, exist_ok=True)
        nlp = load_benchmark_pipeline(pipeline)
        if variant != PLAIN:
            cache = tempfile.mkdtemp(prefix="serving-save-cache-")
            os.environ[CACHE_ENV_VAR] = cache
            provider, precision, workload = SERVED[variant]
            spacy_accelerate.optimize(nlp, provider, precision, workload=workload)
        nlp.to_disk(folder)
        if variant != PLAIN:
            shutil.rmtree(os.environ.pop(CACHE_ENV_VAR))
    return folders


def load_once(folder: Path, paragraphs: Path) -> dict[str, Any]:
    cache = tempfile.mkdtemp(prefix="serving-load-cache-")
    try:
        env = {**os.environ, CACHE_ENV_VAR: cache}
        command = [sys.executable, "-c", LOADER, str(folder), str(paragraphs)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(cache)
    if done.returncode != 0:
        raise RuntimeError(f"loading {folder} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load_rows(folders: dict[str, Path], paragraphs: Path, processes: int) -> dict[str, Any]:
    """Every variant loaded by ``processes`` fresh processes, alternating; the median of
    each figure, and each figure's ratio to PyTorch's."""
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in folders}
    for _ in range(processes):
        for variant, folder in folders.items():
            runs[variant].append(load_once(folder, paragraphs))
    rows = {variant: _medians(reports) for variant, reports in runs.items()}
    for row in rows.values():
        row["vs_pytorch"] = {
            "rss_after_annotating": row["after_annotating"]["VmRSS"]
            / rows[PLAIN]["after_annotating"]["VmRSS"],
            "anonymous_after_annotating": row["after_annotating"]["RssAnon"]
            / rows[PLAIN]["after_annotating"]["RssAnon"],
            "cold_start_s": row["load_to_first_doc_s"] - rows[PLAIN]["load_to_first_doc_s"],
        }
    return rows


def _medians(reports: list[dict[str, Any]]) -> dict[str, Any]:
    first = reports[0]
    return {
        key: (
            {name: statistics.median(r[key][name] for r in reports) for name in first[key]}
            if isinstance(first[key], dict)
            else statistics.median(r[key] for r in reports)
        )
        for key in first
    } | {"processes": len(reports)}


def latency_rows(
    folders: dict[str, Path], texts: dict[str, list[str]], rounds: int
) -> dict[str, Any]:
    """Each variant's ``nlp(text)`` latencies, alternating text by text (the order of the
    variants turning each text), after one untimed pass over each kind of text."""
    import spacy

    pipelines = {variant: spacy.load(folder) for variant, folder in folders.items()}
    names = list(pipelines)
    report: dict[str, Any] = {}
    for kind, chosen in texts.items():
        for nlp in pipelines.values():  # warm: each new length's first call
            for text in chosen:
                nlp(text)
        seconds: dict[str, list[float]] = {variant: [] for variant in names}
        for turn in range(rounds):
            for index, text in enumerate(chosen):
                shift = (turn + index) % len(names)
                for variant in names[shift:] + names[:shift]:
                    started = time.perf_counter()
                    pipelines[variant](text)
                    seconds[variant].append(time.perf_counter() - started)
        report[kind] = _percentiles(seconds)
    return report


def _percentiles(seconds: dict[str, list[float]]) -> dict[str, Any]:
    def quantiles(values: list[float]) -> dict[str, float]:
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        return {"p50_ms": cuts[49] * 1e3, "p90_ms": cuts[89] * 1e3, "p99_ms": cuts[98] * 1e3}

    rows = {variant: quantiles(values) for variant, values in seconds.items()}
    plain = rows[PLAIN]
    for variant, row in rows.items():
        row["calls"] = len(seconds[variant])
        row["p50_speedup"] = plain["p50_ms"] / row["p50_ms"]
        row["p99_vs_pytorch"] = row["p99_ms"] / plain["p99_ms"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", nargs="+", default=list(BENCHMARK_PIPELINES))
    parser.add_argument("--plans", nargs="+", default=["cpu fp32", "openvino fp32"])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "serving")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--documents", type=int, default=64)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--server-processes", nargs="+", type=int, default=[1, 2])
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["load", "latency", "long", "traffic"]
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    unknown = [plan for plan in args.plans if plan not in SERVED]
    if unknown:
        parser.error(f"unknown plans {unknown}; choose from {sorted(SERVED)}")
    sentences = [s.text for s in ewt.read_sentences("test")[: args.sentences]]
    paragraphs = ewt.document_texts("test", sentences=8 * args.documents)[: args.documents]
    paragraphs_file = Path(tempfile.mkdtemp(prefix="serving-texts-")) / "paragraphs.json"
    paragraphs_file.write_text(json.dumps(paragraphs))
    report: dict[str, Any] = {"machine": machine(), "args": vars(args) | {"work": str(args.work)}}
    for pipeline in args.pipelines:
        folders = save_variants(pipeline, args.plans, args.work)
        row: dict[str, Any] = {}
        if "load" not in args.skip:
            row["load"] = load_rows(folders, paragraphs_file, args.processes)
        kinds = {"sentence": sentences, "paragraph": paragraphs[: args.sentences // 4]}
        if "latency" not in args.skip:
            row["latency"] = latency_rows(folders, kinds, args.rounds)
        if "long" not in args.skip:
            row["long_request"] = long_request_rows(
                folders, PLAIN, sentences, paragraphs, max(3, args.rounds)
            )
        if "traffic" not in args.skip:
            row["traffic"] = traffic_rows(
                _traffic_variants(folders, args.server_processes), kinds, args.clients, args.seconds
            )
        report[pipeline] = row
        print(json.dumps({pipeline: row}, indent=1, default=str), flush=True)
    output = args.output or Path(f"serving-{machine_slug(report['machine'])}.json")
    output.write_text(json.dumps(report, indent=2, default=str))
    print(f"written to {output}")


def _traffic_variants(folders: dict[str, Path], processes: list[int]) -> dict[str, Variant]:
    """The load run's variants, each served by every count of ``processes``: the plain
    folder without the library and with its batching, then every accelerated folder as
    served today; each accelerated folder also one request at a time in one process, as
    the example served before issue 61."""
    accelerated = dict(folders)
    plain = accelerated.pop(PLAIN)
    served = {"plain service": (plain, "plain"), "plain, batched": (plain, "library")}
    served.update({variant: (folder, "library") for variant, folder in accelerated.items()})
    variants = {
        f"{name}, {count} process{'es' if count > 1 else ''}": Variant(folder, mode, count)
        for name, (folder, mode) in served.items()
        for count in processes
    }
    for variant, folder in accelerated.items():
        variants[f"{variant}, one at a time (before issue 61)"] = Variant(folder, "locked")
    return variants


if __name__ == "__main__":
    main()
