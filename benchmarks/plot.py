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
    pipelines = {name: report for run in runs for name, report in run["pipelines"].items()}
    figure, axes = plt.subplots(
        len(pipelines), len(MODES), figsize=(12, 2.2 + 1.6 * len(pipelines)), squeeze=False
    )
    for row, (pipeline, report) in enumerate(pipelines.items()):
        names = list(report["variants"])
        for column, mode in enumerate(MODES):
            axis = axes[row][column]
            wps = [report["variants"][n]["wps"][mode] for n in names]
            speedups = [report["variants"][n]["speedup"][mode] for n in names]
            colors = ["#888888" if n.startswith("pytorch") else "#2a7ab9" for n in names]
            bars = axis.barh(names, wps, color=colors)
            axis.invert_yaxis()
            for bar, speedup in zip(bars, speedups, strict=True):
                axis.text(
                    bar.get_width(),
                    bar.get_y() + bar.get_height() / 2,
                    f" {speedup:.2f}x",
                    va="center",
                    fontsize=9,
                )
            axis.set_xlim(0, max(wps) * 1.25)
            axis.set_title(f"{pipeline}: {mode} ({report['words']:,} words)", fontsize=10)
            axis.set_xlabel("words per second")
            axis.tick_params(axis="y", labelsize=9)
    machine = results["machine"]
    figure.suptitle(
        f"{machine['cpu']}, {machine['cpus']} CPUs, batch {results['batch_size']}, "
        f"median of {results['repeats']} alternating passes ({results['date'][:10]})",
        fontsize=10,
    )
    figure.tight_layout()
    output = output or result_paths[0].with_suffix(".png")
    figure.savefig(output, dpi=110)
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="*")
    parser.add_argument("--output", type=Path, help="the PNG (default: beside the first JSON)")
    args = parser.parse_args()
    print(plot(args.results or [newest_result()], args.output))


if __name__ == "__main__":
    main()
