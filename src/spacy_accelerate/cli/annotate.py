"""``spacy-accelerate annotate``: a corpus annotated on Ray Data, into one file.

The command reads INPUT (JSONL, Parquet or plain text), hands it to
:func:`spacy_accelerate.ray.annotate` (an actor pool, each actor loading and optimizing the
pipeline once) and streams the annotated rows back to the driver, in order of arrival, into
one OUTPUT file (Parquet or JSONL). Everything a user can get wrong (the suffixes, an
existing OUTPUT, the fields, the pipeline's name, ``--code``) is checked before Ray starts.

Ray, like spaCy and torch, is imported inside the command only: ``--help`` stays fast.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from spacy_accelerate.cli._util import (
    CacheDir,
    Code,
    CommandError,
    PipelineArg,
    PrecisionOption,
    ProviderOption,
    Quiet,
    Verbose,
    app,
    cache_folder,
    check_code,
    hub_offline,
    one_line_errors,
    speaking,
)
from spacy_accelerate.cli.batch_writer import BatchWriter
from spacy_accelerate.cli.outputs import check_file

if TYPE_CHECKING:
    from ray.data import Dataset

#: OUTPUT suffixes and what each writes.
OUTPUT_SUFFIXES = {".parquet": "one Parquet file", ".jsonl": "one JSON object a line"}
#: INPUT suffixes read as JSON (one object a line); a folder or ``.parquet`` is Parquet,
#: anything else plain text, one document a line.
JSON_SUFFIXES = (".jsonl", ".json")
#: What ``spacy_accelerate.ray.FIELDS`` holds; repeated here so that a bad ``--fields`` is
#: refused before Ray (or the library's Ray module) is imported.
KNOWN_FIELDS = ("tags", "pos", "lemmas", "heads", "deps", "entities", "sents", "docbin")
INSTALL_RAY = "pip install 'spacy-accelerate[ray]'"

log = logging.getLogger("spacy_accelerate")


def _fields(given: str) -> list[str]:
    fields = [name.strip() for name in given.split(",") if name.strip()]
    if not fields:
        raise CommandError(f"--fields is empty: give some of {','.join(KNOWN_FIELDS)}.")
    unknown = [name for name in fields if name not in KNOWN_FIELDS]
    if unknown:
        raise CommandError(
            f"--fields: unknown field(s) {', '.join(unknown)}; the fields are "
            f"{', '.join(KNOWN_FIELDS)}."
        )
    return list(dict.fromkeys(fields))


def _input_kind(path: Path, text_column: str) -> str:
    """``json``, ``parquet`` or ``text``: how INPUT is read (a text file has one column,
    ``text``)."""
    if not path.exists():
        raise CommandError(
            f"No input at {path}: give a JSONL file, a Parquet file or folder, or a text file "
            "(one document a line)."
        )
    if path.is_dir() or path.suffix.lower() == ".parquet":
        return "parquet"
    if path.suffix.lower() in JSON_SUFFIXES:
        return "json"
    if text_column != "text":
        raise CommandError(
            f"--text-column {text_column}: a plain text INPUT has one column, 'text'."
        )
    return "text"


def _check_output(output: Path, overwrite: bool) -> None:
    if output.suffix.lower() not in OUTPUT_SUFFIXES:
        supported = ", ".join(f"{suffix} ({what})" for suffix, what in OUTPUT_SUFFIXES.items())
        raise CommandError(
            f"OUTPUT {output} has an unsupported suffix {output.suffix or '(none)'!r}: "
            f"give {supported}."
        )
    if output.is_dir():
        raise CommandError(f"OUTPUT {output} is a folder; give a file name ending in .parquet.")
    if output.exists() and not overwrite:
        raise CommandError(f"OUTPUT {output} exists: give another name, or --overwrite.")
    check_file(output, "OUTPUT")


def _pipeline_name(pipeline: str) -> str:
    """What the actors load: a folder as an absolute path (their working folder is not
    ours), or the name of an installed package, found without importing spaCy."""
    path = Path(pipeline)
    if path.exists():
        if not path.is_dir() or not (path / "config.cfg").is_file():
            raise CommandError(f"{path} is not a spaCy pipeline folder: it has no config.cfg.")
        return str(path.resolve())
    with suppress(ImportError, ValueError):
        if pipeline.isidentifier() and importlib.util.find_spec(pipeline) is not None:
            return pipeline
    raise CommandError(
        f"No pipeline at {pipeline}: tried a folder of that name (the one nlp.to_disk() "
        "wrote, with config.cfg) and an installed pipeline package (python -m spacy "
        "download, pip install); neither exists."
    )


def _import_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401 - the [data] part of the extra
    except ImportError:
        raise CommandError(
            f"annotate needs Ray Data, which is not installed: {INSTALL_RAY}"
        ) from None
    return ray


@contextmanager
def _ray_running(ray: Any, address: str | None, quiet: bool) -> Iterator[None]:
    """A Ray to run on: the caller's if this process already started one (left running),
    the cluster at ``address``, or a local one with this machine's CPUs (shut down at the
    end)."""
    if ray.is_initialized():
        if address is not None:
            log.warning("Ray is already running in this process; --address is not used.")
        yield
        return
    started = time.perf_counter()
    level = logging.WARNING if quiet else logging.INFO
    if address is not None:
        ray.init(address=address, logging_level=level)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level=level)
    log.info("Ray started in %.1f s", time.perf_counter() - started)
    try:
        yield
    finally:
        ray.shutdown()


def _read(ray: Any, path: Path, kind: str) -> Dataset:
    if kind == "parquet":
        return ray.data.read_parquet(str(path))
    if kind == "json":
        return ray.data.read_json(str(path))
    return ray.data.read_text(str(path))


def _ray_failure(ray: Any, error: Exception) -> CommandError:
    """A failed Ray job as one line: the cause's type and message, not the remote traceback."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
        return CommandError(f"The Ray job failed: {type(cause).__name__}: {cause}")
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return CommandError(f"The Ray job failed: {lines[-1] if lines else type(error).__name__}")


# The arguments and options only this command takes.
InputArg = Annotated[
    Path,
    typer.Argument(
        metavar="INPUT",
        help="JSONL (.jsonl, .json), Parquet (a file or a folder of them) or plain text "
        "(anything else: one document a line, column 'text').",
    ),
]
OutputArg = Annotated[
    Path,
    typer.Argument(
        metavar="OUTPUT", help="One .parquet or .jsonl file: every input row, annotated."
    ),
]
Fields = Annotated[
    str, typer.Option(help=f"Annotations to add, comma-separated: {','.join(KNOWN_FIELDS)}.")
]
Workers = Annotated[
    int, typer.Option(min=1, help="Actors, each with its own copy of the pipeline.")
]
GpusPerWorker = Annotated[
    float, typer.Option(min=0, help="GPUs per actor (0.5: two actors share a GPU).")
]
CpusPerWorker = Annotated[float, typer.Option(min=0.01, help="CPUs per actor; its threads follow.")]
BatchSize = Annotated[int, typer.Option(min=1, help="Rows per batch an actor takes.")]
TextColumn = Annotated[str, typer.Option(help="The input column that holds the text.")]
Address = Annotated[
    str | None,
    typer.Option(
        help="A running Ray cluster (ray start --head; 'auto' finds a local one). "
        "Default: a local Ray with this machine's CPUs."
    ),
]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace OUTPUT if it exists.")]


@dataclass(frozen=True)
class _Job:
    """What the actors run, every part checked before Ray starts."""

    input_path: Path
    kind: str
    fields: list[str]
    pipeline: str
    code: Path | None
    text_column: str
    optimize_options: dict[str, Any]
    workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    batch_size: int


@app.command()
def annotate(
    pipeline: PipelineArg,
    input_path: InputArg,
    output: OutputArg,
    fields: Fields = "entities",
    provider: ProviderOption = "auto",
    precision: PrecisionOption = "fp32",
    workers: Workers = 1,
    gpus_per_worker: GpusPerWorker = 0,
    cpus_per_worker: CpusPerWorker = 1,
    batch_size: BatchSize = 64,
    text_column: TextColumn = "text",
    address: Address = None,
    code: Code = None,
    cache_dir: CacheDir = None,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Annotate a corpus on Ray Data into one Parquet or JSONL file (docs/ray.md)."""
    with one_line_errors(), speaking(quiet, verbose):
        started = time.perf_counter()
        _check_output(output, overwrite)
        job = _Job(
            input_path=input_path.resolve(),
            kind=_input_kind(input_path, text_column),
            fields=_fields(fields),
            pipeline=_pipeline_name(pipeline),
            code=_code(code),
            text_column=text_column,
            optimize_options=_optimize_options(provider, precision, cache_dir),
            workers=workers,
            cpus_per_worker=cpus_per_worker,
            gpus_per_worker=gpus_per_worker,
            batch_size=batch_size,
        )
        writer = _annotate_on_ray(job, output, address, quiet)
    seconds = time.perf_counter() - started
    typer.echo(
        f"{writer.rows} rows ({writer.errors} with errors) in {seconds:.1f} s, "
        f"{writer.rows / seconds:,.1f} rows/s -> {output}"
    )


def _optimize_options(provider: str, precision: str, cache_dir: Path | None) -> dict[str, Any]:
    """What each actor passes to ``optimize()``: the cache as an absolute path (their
    working folder is not ours)."""
    options: dict[str, Any] = {"provider": provider, "precision": precision}
    folder = cache_folder(cache_dir)
    if folder is not None:
        options["cache_dir"] = str(folder.resolve())
    return options


def _code(code: Path | None) -> Path | None:
    """``--code`` as the actors import it: checked, and absolute."""
    check_code(code)
    return code.resolve() if code is not None else None


def _annotate_on_ray(job: _Job, output: Path, address: str | None, quiet: bool) -> BatchWriter:
    """Run ``job`` on Ray (the cluster at ``address``, or a local one) and write the rows
    it annotates into ``output``, as they arrive."""
    hub_offline()  # before a local Ray starts: its actors, which load the pipeline, inherit it
    ray = _import_ray()
    from ray.data import DataContext

    from spacy_accelerate.ray import annotate as annotate_dataset

    context = DataContext.get_current()
    bars = context.enable_progress_bars
    with _ray_running(ray, address, quiet):
        context.enable_progress_bars = bars and not quiet
        annotated = annotate_dataset(
            _read(ray, job.input_path, job.kind),
            job.pipeline,
            text_column=job.text_column,
            optimize_options=job.optimize_options,
            fields=job.fields,
            batch_size=job.batch_size,
            concurrency=job.workers,
            num_cpus=job.cpus_per_worker,
            num_gpus=job.gpus_per_worker,
            code=str(job.code) if job.code is not None else None,
        )
        try:
            with BatchWriter(output) as writer:
                for batch in annotated.iter_batches(batch_size=None, batch_format="pyarrow"):
                    writer.write(batch)
        except ray.exceptions.RayError as error:
            raise _ray_failure(ray, error) from None
        finally:
            context.enable_progress_bars = bars
    return writer
