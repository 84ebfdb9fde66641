"""``annotate()``: a Ray ``Dataset`` in, the same rows with their annotations out."""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spacy.util import is_package

from spacy_accelerate.api import optimize
from spacy_accelerate.errors import InvalidOptionError, ProviderUnavailableError
from spacy_accelerate.ray.actor import Annotator
from spacy_accelerate.ray.fields import ERROR_COLUMN, check_fields

if TYPE_CHECKING:
    import ray.data

INSTALL_RAY = "pip install 'spacy-accelerate[ray]'"

#: How often Ray restarts a dead actor (-1: always) and retries a batch whose actor died.
#: A Python exception never kills an actor (bad rows are caught and reported in ``error``),
#: so these count crashes of the process: a killed or lost worker, a lost node. A batch
#: that kills its actor every time (a crash in native code) fails the job after
#: ``MAX_TASK_RETRIES`` retries rather than restarting actors forever.
MAX_RESTARTS = -1
MAX_TASK_RETRIES = 3


def require_ray() -> Any:
    """The ``ray`` module with Ray Data, or a clear error saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401 - the [data] part of the extra
    except ImportError as error:
        raise ProviderUnavailableError(
            f"spacy_accelerate.ray needs Ray Data, which is not installed ({error}): {INSTALL_RAY}"
        ) from None
    return ray


def _pipeline_location(pipeline: str | os.PathLike[str]) -> str:
    """What each actor passes to ``spacy.load``: an installed package's name, or the
    pipeline folder's absolute path (an actor's working folder need not be ours)."""
    name = os.fspath(pipeline)
    if not isinstance(pipeline, os.PathLike) and is_package(name):
        return name
    path = Path(name).expanduser()
    if not (path / "config.cfg").is_file():
        raise InvalidOptionError(
            f"No pipeline at {name}: give a pipeline folder (the one nlp.to_disk() wrote, "
            "with config.cfg) or an installed pipeline package."
        )
    return str(path.resolve())


def _actor_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``optimize_options`` (none: {}) checked against :func:`optimize`'s keywords, with
    the cache folder made absolute (the threads follow the actor's CPUs: its budget,
    :meth:`~spacy_accelerate.cpu_budget.CpuBudget.confine`)."""
    given = dict(options or {})
    accepted = set(inspect.signature(optimize).parameters) - {"nlp"}
    unknown = sorted(set(given) - accepted)
    if unknown:
        raise InvalidOptionError(
            f"optimize_options has {', '.join(repr(name) for name in unknown)}, which "
            f"optimize() does not take: choose from {', '.join(sorted(accepted))}."
        )
    if given.get("cache_dir") is not None:
        given["cache_dir"] = str(Path(given["cache_dir"]).expanduser().resolve())
    return given


def _check_columns(dataset: ray.data.Dataset, text_column: str, fields: Sequence[str]) -> None:
    schema = dataset.schema()
    if schema is None:  # an empty dataset: nothing to check, nothing to annotate
        return
    names = list(schema.names)
    if text_column not in names:
        raise InvalidOptionError(
            f"The dataset has no column {text_column!r} (text_column): its columns are "
            f"{', '.join(repr(name) for name in names) or 'none'}."
        )
    taken = [name for name in (*fields, ERROR_COLUMN) if name in names]
    if taken:
        raise InvalidOptionError(
            f"The dataset already has column{'s' if len(taken) > 1 else ''} "
            f"{', '.join(repr(name) for name in taken)}, which annotate() adds: rename "
            f"{'them' if len(taken) > 1 else 'it'} first."
        )


def annotate(
    dataset: ray.data.Dataset,
    pipeline: str | os.PathLike[str],
    *,
    text_column: str = "text",
    optimize_options: Mapping[str, Any] | None = None,
    fields: Sequence[str] = ("entities",),
    batch_size: int = 64,
    concurrency: int | tuple[int, int] = 1,
    num_cpus: float = 1,
    num_gpus: float = 0,
    code: str | os.PathLike[str] | None = None,
) -> ray.data.Dataset:
    """Annotate ``dataset``'s ``text_column`` with ``pipeline`` on a pool of Ray actors;
    return the lazy dataset of the same rows, every input column kept, with a column per
    name in ``fields`` and an ``error`` column added.

    Each actor (``concurrency`` of them, or a (min, max) range; ``num_cpus`` and
    ``num_gpus`` each) loads ``pipeline`` once (a folder or an installed package, after
    importing ``code``, the file that registers its custom components, as ``spacy
    --code`` does) and runs :func:`~spacy_accelerate.optimize` on it with
    ``optimize_options`` (the runtime's threads following ``num_cpus``). Without
    ``optimize_options``, a pipeline saved accelerated is served as it loads: from the
    models saved with it (its bundle), with no export and no cache lock, on the threads it
    was saved with. Actors on one node share its model cache: the cache's lock lets one of
    them export, and the others load what it stored. Batches of ``batch_size`` rows go
    through ``nlp.pipe``.

    ``fields``, from :data:`FIELDS`: ``tags``, ``pos``, ``lemmas`` and ``deps`` (lists of
    strings, one a token), ``heads`` (each token's head, as a token index), ``entities``
    (``{start_char, end_char, label}`` each), ``sents`` (``[start_char, end_char]`` each)
    and ``docbin`` (the bytes of a ``DocBin`` holding the row's doc).

    A row whose text is null, not a string, or makes the pipeline raise is kept, with empty
    annotations (``docbin`` null) and ``error`` saying why; the other rows of its batch are
    annotated as usual. A dead actor is restarted and its batches retried, so every row
    comes out exactly once. An unknown field, a missing ``text_column``, an added column
    the dataset already has, an option ``optimize()`` does not take or a pipeline that does
    not exist raises :class:`~spacy_accelerate.errors.InvalidOptionError` before any work.
    """
    wanted = check_fields(fields)
    ray_module = require_ray()
    _check_sizes(concurrency, batch_size)
    location = _pipeline_location(pipeline)
    options = _actor_options(optimize_options)
    code_path = _code_path(code)
    _check_columns(dataset, text_column, wanted)
    annotator = {
        "pipeline": location,
        "text_column": text_column,
        "fields": wanted,
        "optimize_options": None if optimize_options is None else options,
        "code": code_path,
        "default_options": options,
        "cpus": num_cpus,
    }
    pool = _actor_pool(ray_module, concurrency)
    return _on_actors(dataset, annotator, pool, batch_size, num_cpus, num_gpus)


def _check_sizes(concurrency: int | tuple[int, int], batch_size: int) -> None:
    """At least one actor (where ``concurrency`` is a count) and one row a batch."""
    if isinstance(concurrency, int) and concurrency < 1:
        raise InvalidOptionError(f"concurrency must be at least 1 actor, not {concurrency}.")
    if batch_size < 1:
        raise InvalidOptionError(f"batch_size must be at least 1 row, not {batch_size}.")


def _code_path(code: str | os.PathLike[str] | None) -> str | None:
    """The absolute path each actor imports ``code`` from (it must be a file), or None."""
    if code is None:
        return None
    if not Path(code).is_file():
        raise InvalidOptionError(
            f"No Python file at {os.fspath(code)} (code): give the file that registers "
            "the pipeline's custom components or functions."
        )
    return str(Path(code).resolve())


def _actor_pool(ray_module: Any, concurrency: int | tuple[int, int]) -> Any:
    """Ray Data's pool of ``concurrency`` actors: a fixed count, or a (min, max) range."""
    if isinstance(concurrency, int):
        return ray_module.data.ActorPoolStrategy(size=concurrency)
    return ray_module.data.ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1])


def _on_actors(
    dataset: ray.data.Dataset,
    annotator: dict[str, Any],
    pool: Any,
    batch_size: int,
    num_cpus: float,
    num_gpus: float,
) -> ray.data.Dataset:
    """``dataset``'s batches of ``batch_size`` rows through :class:`Annotator` actors made
    with ``annotator`` (its keyword arguments), in ``pool``, each on ``num_cpus`` and
    ``num_gpus``; restarted where they die (:func:`_restarts`)."""
    with warnings.catch_warnings():
        # Ray 2.60 deprecates passing remote arguments (the restarts) by keyword; where
        # they are no longer taken, Ray Data's own defaults restart actors and retry tasks.
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        return dataset.map_batches(
            Annotator,
            fn_constructor_kwargs=annotator,
            batch_size=batch_size,
            batch_format="pyarrow",
            zero_copy_batch=True,
            compute=pool,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            **_restarts(dataset),
        )


def _restarts(dataset: ray.data.Dataset) -> dict[str, Any]:
    """The actors' restart and retry counts, where ``map_batches`` still takes them."""
    parameters = inspect.signature(dataset.map_batches).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return {"max_restarts": MAX_RESTARTS, "max_task_retries": MAX_TASK_RETRIES}
    return {}
