"""``spacy-accelerate`` / ``python -m spacy_accelerate``: the operator's command line.

Every failure, a usage error included, is one ``Error: ...`` line on stderr and exit
status 1 (130 on Ctrl-C): operators script these commands (container builds, health
checks), and a traceback or a framed usage box is neither readable there nor actionable.
The library's messages are reworded in the command line's terms (:mod:`.terms`).

Nothing heavy is imported at module level: spaCy and torch load only inside the commands
that need them, so that ``--help`` and ``--version`` answer at once.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from spacy_accelerate._version import __version__
from spacy_accelerate.cli.outputs import check_file, check_pipeline_folder
from spacy_accelerate.cli.terms import cli_terms
from spacy_accelerate.options.config import DEFAULT_OVERLAP

if TYPE_CHECKING:  # spaCy is imported lazily: `--help` and `doctor` stay fast
    from spacy.language import Language

os.environ.setdefault("HF_HUB_OFFLINE", "1")

app = typer.Typer(
    name="spacy-accelerate",
    help="Run spaCy transformer pipelines on ONNX Runtime: same annotations, more documents/s.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
cache_app = typer.Typer(help="Inspect and manage the model cache.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"spacy-accelerate {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Run spaCy transformer pipelines on ONNX Runtime: same annotations, more documents/s."""


CacheDir = Annotated[
    Path | None,
    typer.Option("--cache-dir", help="Model cache (default: $SPACY_ACCELERATE_CACHE or ~/.cache)."),
]
Provider = Annotated[str, typer.Option(help="auto, cpu, cuda, tensorrt or openvino.")]
Precision = Annotated[
    str,
    typer.Option(help="fp32, fp16, bf16, int8, or auto (the fastest plan that passes the gate)."),
]
#: The options ``optimize`` and ``bench`` share, spelled once.
PipelineArg = Annotated[
    str,
    typer.Argument(
        metavar="PIPELINE",
        help="A pipeline folder (nlp.to_disk) or an installed pipeline package "
        "(en_core_web_trf), as spacy.load takes it.",
    ),
]
Code = Annotated[
    Path | None,
    typer.Option(
        "--code",
        "-c",
        help="Python file to import first: custom components or registered functions the "
        "pipeline needs (as `spacy train --code`).",
    ),
]
CalibrationFile = Annotated[
    Path | None,
    typer.Option(help="int8, bf16, fp16, auto: UTF-8 texts like yours, one per line, to judge on."),
]
MinAgreement = Annotated[
    str | None,
    typer.Option(
        help="int8, bf16, fp16, auto: least share of units whose annotations must stay as "
        "PyTorch's: one number (0.99) or per annotation (dep=0.97,tag=0.995)."
    ),
]
Quiet = Annotated[
    bool, typer.Option("--quiet", "-q", help="Say nothing but the result and errors.")
]
Verbose = Annotated[
    bool,
    typer.Option(
        "--verbose", "-V", help="Also the library's debug log and third-party output (NNCF...)."
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of text.")]


class CommandError(Exception):
    """A failure to report as one line."""


def reported_errors() -> tuple[type[Exception], ...]:
    """The failures a user can cause or fix: reported as one line, never as a traceback."""
    from spacy_accelerate.errors import SpacyAccelerateError

    return (CommandError, SpacyAccelerateError, OSError, ValueError)


def one_line(error: BaseException | str) -> str:
    """``error``'s message on one line, in the command line's terms."""
    message = " ".join(str(error).split())
    if not message and isinstance(error, BaseException):
        message = type(error).__name__
    return cli_terms(message)


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn the failures a user can cause or fix into ``Error: ...`` and exit status 1."""
    try:
        yield
    except reported_errors() as error:
        typer.echo(f"Error: {one_line(error)}", err=True)
        raise typer.Exit(code=1) from None
    except KeyboardInterrupt:
        typer.echo("Interrupted.", err=True)
        raise typer.Exit(code=130) from None


def _cache_folder(cache_dir: Path | None) -> Path | None:
    if cache_dir is not None and cache_dir.exists() and not cache_dir.is_dir():
        raise CommandError(f"--cache-dir {cache_dir} is a file; give a folder (it may not exist).")
    return cache_dir


class _StderrHandler(logging.Handler):
    """The library's log lines on whatever ``sys.stderr`` is when they are written (a test
    runner swaps it per command)."""

    def emit(self, record: logging.LogRecord) -> None:
        typer.echo(self.format(record), err=True)


@contextmanager
def speaking(quiet: bool, verbose: bool, normal: int = logging.INFO) -> Iterator[None]:
    """Say as much as ``--quiet`` / ``--verbose`` ask while the command runs: the library's
    verbosity (:func:`spacy_accelerate.progress.set_verbosity`) and its logger's level,
    ``normal`` by default (INFO: ``optimize()``'s summary line), WARNING with ``--quiet``
    and DEBUG with ``--verbose``. Both are put back afterwards."""
    from spacy_accelerate import progress

    if quiet and verbose:
        raise CommandError("Give --quiet or --verbose, not both.")
    level = (
        progress.Verbosity.QUIET
        if quiet
        else progress.Verbosity.VERBOSE
        if verbose
        else progress.Verbosity.NORMAL
    )
    logger = logging.getLogger("spacy_accelerate")
    before, handler = (progress.verbosity(), logger.level), _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    progress.set_verbosity(level)
    logger.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else normal)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before[1])
        progress.set_verbosity(before[0])


def _import_code(code: Path | None) -> None:
    """Import ``--code`` before the pipeline loads, as ``spacy train --code`` does: the
    custom components and registered functions its config names must be known by then."""
    if code is None:
        return
    if not code.is_file():
        raise CommandError(
            f"No Python file at {code} (--code): give the file that registers the pipeline's "
            "custom components or functions."
        )
    from spacy.util import import_file

    try:
        import_file("python_code", code)
    except Exception as error:  # the user's own code: any failure is theirs to read
        raise CommandError(
            f"--code {code} failed to import: {type(error).__name__}: {error}"
        ) from None


def _load_pipeline(name: str, code: Path | None = None) -> Language:
    """The pipeline ``name`` names, as ``spacy.load`` finds it: an installed pipeline
    package (en_core_web_trf) or a folder that ``nlp.to_disk()`` wrote."""
    import spacy
    from spacy.util import is_package

    _import_code(code)
    if is_package(name):
        try:
            return spacy.load(name)
        except (AttributeError, ImportError) as error:
            raise CommandError(
                f"{name} is an installed package but not a loadable spaCy pipeline: {error}"
            ) from None
    path = Path(name)
    if not path.exists():
        raise CommandError(
            f"No pipeline at {name}: tried a folder of that name (the one nlp.to_disk() "
            "wrote, with config.cfg) and an installed pipeline package (python -m spacy "
            "download, pip install); neither exists."
        )
    if path.is_dir() and not (path / "config.cfg").is_file():
        raise CommandError(f"{path} is not a spaCy pipeline folder: it has no config.cfg.")
    if path.is_file():
        raise CommandError(f"{path} is a file; give the pipeline's folder (with config.cfg).")
    return spacy.load(path)


@app.command()
def doctor(cache_dir: CacheDir = None, as_json: Json = False) -> None:
    """Versions, providers (and what to install for a missing one), GPU, cache."""
    from spacy_accelerate.cli.doctor import diagnose

    with one_line_errors():
        found = diagnose(_cache_folder(cache_dir))
    if as_json:
        typer.echo(json.dumps(found.as_dict(), indent=2))
        return
    typer.echo("versions:")
    for name, version in found.versions.items():
        typer.echo(f"  {name:28s} {version or 'not installed'}")
    typer.echo("providers:")
    for status in found.providers:
        mark = "yes" if status.available else "no "
        typer.echo(f"  {status.provider.value:9s} {mark}  {status.detail}")
    runtimes = ", ".join(found.onnxruntime_providers) or "onnxruntime not installed"
    typer.echo(f"  (ONNX Runtime execution providers: {runtimes})")
    typer.echo(f"cpu: {found.cpu}")
    typer.echo(f"gpu: {found.gpu}")
    typer.echo(
        f"cache: {found.cache_dir} ({found.cache_entries} models, "
        f"{found.cache_bytes / 2**20:.1f} MiB)"
    )


def _bounds(given: str | None) -> float | dict[str, float] | None:
    """``--min-agreement`` as ``optimize()`` takes it: ``0.99`` or ``dep=0.97,tag=0.995``."""
    if given is None:
        return None
    try:
        if "=" not in given:
            return float(given)
        pairs = (part.split("=", 1) for part in given.split(",") if part.strip())
        return {name.strip(): float(value) for name, value in pairs}
    except ValueError:
        raise CommandError(
            f"--min-agreement {given!r} is neither a number (0.99) nor annotation=number pairs "
            "separated by commas (dep=0.97,tag=0.995)."
        ) from None


def _read_lines(texts_file: Path) -> list[str]:
    """The non-empty lines of a UTF-8 texts file, one document each."""
    if not texts_file.is_file():
        raise CommandError(f"No texts file at {texts_file}: give a UTF-8 file, one text a line.")
    texts = [line.strip() for line in texts_file.read_text(encoding="utf8").splitlines()]
    texts = [text for text in texts if text]
    if not texts:
        raise CommandError(f"{texts_file} has no text: write one document per line.")
    return texts


@app.command()
def optimize(
    pipeline: PipelineArg,
    provider: Provider = "auto",
    precision: Precision = "fp32",
    cache_dir: CacheDir = None,
    output: Annotated[
        Path | None,
        typer.Option(help="Also save the optimized pipeline here (it loads accelerated)."),
    ] = None,
    warmup: Annotated[bool, typer.Option(help="Run the batch shapes once before serving.")] = True,
    verify: Annotated[
        bool, typer.Option(help="Check a cached model against PyTorch again when it loads.")
    ] = True,
    tolerance: Annotated[
        float | None, typer.Option(help="fp32: largest absolute difference to PyTorch.")
    ] = None,
    min_cosine: Annotated[
        float | None, typer.Option(help="fp16, bf16, int8: least token cosine to PyTorch.")
    ] = None,
    threads: Annotated[
        int | None, typer.Option(min=1, help="CPU threads (default: this process's CPUs).")
    ] = None,
    device_id: Annotated[
        int | None, typer.Option(min=0, help="CUDA device (cuda, tensorrt).")
    ] = None,
    fallback: Annotated[
        bool, typer.Option(help="Fall back TensorRT -> CUDA -> CPU instead of failing.")
    ] = False,
    calibration_file: CalibrationFile = None,
    min_agreement: MinAgreement = None,
    lock_timeout: Annotated[
        float | None,
        typer.Option(min=0, help="Seconds to wait for another process building the model."),
    ] = None,
    missing_cache: Annotated[
        str,
        typer.Option(
            help="What --output's pipeline does where its model is not cached: rebuild or pytorch."
        ),
    ] = "rebuild",
    bundle: Annotated[
        bool,
        typer.Option(
            help="Save the verified models with --output's pipeline (--no-bundle: only the "
            "options, and each machine builds from the weights or its cache)."
        ),
    ] = True,
    overlap: Annotated[
        bool,
        typer.Option(
            help="--output's pipeline runs the transformer while spaCy's components annotate "
            "the batch before (--no-overlap: one after the other)."
        ),
    ] = DEFAULT_OVERLAP,
    code: Code = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Build the pipeline's cache entries ahead of time (e.g. in a container image)."""
    from spacy_accelerate import api as accelerate

    with one_line_errors(), speaking(quiet, verbose):
        if output is not None:
            check_pipeline_folder(output, "--output")
        nlp = _load_pipeline(pipeline, code)
        accelerate.optimize(
            nlp,
            provider,
            precision,
            cache_dir=_cache_folder(cache_dir),
            warmup=warmup,
            verify=verify,
            tolerance=tolerance,
            min_cosine=min_cosine,
            threads=threads,
            device_id=device_id,
            fallback=fallback,
            calibration_texts=_read_lines(calibration_file) if calibration_file else None,
            min_agreement=_bounds(min_agreement),
            lock_timeout=lock_timeout,
            missing_cache=missing_cache,
            bundle=bundle,
            overlap=overlap,
        )
        for name, proxy in accelerate.accelerated_components(nlp).items():
            _echo_served(name, proxy.exported)
        if output is not None:
            nlp.to_disk(output)
            typer.echo(f"saved the optimized pipeline to {output}")


def _echo_served(name: str, exported: Any) -> None:
    """What serves component ``name`` (``optimize()``'s INFO line too), and its checks."""
    parity = exported.parity
    typer.echo(f"{name}: served by {exported.summary}")
    checked = (
        f"max abs diff {parity.worst:.2e}, min token cosine {parity.worst_cosine:.5f}"
        + (f", mean {parity.worst_mean_cosine:.5f}" if parity.mean_cosine else "")
        if parity
        else "not re-checked"
    )
    typer.echo(f"  against PyTorch: {checked}")
    if exported.record.compiled_as:
        typer.echo(f"  compiled as {exported.record.compiled_as}")
    if exported.record.agreement is not None:
        typer.echo(f"  agreement on the calibration texts: {exported.record.agreement.describe()}")
    typer.echo(f"  {exported.path}")


@app.command()
def bench(
    pipeline: PipelineArg,
    texts_file: Annotated[
        Path | None,
        typer.Argument(help="UTF-8 text, one document per line (or give --gold instead)."),
    ] = None,
    provider: Provider = "cpu",
    precision: Annotated[
        list[str], typer.Option(help="Precision(s) to compare with PyTorch; repeat the option.")
    ] = ["fp32"],  # noqa: B006 - typer reads the default, never mutates it
    batch_size: Annotated[int, typer.Option(min=1, help="Texts per nlp.pipe batch.")] = 64,
    repeats: Annotated[
        int,
        typer.Option(
            min=1, help="Timed passes of each variant, alternating, after one warm-up pass."
        ),
    ] = 3,
    output: Annotated[Path | None, typer.Option(help="Write the JSON report here.")] = None,
    gold: Annotated[
        Path | None,
        typer.Option(
            help="Gold annotations (.conllu or .spacy): bench their texts and score every "
            "variant against them. Replaces TEXTS_FILE."
        ),
    ] = None,
    calibration_file: CalibrationFile = None,
    min_agreement: MinAgreement = None,
    code: Code = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Your pipeline on your texts: PyTorch vs accelerated, side by side, with agreement
    (and accuracy against gold with --gold). A precision that is refused here is reported
    as refused and the others still run; the exit status is 1 only when none ran."""
    from spacy_accelerate.bench import where_time_goes
    from spacy_accelerate.bench.baselines import Accelerated
    from spacy_accelerate.bench.gold import gold_texts, read_gold, score
    from spacy_accelerate.bench.side_by_side import side_by_side, write_report
    from spacy_accelerate.options import config as options
    from spacy_accelerate.options.request import build_config
    from spacy_accelerate.verify.agreement import compare

    # The summary of every optimize() call would repeat on each timed pass: the table
    # below is this command's report, so the library's INFO lines need --verbose.
    with one_line_errors(), speaking(quiet, verbose, normal=logging.WARNING):
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
        texts = _read_lines(texts_file) if texts_file is not None else []
        judged: dict[str, Any] = {}  # what only the lossy precisions (and auto) read
        if min_agreement is not None:
            judged["min_agreement"] = _bounds(min_agreement)
        if calibration_file is not None:
            judged["calibration_texts"] = _read_lines(calibration_file)
        asked = {p: options.parse_precision(p) for p in dict.fromkeys(precision)}
        reading = {
            p for p, parsed in asked.items() if parsed in options.LOSSY | {options.Precision.AUTO}
        }
        variants = {
            p: {
                "provider": provider,
                "precision": p,
                **(judged if p in reading or not reading else {}),
            }
            for p in asked
        }
        for given in variants.values():  # a mistake fails now, not after PyTorch's passes
            build_config(**given)
        nlp = _load_pipeline(pipeline, code)
        gold_docs = read_gold(gold, nlp.vocab) if gold is not None else []
        if gold_docs:
            texts = gold_texts(gold_docs)
        result = side_by_side(
            nlp,
            texts,
            variants,
            batch_size=batch_size,
            repeats=repeats,
            refusals=reported_errors(),
        )
        ran = next(iter(result.variants), None)
        stages = (
            where_time_goes.measure(nlp, texts, ran, Accelerated(variants[ran]), batch_size)
            if ran is not None
            else None
        )
        scores: dict[str, dict[str, float | None]] = {}
        if gold_docs:
            scores["pytorch"] = score(result.reference, gold_docs)
            for name, variant in result.variants.items():
                scores[name] = score(variant.docs, gold_docs)

    def against_gold(name: str) -> str:
        if name not in scores:
            return ""
        found = ", ".join(
            f"{key} {'n/a' if value is None else f'{value:.2%}'}"
            for key, value in scores[name].items()
        )
        return f"  gold: {found or 'no annotation to score'}"

    def spread(low: float, high: float, form: str) -> str:
        return f"({low:{form}}-{high:{form}})" if repeats > 1 else ""

    typer.echo(
        f"{len(texts)} texts, {result.words:,} words, batch {batch_size}, {repeats} passes "
        "(median, and the range over the passes)"
    )
    typer.echo(
        f"  {'PyTorch fp32':22s} {result.pytorch_wps:9,.0f} words/s "
        f"{spread(*result.pytorch_wps_range(), ',.0f'):15s}{against_gold('pytorch')}".rstrip()
    )
    refused = {name: one_line(reason) for name, reason in result.failed.items()}
    for name in variants:
        if name in refused:
            typer.echo(f"  {provider + ' ' + name:22s} refused: {refused[name]}")
            continue
        rates = compare(result.reference, result.variants[name].docs).describe()  # as the gate
        typer.echo(
            f"  {_served_label(result.variants[name].served, provider, name):22s} "
            f"{result.wps(name):9,.0f} words/s {spread(*result.wps_range(name), ',.0f'):15s}"
            f"{result.speedup(name):5.2f}x {spread(*result.speedup_range(name), '.2f')}  "
            f"agreement: {rates}{against_gold(name)}"
        )
    for line in stages.lines() if stages is not None else []:
        typer.echo(line)
    if output is not None:
        report = result.as_dict()
        report["failed"] = refused
        if stages is not None:
            report["where_time_goes"] = stages.as_dict()
        for described in report["variants"].values():
            texts_given = described["options"].pop("calibration_texts", None)
            if texts_given is not None:  # the file, not its texts, belongs in the report
                described["options"]["calibration_file"] = str(calibration_file)
        if scores:
            report["gold"] = {"file": str(gold), "documents": len(gold_docs)}
            report["pytorch"]["gold"] = scores["pytorch"]
            for name in result.variants:
                report["variants"][name]["gold"] = scores[name]
        with one_line_errors():
            write_report(report, output, echo=False)
        typer.echo(f"wrote the report to {output}")
    if not result.variants:
        typer.echo("Error: every precision was refused here (see above).", err=True)
        raise typer.Exit(code=1)


def _served_label(served: dict[str, tuple[str, str]], provider: str, precision: str) -> str:
    """A row's name: the provider that served it (not ``auto``), the precision asked for,
    and the one served where they differ (``cpu auto (int8)``)."""
    providers = sorted({ran for ran, _ in served.values()}) or [provider]
    precisions = sorted({chosen for _, chosen in served.values()})
    label = f"{'/'.join(providers)} {precision}"
    return label if precisions in ([], [precision]) else f"{label} ({'/'.join(precisions)})"


@cache_app.command("list")
def cache_list(cache_dir: CacheDir = None, as_json: Json = False) -> None:
    """The cached models, a row each: key, family, provider, precision, size, creation and
    last use; under it the pipeline it was built from, the plan served and, for a lossy
    plan, its agreement per annotation on the calibration texts."""
    from spacy_accelerate.provision.listing import list_cached

    with one_line_errors():
        entries = list_cached(_cache_folder(cache_dir))
    if as_json:
        typer.echo(json.dumps([entry.as_dict() for entry in entries], indent=2))
        return
    if not entries:
        typer.echo("no cached models")
        return
    typer.echo(
        f"{'KEY':16s}  {'FAMILY':12s} {'PROVIDER':9s} {'PREC':5s} {'SIZE':>12s}  "
        f"{'CREATED':25s}  LAST USED"
    )
    for entry in entries:
        typer.echo(
            f"{entry.key[:16]}  {entry.family or '?':12s} {entry.provider or '?':9s} "
            f"{entry.precision or '?':5s} {entry.size_bytes / 2**20:8.1f} MiB  "
            f"{entry.created:25s}  {entry.last_used or '?'}"
        )
        source = " ".join(part for part in (entry.source, entry.component) if part)
        typer.echo(f"  from: {source or 'not recorded (built by an earlier release)'}")
        if entry.note:
            typer.echo(f"  {entry.note}")
        if entry.plan:
            typer.echo(f"  plan: {entry.plan}")
        if entry.agreement:
            rates = ", ".join(f"{name} {rate:.2%}" for name, rate in entry.agreement.items())
            typer.echo(f"  agreement with PyTorch fp32 on the calibration texts: {rates}")


@cache_app.command("size")
def cache_size_command(cache_dir: CacheDir = None) -> None:
    """Disk used by the cache."""
    from spacy_accelerate.cache.root import default_cache_dir
    from spacy_accelerate.provision.listing import cache_size

    with one_line_errors():
        size = cache_size(_cache_folder(cache_dir))
    typer.echo(f"{size / 2**20:.1f} MiB in {cache_dir or default_cache_dir()}")


@cache_app.command("clear")
def cache_clear(
    cache_dir: CacheDir = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Remove every cached model (they are rebuilt on the next optimize())."""
    from spacy_accelerate.cache.root import default_cache_dir
    from spacy_accelerate.provision.listing import clear_cache

    with one_line_errors():
        folder = _cache_folder(cache_dir) or default_cache_dir()
        if not yes and not typer.confirm(f"Remove every cached model in {folder}?"):
            raise typer.Exit(code=1)
        removed = clear_cache(folder)
    typer.echo(f"removed {removed} cached models from {folder}")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``) and exit.

    Click's own usage errors (an unknown option, a bad value, a missing argument) would
    exit 2 inside a framed box; here they are one ``Error: ...`` line on stderr and exit
    status 1, like every other failure. ``--help`` and ``--version`` exit 0, Ctrl-C 130.
    """
    from typer.main import get_command

    errors = _click_exceptions()
    try:
        status = get_command(app).main(args=argv, standalone_mode=False)
    except errors.NoArgsIsHelpError as shown:  # a bare command group: its help is the answer
        typer.echo(shown.format_message())
        status = 0
    except errors.UsageError as error:  # unknown option, bad value, missing argument
        hint = f" (see '{error.ctx.command_path} --help')" if error.ctx is not None else ""
        typer.echo(f"Error: {one_line(error.format_message())}{hint}", err=True)
        status = 1
    except errors.ClickException as error:  # click's other refusals (a file it cannot open)
        typer.echo(f"Error: {one_line(error.format_message())}", err=True)
        status = 1
    except typer.Abort:  # Ctrl-D at a prompt
        typer.echo("Error: aborted.", err=True)
        status = 1
    sys.exit(status if isinstance(status, int) else 0)


def _click_exceptions() -> ModuleType:
    """Click's exceptions, as the installed typer raises them: typer vendors click since
    0.2x; before, it ran on the ``click`` package."""
    from importlib import import_module

    try:
        return import_module("typer._click.exceptions")
    except ImportError:  # pragma: no cover - an older typer
        return import_module("click.exceptions")
