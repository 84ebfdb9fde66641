"""``spacy-accelerate annotate``: a corpus annotated on Ray Data, into one file.

The command reads INPUT (JSONL, Parquet or plain text), hands it to
:func:`spacy_accelerate.ray.annotate` (an actor pool, each actor loading and optimizing the
pipeline once) and streams the annotated rows back to the driver, in order of arrival, into
one OUTPUT file (Parquet or JSONL). Everything a user can get wrong (the suffixes, an
existing OUTPUT, the fields, the pipeline's name, ``--code``) is checked before Ray starts.

Ray, like spaCy and torch, is imported inside the command only: ``--help`` stays fast.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from spacy_accelerate.cli.app import (
    CacheDir,
    Code,
    CommandError,
    PipelineArg,
    Precision,
    Provider,
    Quiet,
    Verbose,
    _cache_folder,
    app,
    one_line_errors,
    speaking,
)
from spacy_accelerate.cli.outputs import check_file

if TYPE_CHECKING:
    import pyarrow as pa
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


def _input_kind(path: Path) -> str:
    """``json``, ``parquet`` or ``text``: how INPUT is read."""
    if not path.exists():
        raise CommandError(
            f"No input at {path}: give a JSONL file, a Parquet file or folder, or a text file "
            "(one document a line)."
        )
    if path.is_dir() or path.suffix.lower() == ".parquet":
        return "parquet"
    return "json" if path.suffix.lower() in JSON_SUFFIXES else "text"


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


def _has_null_type(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_null(data_type):
        return True
    return any(_has_null_type(data_type.field(i).type) for i in range(data_type.num_fields))


class _Writer:
    """OUTPUT written batch by batch into a hidden file beside it, renamed into place once
    complete: a failed run leaves neither half a file nor a name that blocks the rerun.

    Parquet needs one schema for the whole file, while a batch whose rows all lack a
    value (every ``error`` empty, every entity list empty) has Arrow's ``null`` type
    there: batches are held back until every column has a real type (or
    :attr:`HOLD_ROWS` rows are held), and every batch is cast to the unified schema."""

    HOLD_ROWS = 10_000

    def __init__(self, output: Path) -> None:
        self.output = output
        self.partial = output.with_name(f".{output.name}.{os.getpid()}.partial")
        self.rows = 0
        self.errors = 0
        self._held: list[pa.Table] = []
        self._schema: pa.Schema | None = None
        self._parquet: Any = None
        self._jsonl: Any = None

    def __enter__(self) -> _Writer:
        self.output.parent.mkdir(parents=True, exist_ok=True)
        if self.output.suffix.lower() == ".jsonl":
            self._jsonl = self.partial.open("w", encoding="utf8")
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is None and self.rows == 0:
                raise CommandError("The input has no rows: nothing to write.")
            if kind is None:
                self._flush(final=True)
            if self._parquet is not None:
                self._parquet.close()
            if self._jsonl is not None:
                self._jsonl.close()
            if kind is None:
                os.replace(self.partial, self.output)
        finally:
            self.partial.unlink(missing_ok=True)

    def write(self, batch: pa.Table) -> None:
        import pyarrow.compute as pc

        self.rows += batch.num_rows
        if "error" in batch.column_names:
            self.errors += int(pc.sum(pc.is_valid(batch.column("error"))).as_py() or 0)
        if self._jsonl is not None:
            for row in batch.to_pylist():
                self._jsonl.write(json.dumps(row, ensure_ascii=False, default=_json_value))
                self._jsonl.write("\n")
            return
        self._held.append(batch)
        self._flush(final=False)

    def _flush(self, final: bool) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._held:
            return
        if self._parquet is None:
            schema = pa.unify_schemas(
                [table.schema for table in self._held], promote_options="permissive"
            )
            held = sum(table.num_rows for table in self._held)
            if (
                not final
                and held < self.HOLD_ROWS
                and any(_has_null_type(field.type) for field in schema)
            ):
                return  # a later batch says what the empty columns hold
            if "error" in schema.names and pa.types.is_null(schema.field("error").type):
                schema = schema.set(schema.get_field_index("error"), pa.field("error", pa.string()))
            self._schema = schema
            self._parquet = pq.ParquetWriter(self.partial, schema)
        schema = self._schema
        assert schema is not None  # set with the writer
        for table in self._held:
            try:
                table = table.select(schema.names).cast(schema)
            except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise CommandError(
                    f"A batch does not fit the Parquet schema of the first ones ({error}); "
                    "write .jsonl instead."
                ) from None
            self._parquet.write_table(table)
        self._held = []


def _json_value(value: Any) -> Any:
    """What ``json`` cannot write: bytes (``docbin``) as base64, anything else as text."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def _ray_failure(ray: Any, error: Exception) -> CommandError:
    """A failed Ray job as one line: the cause's type and message, not the remote traceback."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
        return CommandError(f"The Ray job failed: {type(cause).__name__}: {cause}")
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return CommandError(f"The Ray job failed: {lines[-1] if lines else type(error).__name__}")


@app.command()
def annotate(
    pipeline: PipelineArg,
    input_path: Annotated[
        Path,
        typer.Argument(
            metavar="INPUT",
            help="JSONL (.jsonl, .json), Parquet (a file or a folder of them) or plain text "
            "(anything else: one document a line, column 'text').",
        ),
    ],
    output: Annotated[
        Path,
        typer.Argument(
            metavar="OUTPUT", help="One .parquet or .jsonl file: every input row, annotated."
        ),
    ],
    fields: Annotated[
        str,
        typer.Option(help=f"Annotations to add, comma-separated: {','.join(KNOWN_FIELDS)}."),
    ] = "entities",
    provider: Provider = "auto",
    precision: Precision = "fp32",
    workers: Annotated[
        int, typer.Option(min=1, help="Actors, each with its own copy of the pipeline.")
    ] = 1,
    gpus_per_worker: Annotated[
        float, typer.Option(min=0, help="GPUs per actor (0.5: two actors share a GPU).")
    ] = 0,
    cpus_per_worker: Annotated[
        float, typer.Option(min=0.01, help="CPUs per actor; its threads follow.")
    ] = 1,
    batch_size: Annotated[int, typer.Option(min=1, help="Rows per batch an actor takes.")] = 64,
    text_column: Annotated[str, typer.Option(help="The input column that holds the text.")] = (
        "text"
    ),
    address: Annotated[
        str | None,
        typer.Option(
            help="A running Ray cluster (ray start --head; 'auto' finds a local one). "
            "Default: a local Ray with this machine's CPUs."
        ),
    ] = None,
    code: Code = None,
    cache_dir: CacheDir = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace OUTPUT if it exists.")
    ] = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    """Annotate a corpus on Ray Data into one Parquet or JSONL file (docs/ray.md)."""
    with one_line_errors(), speaking(quiet, verbose):
        started = time.perf_counter()
        _check_output(output, overwrite)
        kind = _input_kind(input_path)
        if kind == "text" and text_column != "text":
            raise CommandError(
                f"--text-column {text_column}: a plain text INPUT has one column, 'text'."
            )
        asked = _fields(fields)
        name = _pipeline_name(pipeline)
        if code is not None and not code.is_file():
            raise CommandError(
                f"No Python file at {code} (--code): give the file that registers the "
                "pipeline's custom components or functions."
            )
        options: dict[str, Any] = {"provider": provider, "precision": precision}
        folder = _cache_folder(cache_dir)
        if folder is not None:
            options["cache_dir"] = str(folder.resolve())
        ray = _import_ray()
        from ray.data import DataContext

        from spacy_accelerate.ray import annotate as annotate_dataset

        context = DataContext.get_current()
        bars = context.enable_progress_bars
        with _ray_running(ray, address, quiet):
            context.enable_progress_bars = bars and not quiet
            annotated = annotate_dataset(
                _read(ray, input_path.resolve(), kind),
                name,
                text_column=text_column,
                optimize_options=options,
                fields=asked,
                batch_size=batch_size,
                concurrency=workers,
                num_cpus=cpus_per_worker,
                num_gpus=gpus_per_worker,
                code=str(code.resolve()) if code is not None else None,
            )
            try:
                with _Writer(output) as writer:
                    for batch in annotated.iter_batches(batch_size=None, batch_format="pyarrow"):
                        writer.write(batch)
            except ray.exceptions.RayError as error:
                raise _ray_failure(ray, error) from None
            finally:
                context.enable_progress_bars = bars
    seconds = time.perf_counter() - started
    typer.echo(
        f"{writer.rows} rows ({writer.errors} with errors) in {seconds:.1f} s, "
        f"{writer.rows / seconds:,.1f} rows/s -> {output}"
    )
