"""What the commands share: the app, the options several commands take (each spelled once
here), one-line errors, how much the library says, and the inputs they read (the
pipeline, files of texts, ``--min-agreement``).

Every failure, a usage error included, is one ``Error: ...`` line on stderr and exit
status 1 (130 on Ctrl-C): operators script these commands (container builds, health
checks), and a traceback or a framed usage box is neither readable there nor actionable.
The library's messages are reworded in the command line's terms by :func:`one_line`.

Nothing heavy is imported at module level, here or in a command's module: spaCy, torch
and the library's heavy modules load only inside the commands that need them, so that
``--help`` and ``--version`` answer at once.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from spacy_accelerate._version import __version__
from spacy_accelerate.cli.terms import cli_message
from spacy_accelerate.options.precision import JUDGED, Precision
from spacy_accelerate.options.providers import PROVIDERS

if TYPE_CHECKING:
    from spacy.language import Language

#: What the command line is for: the first line of ``spacy-accelerate --help``.
ABOUT = (
    "Serve the transformer of a spaCy pipeline on ONNX Runtime or OpenVINO: same "
    "annotations, more documents/s."
)

app = typer.Typer(
    name="spacy-accelerate",
    help=ABOUT,
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
    """The options given before any command (the app's help is :data:`ABOUT`)."""


CacheDir = Annotated[
    Path | None,
    typer.Option("--cache-dir", help="Model cache (default: $SPACY_ACCELERATE_CACHE or ~/.cache)."),
]
#: The precisions, and those judged on calibration texts (the lossy ones, and auto).
_PRECISIONS = ", ".join(precision.value for precision in Precision)
_JUDGED = ", ".join(precision.value for precision in Precision if precision in JUDGED)
ProviderOption = Annotated[str, typer.Option("--provider", help=f"{PROVIDERS.choices()}.")]
PrecisionOption = Annotated[
    str,
    typer.Option(
        "--precision", help=f"{_PRECISIONS} (auto: the fastest plan that passes the gate)."
    ),
]
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
    typer.Option(help=f"{_JUDGED}: UTF-8 texts like yours, one per line, to judge on."),
]
MinAgreement = Annotated[
    str | None,
    typer.Option(
        help=f"{_JUDGED}: least share of units whose annotations must stay as "
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
    """``error``'s message on one line, its advice spelled as flags (:mod:`.terms`)."""
    message = " ".join(cli_message(error).split())
    if not message and isinstance(error, BaseException):
        message = type(error).__name__
    return message


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


def cache_folder(cache_dir: Path | None) -> Path | None:
    """``--cache-dir`` as given, refused where it names a file."""
    if cache_dir is not None and cache_dir.exists() and not cache_dir.is_dir():
        raise CommandError(f"--cache-dir {cache_dir} is a file; give a folder (it may not exist).")
    return cache_dir


def read_lines(texts_file: Path) -> list[str]:
    """The non-empty lines of a UTF-8 texts file, one document each."""
    if not texts_file.is_file():
        raise CommandError(f"No texts file at {texts_file}: give a UTF-8 file, one text a line.")
    texts = [line.strip() for line in texts_file.read_text(encoding="utf8").splitlines()]
    texts = [text for text in texts if text]
    if not texts:
        raise CommandError(f"{texts_file} has no text: write one document per line.")
    return texts


def agreement_bounds(given: str | None) -> float | dict[str, float] | None:
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


def hub_offline() -> None:
    """Keep the Hugging Face Hub out of loading a pipeline: a saved pipeline holds its
    transformer's weights and tokenizer, and the machines these commands serve on (a
    container build, a cluster node) often have no network, where a lookup would wait
    and fail instead of loading. A user's own ``HF_HUB_OFFLINE`` is kept.

    Called before spaCy, transformers or the library's modules load (``huggingface_hub``
    reads the variable once, when imported), and before Ray starts (its local workers,
    which load the pipeline, inherit this process's environment)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def check_code(code: Path | None) -> None:
    """``--code`` names a file (imported before the pipeline loads)."""
    if code is not None and not code.is_file():
        raise CommandError(
            f"No Python file at {code} (--code): give the file that registers the pipeline's "
            "custom components or functions."
        )


def _import_code(code: Path | None) -> None:
    """Import ``--code`` before the pipeline loads, as ``spacy train --code`` does: the
    custom components and registered functions its config names must be known by then."""
    check_code(code)
    if code is None:
        return
    from spacy.util import import_file

    try:
        import_file("python_code", code)
    except Exception as error:  # the user's own code: any failure is theirs to read
        raise CommandError(
            f"--code {code} failed to import: {type(error).__name__}: {error}"
        ) from None


def load_pipeline(name: str, code: Path | None = None) -> Language:
    """The pipeline ``name`` names, as ``spacy.load`` finds it: an installed pipeline
    package (en_core_web_trf) or a folder that ``nlp.to_disk()`` wrote. It loads without
    the Hugging Face Hub (:func:`hub_offline`), so a command calls this before it imports
    anything heavy."""
    hub_offline()
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
