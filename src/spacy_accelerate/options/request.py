"""The options of ``optimize()``, spelled once.

:class:`OptimizeOptions` is the one list of ``optimize()``'s keyword options, their
defaults and their types: ``optimize()`` takes exactly its fields (a test holds it to
that), :func:`validate` checks them into an :class:`~.config.OptimizeConfig`, and the
record saved with a pipeline (:class:`OptimizeRequest`) goes back to them field by field.
The load callback and the command line's ``optimize`` take the same names with the same
defaults (tests hold both to this class). Adding an option: a field here, its check in
:func:`validate`, its field in :class:`~.config.OptimizeConfig`, and its use.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from spacy_accelerate.cpu_budget import OverlapPlan, available_cpus
from spacy_accelerate.errors import Advice, InvalidOptionError, joined, spelled
from spacy_accelerate.options.agreement import AgreementBounds, parse_min_agreement
from spacy_accelerate.options.applicability import inapplicable
from spacy_accelerate.options.config import (
    DEFAULT_CALIBRATED_INT8_MIN_COSINE,
    DEFAULT_FP16_MIN_COSINE,
    DEFAULT_GPU_TOLERANCE,
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_MIN_COSINE,
    DEFAULT_OVERLAP,
    DEFAULT_TOLERANCE,
    MissingCache,
    OptimizeConfig,
    Precision,
    Provider,
    Workload,
    check_gpu_options,
    parse_enum,
    parse_precision,
    parse_provider,
    texts_digest,
)
from spacy_accelerate.options.gpu import GpuOptions, parse_gpu_options

logger = logging.getLogger("spacy_accelerate")


#: The metadata of an option that says where and how a pipeline runs, not which model
#: serves it: a pipeline loaded with other values of these still serves its saved models.
LOAD_TIME = {"load_time": True}


@dataclass(frozen=True)
class OptimizeOptions:
    """``optimize()``'s options as a user gives them (see ``optimize()`` for each)."""

    provider: str | Provider = "auto"
    precision: str | Precision = "fp32"
    cache_dir: str | os.PathLike[str] | None = field(default=None, metadata=LOAD_TIME)
    warmup: bool = field(default=True, metadata=LOAD_TIME)
    verify: bool = True
    tolerance: float | None = None
    min_cosine: float | None = None
    threads: int | None = field(default=None, metadata=LOAD_TIME)
    device_id: int | None = None
    fallback: bool = False
    gpu: GpuOptions | Mapping[str, Any] | None = None
    calibration_texts: Sequence[str] | None = None
    min_agreement: float | Mapping[str, float] | None = None
    lock_timeout: float | None = field(default=None, metadata=LOAD_TIME)
    missing_cache: str | MissingCache = field(
        default=MissingCache.REBUILD.value, metadata=LOAD_TIME
    )
    bundle: bool = field(default=True, metadata=LOAD_TIME)
    overlap: bool | None = field(default=DEFAULT_OVERLAP, metadata=LOAD_TIME)
    workload: str | Workload = Workload.BATCHES.value


def build_config(
    provider: str | Provider = "auto", precision: str | Precision = "fp32", **options: Any
) -> OptimizeConfig:
    """Validate ``optimize()``'s options (keyword names as there, see
    :class:`~spacy_accelerate.options.request.OptimizeOptions`); ``provider`` may still be
    ``auto`` here: :func:`spacy_accelerate.backends.registry.check_provider` resolves it,
    because only it knows what is installed."""
    return validate(OptimizeOptions(provider=provider, precision=precision, **options))


def validate(options: OptimizeOptions, *, saved: bool = False) -> OptimizeConfig:
    """The checked :class:`OptimizeConfig` of ``options``, or an
    :class:`~spacy_accelerate.errors.InvalidOptionError` naming the keyword to fix.

    An option that no plan of the request reads (``min_agreement`` with fp32, say: see
    :mod:`~.applicability`) is an error too; where the options are ``saved`` with a
    pipeline (loaded where another provider serves it, or overridden at load) it is only
    a warning: a pipeline that loaded before must keep loading."""
    parsed_provider = parse_provider(options.provider)
    parsed_precision = parse_precision(options.precision)
    bounds = _checked_numbers(options)
    gpu_options = parse_gpu_options(options.gpu, device_id=options.device_id)
    problem = check_gpu_options(parsed_provider, gpu_options)
    if problem is not None:
        raise InvalidOptionError(*problem)
    texts = _parse_texts(options.calibration_texts)
    _check_applicable(options, parsed_provider, parsed_precision, gpu_options, saved=saved)
    cache_dir, tolerance, min_cosine = options.cache_dir, options.tolerance, options.min_cosine
    threads, lock_timeout = options.threads, options.lock_timeout
    return OptimizeConfig(
        provider=parsed_provider,
        precision=parsed_precision,
        cache_dir=Path(cache_dir) if cache_dir is not None else None,
        warmup=bool(options.warmup),
        overlap=None if options.overlap is None else bool(options.overlap),
        verify=bool(options.verify),
        tolerance=float(tolerance) if tolerance is not None else None,
        min_cosine=float(min_cosine) if min_cosine is not None else None,
        intra_op_threads=threads if threads is not None else available_cpus(),
        gpu=gpu_options,
        fallback=bool(options.fallback),
        calibration_texts=texts,
        min_agreement=bounds,
        calibration_sha256=texts_digest(texts) if texts is not None else None,
        calibration_count=len(texts) if texts is not None else None,
        lock_timeout=float(lock_timeout) if lock_timeout is not None else DEFAULT_LOCK_TIMEOUT,
        missing_cache=parse_enum(MissingCache, options.missing_cache, "missing_cache"),
        bundle=bool(options.bundle),
        workload=parse_enum(Workload, options.workload, "workload"),
    )


def _checked_numbers(options: OptimizeOptions) -> AgreementBounds:
    """Refuse a number out of its range (``tolerance``, ``min_cosine``, ``threads``,
    ``lock_timeout``); ``min_agreement`` as bounds."""
    tolerance, min_cosine = options.tolerance, options.min_cosine
    min_agreement, threads = options.min_agreement, options.threads
    lock_timeout = options.lock_timeout
    if tolerance is not None and not (isinstance(tolerance, int | float) and 0 < tolerance < 1):
        raise InvalidOptionError(
            Advice("tolerance"),
            f" must be a number between 0 and 1, got {tolerance!r}; the default "
            f"is {DEFAULT_TOLERANCE} on a CPU and {DEFAULT_GPU_TOLERANCE} on a GPU.",
        )
    if min_cosine is not None and not (isinstance(min_cosine, int | float) and 0 < min_cosine <= 1):
        raise InvalidOptionError(
            Advice("min_cosine"),
            f" must be a number in (0, 1], got {min_cosine!r}; the default is "
            f"{DEFAULT_MIN_COSINE} for int8, {DEFAULT_CALIBRATED_INT8_MIN_COSINE} for a calibrated "
            f"int8 (a mean) and {DEFAULT_FP16_MIN_COSINE} for fp16 and bf16.",
        )
    bounds = parse_min_agreement(min_agreement)
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise InvalidOptionError(
            Advice("threads"), f" must be a positive integer or None, got {threads!r}."
        )
    if lock_timeout is not None and not (
        isinstance(lock_timeout, int | float)
        and not isinstance(lock_timeout, bool)
        and lock_timeout >= 0
        and math.isfinite(lock_timeout)
    ):
        raise InvalidOptionError(
            Advice("lock_timeout"),
            f" must be a number of seconds (0 or more), got {lock_timeout!r}; "
            f"the default is {DEFAULT_LOCK_TIMEOUT:g}.",
        )
    return bounds


def _given(options: OptimizeOptions, gpu: GpuOptions, *, saved: bool) -> list[str]:
    """The options of ``options`` that only some plans read, where they were given. A saved
    record holds the GPU options even where they were not given (their defaults): there,
    only values that differ from the defaults count."""
    given = [
        name
        for name, value in (
            ("tolerance", options.tolerance),
            ("min_cosine", options.min_cosine),
            ("min_agreement", options.min_agreement),
            ("calibration_texts", options.calibration_texts),
        )
        if value is not None
    ]
    if saved:
        given += ["device_id"] if gpu.device_id != GpuOptions().device_id else []
        given += ["gpu"] if replace(gpu, device_id=GpuOptions().device_id) != GpuOptions() else []
    else:
        given += ["device_id"] if options.device_id is not None else []
        given += ["gpu"] if options.gpu is not None else []
    return given + (["fallback"] if options.fallback else [])


def _check_applicable(
    options: OptimizeOptions,
    provider: Provider,
    precision: Precision,
    gpu: GpuOptions,
    *,
    saved: bool,
) -> None:
    """Refuse (warn about, where ``saved``) the options no plan of the request reads."""
    given = _given(options, gpu, saved=saved)
    problems = inapplicable(given, provider, precision, bool(options.fallback))
    if problems and not saved:
        raise InvalidOptionError(*joined(problems))
    for problem in problems:
        logger.warning(
            "spacy-accelerate: the options saved with this pipeline include one that does "
            "not apply where it loads, and it is ignored: %s",
            spelled(problem),
        )


def _parse_texts(texts: Sequence[str] | None) -> tuple[str, ...] | None:
    if texts is None:
        return None
    chosen = () if isinstance(texts, str) else tuple(texts)  # a generator is read once
    if not chosen or not all(isinstance(text, str) and text.strip() for text in chosen):
        raise InvalidOptionError(
            Advice("calibration_texts"),
            " must be a non-empty list of non-blank strings (texts like the ones you will "
            "process), or None for the built-in English sample.",
        )
    return chosen


@dataclass(frozen=True)
class OptimizeRequest(OptimizeOptions):
    """The options of an ``optimize()`` call as saved with the pipeline (not resolved for
    this machine: ``auto``, the thread count and the cache folder are resolved again
    where it loads). Every option of :class:`OptimizeOptions` in plain values (strings,
    ``GpuOptions.as_dict``); ``cache_dir`` and ``calibration_texts`` are load-time
    overrides, never saved; what is saved in their place follows."""

    #: The cache folder that configs saved by earlier releases record. Never written now,
    #: and ignored where it loads: a loaded pipeline does not choose where this machine
    #: writes (:func:`spacy_accelerate.pipeline.persist.callers_request`).
    saved_cache_dir: str | None = field(default=None, metadata=LOAD_TIME)
    #: What is saved of the calibration texts ``optimize()`` was given.
    calibration_sha256: str | None = None
    calibration_count: int | None = None
    #: Whether ``nlp.pipe`` overlaps, and the runtime's threads under it, as ``optimize()``
    #: decided (``overlap_plan.OverlapPlan.record``): a loaded pipeline serves the same plan,
    #: with no timing (None: none decided yet).
    overlap_plan: dict[str, Any] | None = field(default=None, metadata=LOAD_TIME)

    @classmethod
    def from_config(cls, config: OptimizeConfig, *, threads: int | None) -> OptimizeRequest:
        """The request behind ``config``; ``threads`` as given (None: this machine's CPUs)."""
        cache_dir = config.cache_dir
        return cls(
            provider=config.provider.value,
            precision=config.precision.value,
            warmup=config.warmup,
            overlap=config.overlap,
            verify=config.verify,
            tolerance=config.tolerance,
            min_cosine=config.min_cosine,
            threads=threads,
            device_id=config.gpu.device_id,
            fallback=config.fallback,
            gpu=config.gpu.as_dict(),
            min_agreement=config.min_agreement.as_option(),
            lock_timeout=config.lock_timeout,
            missing_cache=config.missing_cache.value,
            bundle=config.bundle,
            workload=config.workload.value,
            # In memory, for new weights loaded in this process; never saved (see saved()).
            cache_dir=str(cache_dir.expanduser().absolute()) if cache_dir else None,
            # Kept in memory for the load hooks (new weights need calibrating again);
            # never written: see saved() and __getstate__.
            calibration_texts=list(config.calibration_texts) if config.calibration_texts else None,
            calibration_sha256=config.calibration_sha256,
            calibration_count=config.calibration_count,
        )

    @property
    def plan(self) -> OverlapPlan | None:
        """The overlap plan recorded with the pipeline for its ``overlap`` option, if any
        (one decided for another value, or unreadable: none)."""
        plan = OverlapPlan.from_record(self.overlap_plan)
        return plan if plan is not None and plan.asked is self.overlap else None

    @property
    def overlaps(self) -> bool:
        """Whether the pipeline's ``nlp.pipe`` overlaps: as planned, else as asked."""
        plan = self.plan
        return plan.overlap if plan is not None else bool(self.overlap)

    def options(self, cache_dir: str | os.PathLike[str] | None) -> OptimizeOptions:
        """``optimize()``'s options of this record (every field of the same name), with
        ``cache_dir`` as resolved where the pipeline loads."""
        given = {f.name: getattr(self, f.name) for f in fields(OptimizeOptions)}
        return OptimizeOptions(**{**given, "cache_dir": cache_dir})

    def to_config(self, cache_dir: str | os.PathLike[str] | None) -> OptimizeConfig:
        """The validated options for the machine the pipeline loads on, its cache folder
        ``cache_dir`` as the caller there gives it (None: the environment's or default)."""
        config = validate(self.options(cache_dir), saved=True)
        plan = self.plan
        if plan is not None and self.threads is None:  # no timing, sessions opened once
            config = replace(config, intra_op_threads=plan.runtime_threads(config.intra_op_threads))
        if self.calibration_texts is None and self.calibration_sha256 is not None:
            config = replace(
                config,
                calibration_sha256=self.calibration_sha256,
                calibration_count=self.calibration_count,
            )
        return config

    def model_options(self) -> dict[str, Any]:
        """The saved options that decide which model serves (not the :data:`LOAD_TIME`
        ones): the models saved with a pipeline serve it where it loads with the same."""
        chosen = {f.name: f for f in fields(self) if not f.metadata.get("load_time")}
        values = {name: value for name, value in self.saved().items() if name in chosen}
        if self.calibration_texts is not None:  # texts given where it loads: their digest
            values["calibration_sha256"] = texts_digest(self.calibration_texts)
            values["calibration_count"] = len(self.calibration_texts)
        del values["calibration_texts"]
        return values

    def saved(self) -> dict[str, Any]:
        """The options as written into ``config.cfg``: the load-time overrides empty."""
        return asdict(replace(self, cache_dir=None, calibration_texts=None))

    def __getstate__(self) -> dict[str, Any]:
        # A pickled pipeline carries no calibration texts either (their digest finds the
        # cache entry).
        return {**self.__dict__, "calibration_texts": None}
