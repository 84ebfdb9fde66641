"""``spacy-accelerate bench``: the user's pipeline on the user's texts, PyTorch fp32 and
each precision asked side by side, printed as a table (and written as JSON with
``--output``). What runs and what is reported is :mod:`spacy_accelerate.bench`'s
(:mod:`~spacy_accelerate.bench.variants`, :mod:`~spacy_accelerate.bench.comparison`);
this module reads the flags and prints."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from spacy_accelerate.bench.variants import precision_variants
from spacy_accelerate.cli._util import (
    CalibrationFile,
    Code,
    CommandError,
    MinAgreement,
    PipelineArg,
    ProviderOption,
    Quiet,
    Verbose,
    agreement_bounds,
    app,
    load_pipeline,
    one_line,
    one_line_errors,
    read_lines,
    reported_errors,
    speaking,
)
from spacy_accelerate.cli.outputs import check_file

if TYPE_CHECKING:
    from spacy_accelerate.bench.comparison import Comparison

# The options only this command takes.
TextsFile = Annotated[
    Path | None,
    typer.Argument(help="UTF-8 text, one document per line (or give --gold instead)."),
]
Precisions = Annotated[
    list[str], typer.Option(help="Precision(s) to compare with PyTorch; repeat the option.")
]
BatchSize = Annotated[int, typer.Option(min=1, help="Texts per nlp.pipe batch.")]
Repeats = Annotated[
    int,
    typer.Option(min=1, help="Timed passes of each variant, alternating, after one warm-up pass."),
]
Output = Annotated[Path | None, typer.Option(help="Write the JSON report here.")]
Gold = Annotated[
    Path | None,
    typer.Option(
        help="Gold annotations (.conllu or .spacy): bench their texts and score every "
        "variant against them. Replaces TEXTS_FILE."
    ),
]


@app.command()
def bench(
    pipeline: PipelineArg,
    texts_file: TextsFile = None,
    provider: ProviderOption = "cpu",
    precision: Precisions = ["fp32"],  # noqa: B006 - typer reads the default, never mutates it
    batch_size: BatchSize = 64,
    repeats: Repeats = 3,
    output: Output = None,
    gold: Gold = None,
    calibration_file: CalibrationFile = None,
    min_agreement: MinAgreement = None,
    code: Code = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Your pipeline on your texts: PyTorch vs accelerated, side by side, with agreement
    (and accuracy against gold with --gold). A precision that is refused here is reported
    as refused and the others still run; the exit status is 1 only when none ran."""
    # The summary of every optimize() call would repeat on each timed pass: the table
    # printed is this command's report, so the library's INFO lines need --verbose.
    with one_line_errors(), speaking(quiet, verbose, normal=logging.WARNING):
        _check_inputs(texts_file, gold, output)
        texts = read_lines(texts_file) if texts_file is not None else []
        judging = _judging(min_agreement, calibration_file)
        variants = precision_variants(provider, precision, judging)
        nlp = load_pipeline(pipeline, code)  # first, before anything heavy (hub_offline)
        from spacy_accelerate.bench.comparison import compare_precisions
        from spacy_accelerate.bench.gold import gold_texts, read_gold
        from spacy_accelerate.bench.side_by_side import write_report

        gold_docs = read_gold(gold, nlp.vocab) if gold is not None else []
        compared = compare_precisions(
            nlp,
            gold_texts(gold_docs) if gold_docs else texts,
            variants,
            gold=gold_docs,
            batch_size=batch_size,
            repeats=repeats,
            refusals=reported_errors(),
        )
    failed = {name: one_line(reason) for name, reason in compared.result.failed.items()}
    _Table(compared, provider, repeats).echo(list(variants), failed, batch_size)
    if output is not None:
        with one_line_errors():
            write_report(compared.report(failed, calibration_file, gold), output, echo=False)
        typer.echo(f"wrote the report to {output}")
    if not compared.result.variants:
        typer.echo("Error: every precision was refused here (see above).", err=True)
        raise typer.Exit(code=1)


def _judging(min_agreement: str | None, calibration_file: Path | None) -> dict[str, Any]:
    """``min_agreement`` and ``calibration_texts`` as ``optimize()`` takes them, from
    ``--min-agreement`` and ``--calibration-file``."""
    judging: dict[str, Any] = {}
    if min_agreement is not None:
        judging["min_agreement"] = agreement_bounds(min_agreement)
    if calibration_file is not None:
        judging["calibration_texts"] = read_lines(calibration_file)
    return judging


def _check_inputs(texts_file: Path | None, gold: Path | None, output: Path | None) -> None:
    """One source of texts, and a report file that can be written, before any work."""
    if texts_file is not None and gold is not None:
        raise CommandError(
            "Give TEXTS_FILE or --gold, not both: with --gold, the gold documents' texts "
            "are benchmarked."
        )
    if texts_file is None and gold is None:
        raise CommandError(
            "Give TEXTS_FILE (UTF-8, one text a line) or --gold FILE (.conllu or .spacy)."
        )
    if output is not None:
        check_file(output, "--output")


class _Table:
    """The printed report: a row for PyTorch and one per precision asked (its speed, its
    speedup, its agreement with PyTorch, its scores against gold), then where the time
    goes."""

    def __init__(self, compared: Comparison, provider: str, repeats: int) -> None:
        self.compared = compared
        self.result = compared.result
        self.provider = provider
        self.repeats = repeats

    def echo(self, names: list[str], failed: dict[str, str], batch_size: int) -> None:
        result = self.result
        typer.echo(
            f"{len(result.reference)} texts, {result.words:,} words, batch {batch_size}, "
            f"{self.repeats} passes (median, and the range over the passes)"
        )
        typer.echo(
            f"  {'PyTorch fp32':22s} {result.pytorch_wps:9,.0f} words/s "
            f"{self._spread(*result.pytorch_wps_range(), ',.0f'):15s}"
            f"{self._gold(self.compared.pytorch_scores)}".rstrip()
        )
        for name in names:
            if name in failed:
                typer.echo(f"  {self.provider + ' ' + name:22s} refused: {failed[name]}")
            else:
                typer.echo(self._row(name))
        stages = self.compared.stages
        for line in stages.lines() if stages is not None else []:
            typer.echo(line)

    def _row(self, name: str) -> str:
        result = self.result
        label = _served_label(result.variants[name].served, self.provider, name)
        return (
            f"  {label:22s} {result.wps(name):9,.0f} words/s "
            f"{self._spread(*result.wps_range(name), ',.0f'):15s}"
            f"{result.speedup(name):5.2f}x {self._spread(*result.speedup_range(name), '.2f')}  "
            f"agreement: {self.compared.agreements[name].describe()}"
            f"{self._gold(self.compared.scores.get(name))}"
        )

    def _spread(self, low: float, high: float, form: str) -> str:
        return f"({low:{form}}-{high:{form}})" if self.repeats > 1 else ""

    @staticmethod
    def _gold(scores: dict[str, float | None] | None) -> str:
        if scores is None:
            return ""
        found = ", ".join(
            f"{key} {'n/a' if value is None else f'{value:.2%}'}" for key, value in scores.items()
        )
        return f"  gold: {found or 'no annotation to score'}"


def _served_label(served: dict[str, tuple[str, str]], provider: str, precision: str) -> str:
    """A row's name: the provider that served it (not ``auto``), the precision asked for,
    and the one served where they differ (``cpu auto (int8)``)."""
    providers = sorted({ran for ran, _ in served.values()}) or [provider]
    precisions = sorted({chosen for _, chosen in served.values()})
    label = f"{'/'.join(providers)} {precision}"
    return label if precisions in ([], [precision]) else f"{label} ({'/'.join(precisions)})"
