"""Chart of ``benchmarks/run.py`` results: words per second per variant, speedup annotated.

    python benchmarks/plot.py [RESULT.json ...] [--output CHART.png]

Without an argument, the newest result in ``benchmarks/results`` is drawn. Several results
(one run per pipeline, say) are drawn as one chart, a row per pipeline. The PNG is written
next to the first JSON, with the same name, unless ``--output`` names it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).parent / "results"
MODES = ("full", "transformer+ner")


def newest_result(folder: Path = RESULTS) -> Path:
    candidates = [p for p in folder.glob("*.json") if "pipelines" in json.loads(p.read_text())]
    if not candidates:
        raise SystemExit(f"no benchmarks/run.py result in {folder}")
    return max(candidates, key=lambda p: json.loads(p.read_text())["date"])


def plot(result_paths: list[Path], output: Path | None = None) -> Path:
    runs = [json.loads(path.read_text()) for path in result_paths]
    results = runs[0]
    pipelines = {name: (report, run) for run in runs for name, report in run["pipelines"].items()}
    # Runs from more than one machine: each row names its own.
    several = len({_machine(run) for run in runs}) > 1
    # The modes the runs timed (``--modes full`` times one).
    modes = [
        mode
        for mode in MODES
        if any(mode in v["wps"] for r, _ in pipelines.values() for v in r["variants"].values())
    ]
    figure, axes = plt.subplots(
        len(pipelines), len(modes), figsize=(12, 2.2 + 1.6 * len(pipelines)), squeeze=False
    )
    for row, (pipeline, (report, run)) in enumerate(pipelines.items()):
        names = list(report["variants"])
        for column, mode in enumerate(modes):
            axis = axes[row][column]
            # A variant refused in this mode (the gate judges what runs) has no bar.
            wps = [report["variants"][n]["wps"].get(mode, 0.0) for n in names]
            speedups = [report["variants"][n]["speedup"].get(mode) for n in names]
            colors = ["#888888" if n.startswith("pytorch") else "#2a7ab9" for n in names]
            bars = axis.barh(names, wps, color=colors)
            axis.invert_yaxis()
            for bar, speedup in zip(bars, speedups, strict=True):
                axis.text(
                    bar.get_width(),
                    bar.get_y() + bar.get_height() / 2,
                    f" {speedup:.2f}x" if speedup is not None else " refused",
                    va="center",
                    fontsize=9,
                )
            axis.set_xlim(0, max(wps) * 1.25)
            where = f", {_machine(run)}" if several else ""
            axis.set_title(f"{pipeline}: {mode} ({report['words']:,} words{where})", fontsize=10)
            axis.set_xlabel("words per second")
            axis.tick_params(axis="y", labelsize=9)
    where = "" if several else f"{_machine(results)}, "
    figure.suptitle(
        f"{where}batch {results['batch_size']}, median of {results['repeats']} alternating "
        f"passes ({', '.join(sorted({run['date'][:10] for run in runs}))})",
        fontsize=10,
    )
    figure.tight_layout()
    output = output or result_paths[0].with_suffix(".png")
    figure.savefig(output, dpi=110)
    return output


def _machine(run: dict[str, Any]) -> str:
    machine = run["machine"]
    cpu = machine["cpu"]
    for noise in ("(R)", "(TM)", " Processor", " CPU"):
        cpu = cpu.replace(noise, "")
    suffix = ", bf16 unavailable" if run.get("no_bf16") else ""
    return f"{cpu}, {machine['cpus']} CPUs{suffix}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="*")
    parser.add_argument("--output", type=Path, help="the PNG (default: beside the first JSON)")
    args = parser.parse_args()
    print(plot(args.results or [newest_result()], args.output))


if __name__ == "__main__":
    main()
