"""A saved accelerated pipeline on a new machine: loaded from its bundle vs rebuilt.

    python benchmarks/bundle.py load --pipelines minilm-ewt trf-base \\
        --output benchmarks/results/bundle_load-<machine>.json
    python benchmarks/bundle.py fleet --work /tmp/fleet --venv /tmp/fleet/venv \\
        --output benchmarks/results/bundle_fleet-<machine>.json

``load``: for each pipeline and plan, one ``optimize()`` in an empty cache, saved twice:
with its bundle (the default) and with ``bundle=False`` (options only, the release before
the bundle). Each folder is then loaded by a fresh process with an empty cache of its own,
timed from ``spacy.load`` to the first annotated document; the report gives both times,
what the log says served the model (``bundled``, ``exported``), the files the load wrote
into its cache, and the size of each saved folder beside the plain PyTorch pipeline's.

``fleet``: the acceptance of the bundle on a fresh machine. Each plan's bundled folder is
packaged with ``spacy package --build wheel``, the wheel installed with pip into ``--venv``
(a virtual environment made apart from this checkout's, with spacy-accelerate installed
in it), and loaded there by the ``nobody`` user with ``SPACY_ACCELERATE_CACHE`` pointing at
an empty folder that user cannot write. Its annotations of the EWT test sentences are
compared token by token with those of the process that saved it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from run import machine  # noqa: E402
from spacy_accelerate_samples import ewt  # noqa: E402
from spacy_accelerate_samples.trained import REFERENCES, load_benchmark_pipeline  # noqa: E402

import spacy_accelerate  # noqa: E402
from spacy_accelerate.bench.side_by_side import write_report  # noqa: E402
from spacy_accelerate.cache.root import CACHE_ENV_VAR  # noqa: E402

#: (provider, precision) of each plan, by the name the report gives it.
PLANS: dict[str, tuple[str, str]] = {
    "cpu fp32": ("cpu", "fp32"),
    "openvino bf16": ("openvino", "bf16"),
    "openvino int8": ("openvino", "int8"),
    "cpu int8": ("cpu", "int8"),
    "auto": ("auto", "auto"),
}

#: Run by each loading process: ``spacy.load`` of argv[1], then every text of the JSON
#: file argv[2] annotated; writes the timings, the library's log and the annotations to
#: argv[3]. Only spaCy, the library and the standard library: it runs in other venvs.
LOADER = """
import json, logging, sys, time
started = time.perf_counter()
import spacy
imported = time.perf_counter()
lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logger = logging.getLogger("spacy_accelerate")
logger.setLevel(logging.INFO)
logger.addHandler(Keep())
texts = json.load(open(sys.argv[2]))
nlp = spacy.load(sys.argv[1])
first = nlp(texts[0])
ready = time.perf_counter()
docs = [first, *nlp.pipe(texts[1:])] if len(sys.argv) > 4 else [first]
rows = [[[t.tag_, t.pos_, t.dep_, t.head.i, t.ent_iob_, t.ent_type_] for t in d] for d in docs]
json.dump({"import_s": imported - started, "load_to_first_doc_s": ready - imported,
           "log": lines, "annotations": rows}, open(sys.argv[3], "w"))
"""


@dataclass(frozen=True)
class Saved:
    """One plan of one pipeline, optimized once and saved both ways."""

    pipeline: str
    plan: str
    bundled: Path
    options_only: Path
    optimize_s: float
    served: str
    annotations: list[Any]


def _annotations(nlp: Any, texts: list[str]) -> list[Any]:
    return [
        [[t.tag_, t.pos_, t.dep_, t.head.i, t.ent_iob_, t.ent_type_] for t in doc]
        for doc in [nlp(texts[0]), *nlp.pipe(texts[1:])]
    ]


def save_plan(pipeline: str, plan: str, texts: list[str], work: Path) -> Saved:
    """Optimize ``pipeline`` for ``plan`` in an empty cache (named by the environment, so
    that the saved options record no cache folder) and save it with and without its bundle."""
    provider, precision = PLANS[plan]
    folder = work / pipeline / plan.replace(" ", "-")
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_ENV_VAR] = tempfile.mkdtemp(prefix="bundle-save-cache-")
    nlp = load_benchmark_pipeline(pipeline)
    started = time.perf_counter()
    spacy_accelerate.optimize(nlp, provider, precision)
    optimize_s = time.perf_counter() - started
    served = "; ".join(
        p.exported.summary for p in spacy_accelerate.accelerated_components(nlp).values()
    )
    expected = _annotations(nlp, texts)
    nlp.to_disk(folder / "bundled")
    spacy_accelerate.optimize(nlp, provider, precision, bundle=False)  # the cache's entry
    nlp.to_disk(folder / "options-only")
    shutil.rmtree(os.environ.pop(CACHE_ENV_VAR))
    return Saved(
        pipeline, plan, folder / "bundled", folder / "options-only", optimize_s, served, expected
    )


def size_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def load_in_fresh_process(
    python: str, target: str, texts: Path, cache: Path, *, every: bool, user: str | None = None
) -> dict[str, Any]:
    """Run :data:`LOADER` on ``target`` (a folder or an installed package's name) with
    ``cache`` as its cache; its report, with the files it left in ``cache``."""
    out = Path(tempfile.mkdtemp(prefix="bundle-load-")) / "report.json"
    out.parent.chmod(0o777)
    command = [python, "-c", LOADER, target, str(texts), str(out), *(["all"] if every else [])]
    env = {**os.environ, CACHE_ENV_VAR: str(cache)}
    if user is not None:  # runuser resets HOME: env sets it (and the cache) again
        home = tempfile.mkdtemp(prefix="bundle-home-")
        Path(home).chmod(0o777)
        command = [
            "runuser",
            "-u",
            user,
            "--",
            "env",
            f"HOME={home}",
            f"{CACHE_ENV_VAR}={cache}",
            *command,
        ]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=out.parent)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"loading {target} failed:\n{done.stderr[-4000:]}")
    report = json.loads(out.read_text())
    report["process_s"] = wall
    report["cache_files"] = sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))
    report["source"] = _sources(report["log"])
    return report


def _sources(log: list[str]) -> list[str]:
    """What served each transformer, from the library's start line."""
    return [m.group(1) for line in log if (m := re.search(r"runs (.+?), key ", line))]


def differing_tokens(expected: list[Any], got: list[Any]) -> int:
    assert len(expected) == len(got), (len(expected), len(got))
    pairs = zip(expected, got, strict=True)
    return sum(a != b for x, y in pairs for a, b in zip(x, y, strict=True))


def load_rows(saved: Saved, texts_file: Path, plain: dict[str, Any]) -> dict[str, Any]:
    """One report row: both saved folders loaded by fresh processes, fresh caches."""
    row: dict[str, Any] = {
        "pipeline": saved.pipeline,
        "plan": saved.plan,
        "served": saved.served,
        "optimize_s": saved.optimize_s,
        "pytorch_load_to_first_doc_s": plain["load_to_first_doc_s"],
        "size_mib": {
            "plain pipeline": plain["size_mib"],
            "bundled": size_mib(saved.bundled),
            "options only": size_mib(saved.options_only),
        },
    }
    for name, folder in (("bundled", saved.bundled), ("rebuild", saved.options_only)):
        cache = Path(tempfile.mkdtemp(prefix="bundle-load-cache-"))
        report = load_in_fresh_process(sys.executable, str(folder), texts_file, cache, every=False)
        report["first_doc_same"] = differing_tokens(saved.annotations[:1], report["annotations"])
        del report["annotations"]
        row[name] = report
        shutil.rmtree(cache)
    return row


def plain_pipeline(pipeline: str, work: Path, texts_file: Path) -> dict[str, Any]:
    """The PyTorch pipeline saved as it is: its size, and its own load to the first doc."""
    folder = work / pipeline / "plain"
    folder.parent.mkdir(parents=True, exist_ok=True)
    load_benchmark_pipeline(pipeline).to_disk(folder)
    cache = Path(tempfile.mkdtemp(prefix="bundle-load-cache-"))
    report = load_in_fresh_process(sys.executable, str(folder), texts_file, cache, every=False)
    return {"size_mib": size_mib(folder), "load_to_first_doc_s": report["load_to_first_doc_s"]}


def run_load(args: argparse.Namespace) -> dict[str, Any]:
    texts = [s.text for s in ewt.read_sentences("test")[: args.sentences]]
    texts_file = args.work / "texts.json"
    texts_file.write_text(json.dumps(texts))
    rows = []
    print(HEADER, flush=True)
    for pipeline in args.pipelines:
        plain = plain_pipeline(pipeline, args.work, texts_file)
        for plan in args.plans:
            try:
                saved = save_plan(pipeline, plan, texts, args.work)
            except spacy_accelerate.SpacyAccelerateError as err:
                rows.append({"pipeline": pipeline, "plan": plan, "refused": str(err)})
                continue
            rows.append(load_rows(saved, texts_file, plain))
            print(markdown_row(rows[-1]), flush=True)
    return {"mode": "load", "rows": rows}


HEADER = (
    "| pipeline | plan (served) | PyTorch | bundled | rebuild | rebuild / bundled "
    "| size plain / bundled | cache files bundled / rebuild |\n|---|---|---|---|---|---|---|---|"
)


def markdown_row(row: dict[str, Any]) -> str:
    if "refused" in row:
        return f"| {row['pipeline']} | {row['plan']} | refused | | | | | |"
    bundled, rebuild, size = row["bundled"], row["rebuild"], row["size_mib"]
    return (
        f"| {row['pipeline']} | {row['plan']} ({row['served']}) "
        f"| {row['pytorch_load_to_first_doc_s']:.2f} s "
        f"| {bundled['load_to_first_doc_s']:.2f} s | {rebuild['load_to_first_doc_s']:.2f} s "
        f"| {rebuild['load_to_first_doc_s'] / bundled['load_to_first_doc_s']:.1f}x "
        f"| {size['plain pipeline']:.0f} / {size['bundled']:.0f} MiB "
        f"| {len(bundled['cache_files'])} / {len(rebuild['cache_files'])} |"
    )


def package(saved: Saved, dist: Path) -> Path:
    """``spacy package --build wheel`` of the bundled folder; the wheel's path."""
    meta_file = saved.bundled / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta.update(name=f"{saved.pipeline}_{saved.plan}".replace("-", "_").replace(" ", "_"))
    meta.update(version="0.0.1")
    meta_file.write_text(json.dumps(meta, indent=2))
    dist.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "spacy", "package", str(saved.bundled), str(dist)]
    subprocess.run([*command, "--build", "wheel", "--force"], check=True, capture_output=True)
    (wheel,) = dist.glob(f"{meta['lang']}_{meta['name']}-*/dist/*.whl")
    return wheel


def fleet_row(saved: Saved, venv: Path, work: Path, texts_file: Path) -> dict[str, Any]:
    wheel = package(saved, work / "dist")
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)], check=True)
    cache = Path(tempfile.mkdtemp(prefix="bundle-ro-cache-"))
    cache.chmod(0o555)  # the loading user may read it, never write it
    name = wheel.name.split("-")[0]
    report = load_in_fresh_process(python, name, texts_file, cache, every=True, user="nobody")
    return {
        "pipeline": saved.pipeline,
        "plan": saved.plan,
        "served when saved": saved.served,
        "wheel": wheel.name,
        "wheel_mib": wheel.stat().st_size / 2**20,
        "served when loaded": report["source"],
        "sentences": len(report["annotations"]),
        "tokens": sum(len(doc) for doc in report["annotations"]),
        "tokens_differing": differing_tokens(saved.annotations, report["annotations"]),
        "cache_files": report["cache_files"],
        "load_to_first_doc_s": report["load_to_first_doc_s"],
        "log": report["log"],
    }


def run_fleet(args: argparse.Namespace) -> dict[str, Any]:
    texts = [s.text for s in ewt.read_sentences("test")[: args.sentences]]
    texts_file = args.work / "texts.json"
    texts_file.write_text(json.dumps(texts))
    texts_file.chmod(0o644)
    rows = []
    for pipeline in args.pipelines:
        for plan in args.plans:
            row = fleet_row(
                save_plan(pipeline, plan, texts, args.work), args.venv, args.work, texts_file
            )
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "log"}), flush=True)
    return {"mode": "fleet", "venv": str(args.venv), "rows": rows}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("load", "fleet"))
    parser.add_argument("--pipelines", nargs="+", default=list(REFERENCES))
    parser.add_argument("--plans", nargs="+", choices=list(PLANS), default=None)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--work", type=Path, default=None, help="where folders are saved")
    parser.add_argument("--venv", type=Path, help="fleet: the venv the wheels go into")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.plans is None:
        args.plans = ["cpu fp32", "openvino bf16", "openvino int8", "auto"]
    if args.mode == "fleet" and args.venv is None:
        parser.error("fleet needs --venv: a virtual environment with spacy-accelerate installed")
    if args.work is None:
        args.work = Path(tempfile.mkdtemp(prefix="bundle-bench-"))
    args.work.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    report = run_load(args) if args.mode == "load" else run_fleet(args)
    report.update(machine=machine(), date=time.strftime("%Y-%m-%d"))
    report.update(sentences=args.sentences, pipelines=args.pipelines, plans=args.plans)
    write_report(report, args.output, echo=False)


if __name__ == "__main__":
    main()
