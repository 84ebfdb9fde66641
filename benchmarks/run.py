"""The benchmark: every variant this machine can run, on real text, side by side.

    python benchmarks/run.py                       # both pipelines, defaults below
    python benchmarks/run.py --pipelines minilm-ewt --sentences 500 --repeats 3

    python benchmarks/run.py --no-bf16             # as on a CPU without bf16 units

For each benchmark pipeline (``trf-base``: en_core_web_trf's shape with random
weights; ``minilm-ewt`` and ``minilm-ewt-trf``: real MiniLM-L6 weights with heads trained on
UD-EWT train, NER on UNER dev, the first listening to all layers, the second with
en_core_web_trf's head design) and each variant available here (PyTorch fp32, PyTorch
bf16 autocast on a CPU, PyTorch fp16 autocast on a GPU, spacy-accelerate per provider and
precision): words per second of ``nlp.pipe`` over UD-EWT test documents, for
the full pipeline and for transformer + ner only, warm-up then ``--repeats``
passes with the variants alternating, as speedups over PyTorch fp32 and over
PyTorch bf16 autocast; accuracy against gold (tag accuracy, LAS,
NER F1); agreement of every annotation and the cosine of every piece's last
hidden state with PyTorch fp32; cold (empty cache) and warm ``optimize()``
time; and each variant's peak resident memory, measured in a fresh process
that loads the pipeline and runs only that variant (one process running every
variant cannot tell them apart). ``precision="auto"`` runs twice on an empty cache:
the pruned search it serves, and the full search (every candidate built and judged), to
show that both choose the same plan and what the pruning saves. ``--no-bf16`` runs every
variant as on a CPU without bf16 units (the library's CPU detection simulated: OpenVINO
compiles in f32, its bf16 is refused, PyTorch's bf16 autocast is left out). Writes
``benchmarks/results/<machine>-<date>.json`` and ``.md`` (the table);
``benchmarks/plot.py`` draws the chart.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Each variant's memory is measured in a process of its own (fork + exec): without this,
# Hugging Face tokenizers warns of parallelism "after a fork" once per child.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from spacy.language import Language  # noqa: E402
from spacy.scorer import Scorer  # noqa: E402
from spacy.training import Example  # noqa: E402
from spacy_accelerate_samples import ewt  # noqa: E402
from spacy_accelerate_samples.trained import (  # noqa: E402
    BENCHMARK_PIPELINES,
    REFERENCES,
    load_benchmark_pipeline,
)

import spacy_accelerate  # noqa: E402
from spacy_accelerate.bench import where_time_goes  # noqa: E402
from spacy_accelerate.bench.baselines import Accelerated, Variant, available_variants  # noqa: E402
from spacy_accelerate.bench.side_by_side import SideBySide, side_by_side, write_report  # noqa: E402
from spacy_accelerate.cpu_features import cpu_features, simulated  # noqa: E402
from spacy_accelerate.errors import AccuracyError, PrecisionUnavailableError  # noqa: E402
from spacy_accelerate.export.fingerprint import package_versions  # noqa: E402
from spacy_accelerate.options.agreement import parse_min_agreement  # noqa: E402
from spacy_accelerate.pipeline.components import transformer_components  # noqa: E402
from spacy_accelerate.planning.auto_search import full_search  # noqa: E402
from spacy_accelerate.verify.agreement import compare  # noqa: E402

RESULTS = Path(__file__).parent / "results"
#: UD-EWT test sentences per pipeline (the references: all of it): trf-base is ~15x slower
#: per word than MiniLM.
DEFAULT_SENTENCES = {"trf-base": 400} | {name: 2077 for name in REFERENCES}
SCORES = ("tag_acc", "dep_las", "ents_f")


#: The PyTorch variant every other one is also compared with (where it runs).
BF16_AUTOCAST = "pytorch bf16 autocast (cpu)"
#: ``precision="auto"``'s full search, beside the pruned one it serves.
AUTO = "accelerate auto"
AUTO_FULL = "accelerate auto (full search)"
#: ``precision="auto"`` with ``overlap=False``: the same plan, stage after stage.
AUTO_NO_OVERLAP = "accelerate auto (no overlap)"


class FullSearch(Accelerated):
    """``precision="auto"`` searching in full (every candidate built and judged) in a
    cache folder of its own, so that its cold start is cold too."""

    def apply(self, nlp: Language) -> None:
        with full_search():
            super().apply(nlp)


#: CPU features that decide which variants can be fast (bf16, VNNI int8, AMX).
CPU_FEATURES = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def machine() -> dict[str, Any]:
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": model,
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_features": [f for f in CPU_FEATURES if f in flags],
        "platform": platform.platform(),
    }
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:  # pragma: no cover
        pass
    return info


def machine_slug(info: dict[str, Any]) -> str:
    words = "".join(c if c.isalnum() else "-" for c in info["cpu"].lower()).split("-")
    cpu = "-".join(w for w in words if w and w not in {"r", "tm", "cpu", "intel", "amd"})[:40]
    gpu = "-" + "".join(c for c in info["gpu"].lower() if c.isalnum()) if "gpu" in info else ""
    return f"{cpu}-{info['cpus']}cpu{gpu}"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def optimize_times(nlp: Language, variant: Accelerated) -> dict[str, Any]:
    """First and second ``optimize()`` seconds in the run's cache, which the variants
    share (``cold``: whether the first call found its model built; ``precision="auto"``
    runs first, so its first call builds every candidate and searches, and the fixed
    precisions after it find their models built), and the plan served (int8: which
    MatMuls or layers stayed in float), with the plans refused and why."""
    start = time.perf_counter()
    Accelerated(variant.options).apply(nlp)
    cold = time.perf_counter() - start
    first = spacy_accelerate.accelerated_components(nlp).values()
    was_built = all(component.exported.cache_hit for component in first)
    start = time.perf_counter()
    Accelerated(variant.options).apply(nlp)
    warm = time.perf_counter() - start
    components = spacy_accelerate.accelerated_components(nlp).items()
    plans = {
        name: c.exported.record.plan for name, c in components if c.exported.record.plan is not None
    }
    served = {
        name: f"{c.session.config.provider.value} {c.session.config.precision.value}"
        for name, c in components
    }
    calibration = {
        name: c.exported.record.agreement.as_dict()
        for name, c in components
        if c.exported.record.agreement is not None
    }
    compiled = {
        n: c.exported.record.compiled_as for n, c in components if c.exported.record.compiled_as
    }
    refused = {
        name: list(c.exported.record.refused) for name, c in components if c.exported.record.refused
    }
    times: dict[str, Any] = {
        "first_call_found_it_built": was_built,
        "cold_seconds": round(cold, 2),
        "warm_seconds": round(warm, 2),
        "served": served,
    }
    if calibration:  # the gate's figures, to compare with the held-out test text's
        times["calibration_agreement"] = calibration
    if plans:
        times["plans"] = plans
    if compiled:
        times["compiled_as"] = compiled
    if refused:
        times["plans_refused"] = refused
    return times


def identical(first: list, second: list) -> bool:
    """Whether two runs gave the same documents: every token's tag, dependency, head and
    entity, and the transformer's last layer to the bit."""

    def annotations(doc: Any) -> tuple:
        tokens = [(t.tag_, t.dep_, t.head.i, t.ent_iob_, t.ent_type_) for t in doc]
        return tokens, doc._.trf_data.last_hidden_layer_state.dataXd.tobytes()

    return [annotations(d) for d in first] == [annotations(d) for d in second]


def held_out(reference: list, docs: list, optimized: dict[str, Any] | None) -> dict[str, Any]:
    """Every annotation's agreement on the UD-EWT test documents (held out: the gate saw
    only the calibration texts), next to its bound and the calibration figure, and
    whether it carried: within 0.5 point of the bound, or better."""
    bounds = parse_min_agreement(None)
    measured = compare(reference, docs)
    calibration = next(iter((optimized or {}).get("calibration_agreement", {}).values()), {})
    rows: dict[str, Any] = {}
    for annotation, rate in measured.rates:
        bound = bounds.bound(annotation)
        rows[annotation.value] = {
            "test": round(rate.rate, 5),
            "calibration": round(calibration[annotation.value]["rate"], 5)
            if annotation.value in calibration
            else None,
            "bound": bound,
            "carried": rate.rate >= bound - 0.005,
        }
    return rows


def gold_scores(nlp: Language, docs: list, gold: list) -> dict[str, float]:
    examples = [Example(pred, ref) for pred, ref in zip(docs, gold, strict=True)]
    scores = Scorer(nlp).score(examples)
    return {key: round(float(scores.get(key) or 0.0), 4) for key in SCORES}


def run_pipeline(
    name: str, variants: dict[str, Variant], args: argparse.Namespace
) -> dict[str, Any]:
    nlp = load_benchmark_pipeline(name)
    sentences = args.sentences or DEFAULT_SENTENCES.get(name, 500)
    gold = ewt.load_documents("test", max_sentences=8, limit_sentences=sentences, vocab=nlp.vocab)
    texts = [doc.text for doc in gold]
    others = {k: v for k, v in variants.items() if k != "pytorch fp32"}
    report: dict[str, Any] = {"documents": len(texts), "sentences": sentences, "variants": {}}

    timings, refused = {}, {}
    # precision="auto" first: its cold start builds every candidate in the empty cache.
    ordered = sorted(others, key=lambda key: key not in (AUTO, AUTO_FULL))
    for key, variant in [(key, others[key]) for key in ordered]:
        if not isinstance(variant, Accelerated):
            continue
        try:
            timings[key] = optimize_times(nlp, variant)
        except (AccuracyError, PrecisionUnavailableError) as error:
            # The gate said no, int8 was not faster than the float plan here, or this CPU
            # has no bf16 units: reported, not run.
            refused[key] = f"{type(error).__name__}: {error}"
            del others[key]
    report["refused"] = refused
    ner_only = [c.name for c in transformer_components(nlp)] + ["ner"]
    modes: dict[str, SideBySide] = {}
    for mode in args.modes:
        print(f"[{datetime.now():%H:%M:%S}] {name}: {mode}", flush=True)
        enabled = nlp.pipe_names if mode == "full" else ner_only
        with nlp.select_pipes(enable=enabled):
            # The gate judges what runs: with fewer components a plan is judged anew, and
            # may be refused in this mode only.
            served = {}
            for key, variant in others.items():
                try:
                    variant.apply(nlp)
                    served[key] = variant
                except (AccuracyError, PrecisionUnavailableError) as error:
                    refused[f"{key} ({mode})"] = f"{type(error).__name__}: {error}"
            modes[mode] = side_by_side(
                nlp, texts, served, batch_size=args.batch_size, repeats=args.repeats
            )

    full = modes["full"]
    report["words"] = full.words
    report["variants"]["pytorch fp32"] = {
        "wps": {mode: round(result.pytorch_wps, 1) for mode, result in modes.items()},
        "speedup": {mode: 1.0 for mode in modes},
        "gold": gold_scores(nlp, full.reference, gold),
    }
    for variant in others:
        result = full.variants[variant]
        report["variants"][variant] = {
            "options": result.options,
            "wps": {m: round(r.wps(variant), 1) for m, r in modes.items() if variant in r.variants},
            "speedup": {
                m: round(r.speedup(variant), 3) for m, r in modes.items() if variant in r.variants
            },
            "vs_bf16_autocast": {
                m: round(r.speedup(variant) / r.speedup(BF16_AUTOCAST), 3)
                for m, r in modes.items()
                if variant in r.variants and BF16_AUTOCAST in r.variants
            },
            "seconds": {
                m: r.variants[variant].seconds for m, r in modes.items() if variant in r.variants
            },
            "gold": gold_scores(nlp, result.docs, gold),
            "agreement": {k: round(result.agreement.rate(k), 5) for k in result.agreement.same},
            "test_agreement": held_out(full.reference, result.docs, timings.get(variant)),
            "tokens": result.agreement.tokens,
            "min_token_cosine": round(result.min_token_cosine, 5),
            "mean_token_cosine": round(result.mean_token_cosine, 6),
            "setup_seconds": round(result.setup_seconds, 2),
            **({"optimize": timings[variant]} if variant in timings else {}),
        }
    report["pytorch_seconds"] = {mode: r.pytorch_seconds for mode, r in modes.items()}
    if AUTO in full.variants and AUTO_NO_OVERLAP in full.variants:
        overlapped, stepwise = full.variants[AUTO].docs, full.variants[AUTO_NO_OVERLAP].docs
        report["overlap_identical"] = identical(overlapped, stepwise)
        report["overlap_vs_not"] = round(full.wps(AUTO) / full.wps(AUTO_NO_OVERLAP), 3)
    if AUTO in others:
        stages = where_time_goes.measure(nlp, texts, AUTO, others[AUTO], args.batch_size)
        report["where_time_goes"] = stages.as_dict()
        print("\n".join(stages.lines()), flush=True)
    for variant, row in report["variants"].items():
        row["peak_rss_mib"] = peak_rss_of(name, variant) if args.rss else None
    return report


def peak_rss_of(pipeline: str, variant: str) -> float | None:
    """Peak resident memory of a fresh process running only ``variant`` (cache warm)."""
    command = [sys.executable, __file__, "--rss-probe", pipeline, variant]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if completed.returncode != 0:
        print(f"memory probe of {pipeline} / {variant} failed: {completed.stderr[-500:]}")
        return None
    return float(completed.stdout.strip().splitlines()[-1])


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise OSError(f"no {field} in /proc/self/status")


def rss_probe(pipeline: str, variant: str) -> None:
    """The child side of :func:`peak_rss_of`: load, switch, annotate, print the peak.

    Loading a pipeline (imports, reading weights) peaks higher than running
    one, so the peak is reset once the pipeline is loaded (Linux: writing 5 to
    /proc/self/clear_refs) and the figure is the peak while the variant is
    switched on and runs, pipeline included.
    """
    nlp = load_benchmark_pipeline(pipeline)
    texts = [doc.text for doc in ewt.load_documents("test", limit_sentences=200)]
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not Linux: the peak then includes loading
        pass
    benchmark_variants(OPENVINO_LOWERED_AGREEMENT)[0][variant].apply(nlp)
    list(nlp.pipe(texts, batch_size=64))
    try:
        print(round(_status_mib("VmHWM"), 1))
    except OSError:
        print(round(peak_rss_mib(), 1))


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else ""


def _speed(row: dict[str, Any], vs_bf16: dict[str, float], mode: str) -> str:
    """A variant's words per second, speedup and ratio to bf16 autocast in ``mode`` (three
    cells); a variant refused in that mode says so (its reason is listed below the table)."""
    if mode not in row["wps"]:
        return "refused | | "
    return f"{row['wps'][mode]:,.0f} | {row['speedup'][mode]:.2f}x | {_ratio(vs_bf16.get(mode))}"


def _mib(value: float | None) -> str:
    return f"{value:,.0f} MiB" if value is not None else "not measured"


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cpus']} CPUs ({', '.join(m['cpu_features'])})"
        + (f", {m['gpu']}" if "gpu" in m else "")
        + ".",
        f"Batch size {results['batch_size']}, median of {results['repeats']} alternating passes "
        "after a warm-up; speedups are against PyTorch fp32 in the same run, 'vs bf16' against "
        "PyTorch bf16 autocast."
        + (" bf16 unavailable (simulated CPU without bf16 units)." if results["no_bf16"] else ""),
        "",
        "| pipeline | variant | full WPS | speedup | vs bf16 | trf+ner WPS | speedup | vs bf16 "
        "| tag acc | LAS | NER F1 | agreement tag / dep / ent | min token cos "
        "| optimize cold / warm (or set-up) | peak RSS |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: "
        "| --- | ---: |",
    ]
    for pipeline, report in results["pipelines"].items():
        for variant, row in report["variants"].items():
            agree = row.get("agreement")
            agreement = (
                f"{agree['tag']:.2%} / {agree['dep']:.2%} / {agree['ent']:.2%}" if agree else "ref"
            )
            opt = row.get("optimize")
            timing = (
                f"{opt['cold_seconds']} s / {opt['warm_seconds']} s"
                if opt
                else f"set-up {row['setup_seconds']} s"
                if row.get("setup_seconds")
                else ""
            )
            if opt and variant in (AUTO, AUTO_FULL):
                timing += f" (served: {', '.join(opt['served'].values())})"
            gold = row["gold"]
            vs = row.get("vs_bf16_autocast", {})
            lines.append(
                f"| {pipeline} | {variant} | {_speed(row, vs, 'full')} "
                f"| {_speed(row, vs, 'transformer+ner')} | {gold['tag_acc']:.3f} "
                f"| {gold['dep_las']:.3f} | {gold['ents_f']:.3f} | {agreement} "
                f"| {row.get('min_token_cosine', 1.0):.4f} | {timing} "
                f"| {_mib(row['peak_rss_mib'])} |"
            )
    for pipeline, report in results["pipelines"].items():
        for variant, row in report["variants"].items():
            optimized = row.get("optimize", {})
            for name, plan in optimized.get("plans", {}).items():
                lines.append(f"\n{pipeline} / {variant}: plan served for {name!r}: {plan}")
                if name in optimized.get("compiled_as", {}):
                    lines.append(f"- compiled here as {optimized['compiled_as'][name]}")
                for reason in optimized.get("plans_refused", {}).get(name, []):
                    lines.append(f"- refused: {reason}")
        for variant, reason in report.get("refused", {}).items():
            lines.append(f"\n{pipeline} / {variant}: refused by the gate: {reason}")
    for pipeline, report in results["pipelines"].items():
        if "overlap_vs_not" in report:
            lines.append(
                f"\n{pipeline}: auto with overlap {report['overlap_vs_not']:.2f}x the same plan "
                f"without; annotations identical: {report['overlap_identical']}"
            )
        for stage, row in report.get("where_time_goes", {}).get("stages", {}).get(AUTO, {}).items():
            lines.append(f"- {stage}: {row['us_per_word']} us per word ({row['share']:.0%})")
    lines.append("\nAgreement per annotation: UD-EWT test (held out) / calibration texts / bound")
    for pipeline, report in results["pipelines"].items():
        for variant, row in report["variants"].items():
            held = row.get("test_agreement")
            if not held or not any(r["calibration"] is not None for r in held.values()):
                continue
            cells = ", ".join(
                f"{name} {r['test']:.2%} / {r['calibration']:.2%} / {r['bound']:.1%}"
                + ("" if r["carried"] else " (NOT carried)")
                for name, r in held.items()
                if r["calibration"] is not None
            )
            lines.append(f"- {pipeline} / {variant}: {cells}")
    if results["skipped"]:
        lines.append("")
        lines.append(
            "Not run here: "
            + "; ".join(
                f"{name} ({reason.splitlines()[0]})" for name, reason in results["skipped"].items()
            )
        )
    return "\n".join(lines) + "\n"


#: The extra OpenVINO int8 variant with a lowered agreement bound (the default gate
#: refuses int8 on pipelines whose heads flip on small changes; see README).
OPENVINO_LOWERED_AGREEMENT = 0.98


def benchmark_variants(
    lowered_agreement: float | None,
    only: list[str] | None = None,
    cache: Path | None = None,
    no_bf16: bool = False,
    skip: list[str] | None = None,
) -> tuple[dict[str, Variant], dict[str, str]]:
    """The variants this machine runs, plus OpenVINO int8 under ``lowered_agreement`` and
    ``auto``'s full search (in a folder of ``cache`` of its own); with ``only``, those
    whose name contains one of its words, less those whose name contains one of ``skip``'s
    (PyTorch fp32 always)."""
    variants, skipped = available_variants()
    if no_bf16:
        skipped[BF16_AUTOCAST] = "bf16 unavailable (simulated CPU without bf16 units)"
        variants.pop(BF16_AUTOCAST, None)
    if isinstance(variants.get(AUTO), Accelerated):
        options = {**variants[AUTO].options, "overlap": False}  # type: ignore[attr-defined]
        variants[AUTO_NO_OVERLAP] = Accelerated(options)
    if cache is not None and isinstance(variants.get(AUTO), Accelerated):
        options = {**variants[AUTO].options, "cache_dir": str(cache / "full-search")}  # type: ignore[attr-defined]
        variants[AUTO_FULL] = FullSearch(options)
    default = variants.get("accelerate openvino int8")
    if lowered_agreement is not None and isinstance(default, Accelerated):
        name = f"accelerate openvino int8 (min_agreement {lowered_agreement:g})"
        variants[name] = Accelerated({**default.options, "min_agreement": lowered_agreement})
    if only:
        variants = {
            name: variant
            for name, variant in variants.items()
            if name == "pytorch fp32" or any(word in name for word in only)
        }
    if skip:
        variants = {
            name: variant
            for name, variant in variants.items()
            if name == "pytorch fp32" or not any(word in name for word in skip)
        }
    return variants, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pipelines", nargs="+", choices=BENCHMARK_PIPELINES, default=list(BENCHMARK_PIPELINES)
    )
    parser.add_argument(
        "--sentences", type=int, help="UD-EWT test sentences (default per pipeline)"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--only", nargs="+", help="run only the variants whose name contains one of these"
    )
    parser.add_argument(
        "--skip", nargs="+", help="leave out the variants whose name contains one of these"
    )
    parser.add_argument(
        "--openvino-min-agreement",
        type=float,
        default=0.0,
        help="also run OpenVINO int8 with this min_agreement (default 0: left out)",
    )
    parser.add_argument(
        "--no-rss", dest="rss", action="store_false", help="skip the peak memory probes"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["full", "transformer+ner"],
        choices=["full", "transformer+ner"],
        help="which pipelines to time",
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="the run's model cache (default: a new empty folder)"
    )
    parser.add_argument(
        "--no-bf16", action="store_true", help="run as on a CPU without bf16 units (simulated)"
    )
    parser.add_argument("--rss-probe", nargs=2, metavar=("PIPELINE", "VARIANT"), help="internal")
    args = parser.parse_args()
    if args.rss_probe:
        rss_probe(*args.rss_probe)
        return

    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="spacy-accelerate-bench-"))
    os.environ["SPACY_ACCELERATE_CACHE"] = str(cache)  # every variant, and the probes
    variants, skipped = benchmark_variants(
        args.openvino_min_agreement or None, args.only, cache, args.no_bf16, args.skip
    )
    info = machine()
    started = datetime.now(timezone.utc)
    results: dict[str, Any] = {
        "machine": info,
        "date": started.isoformat(timespec="seconds"),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "variants": {name: v.describe() for name, v in variants.items()},
        "skipped": skipped,
        "no_bf16": args.no_bf16,
        "versions": package_versions(),
        "pipelines": {},
    }
    with simulated(cpu_features().without_bf16() if args.no_bf16 else cpu_features()):
        for name in args.pipelines:
            results["pipelines"][name] = run_pipeline(name, variants, args)
    results["wall_seconds"] = round((datetime.now(timezone.utc) - started).total_seconds(), 1)

    stem = "-".join(
        [machine_slug(info), f"{started:%Y-%m-%d}", *args.pipelines]
        + (["no-bf16"] if args.no_bf16 else [])
    )
    write_report(results, args.output_dir / f"{stem}.json")
    table = markdown(results)
    (args.output_dir / f"{stem}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
