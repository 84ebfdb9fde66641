"""Persistence: an optimized pipeline saved with ``to_disk`` comes back optimized.

``optimize()`` records itself in ``nlp.config`` as the pipeline's
``after_pipeline_creation`` callback (``spacy_accelerate.optimize.v2``,
registered in spaCy's registry and found through an entry point), keeping
any callback that was there before as ``previous``. spaCy calls it right after
building the components, before their weights are loaded, so the callback
only arms a hook on ``from_disk``/``from_bytes``: once the weights are in, the
hook runs ``optimize()`` with the recorded options, which finds its model in
the cache. Nothing but options is ever written to disk: no sessions, no
pickles, and of calibration texts only their sha256 and count.

The saved pipeline is portable: the cache folder is resolved where it loads
(:mod:`.cache_location`: an override given at load, then ``SPACY_ACCELERATE_CACHE``,
then the recorded folder if it still works there, then the default). Loading
with ``config={"nlp": {"after_pipeline_creation": {"enabled": False}}}`` keeps a
saved pipeline on PyTorch, and the recorded options can be overridden the same way.

A load that fails never leaves a half-accelerated pipeline: it is accelerated again
with the weights it holds, or, where that fails too, left as :func:`restore` leaves it
(PyTorch, trainable, a plain config).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from spacy.language import Language
from spacy.util import registry

from .cache_location import saved_cache_dir
from .config import MissingCache, OptimizeConfig, build_config
from .errors import CacheMissError

logger = logging.getLogger("spacy_accelerate")

CALLBACK_NAME = "spacy_accelerate.optimize.v2"
#: The first version's name: pipelines saved with it still load.
CALLBACK_NAME_V1 = "spacy_accelerate.optimize.v1"
CALLBACK_KEY = "after_pipeline_creation"
LOAD_METHODS = ("from_disk", "from_bytes")


@dataclass(frozen=True)
class OptimizeRequest:
    """The options of an ``optimize()`` call as saved with the pipeline (not resolved for
    this machine: ``auto``, the thread count and the cache folder are resolved again
    where it loads)."""

    provider: str = "auto"
    precision: str = "fp32"
    warmup: bool = True
    verify: bool = True
    tolerance: float | None = None
    min_cosine: float | None = None
    threads: int | None = None
    device_id: int = 0
    fallback: bool = False
    #: :class:`~spacy_accelerate.GpuOptions` as plain values (``GpuOptions.as_dict``).
    gpu: dict[str, Any] | None = None
    min_agreement: float | None = None
    lock_timeout: float | None = None
    missing_cache: str = MissingCache.REBUILD.value
    #: The cache folder to use where the pipeline loads: never saved, only given at load.
    cache_dir: str | None = None
    #: The cache folder ``optimize()`` was given (absolute), used where it loads only if
    #: it still works there; None: the environment variable or the default, as then.
    saved_cache_dir: str | None = None
    #: Calibration texts to use where the pipeline loads: never saved, only given at load.
    calibration_texts: list[str] | None = None
    #: What is saved of the calibration texts ``optimize()`` was given.
    calibration_sha256: str | None = None
    calibration_count: int | None = None

    @classmethod
    def from_config(cls, config: OptimizeConfig, *, threads: int | None) -> OptimizeRequest:
        """The request behind ``config``; ``threads`` as given (None: this machine's CPUs)."""
        cache_dir = config.cache_dir
        return cls(
            provider=config.provider.value,
            precision=config.precision.value,
            warmup=config.warmup,
            verify=config.verify,
            tolerance=config.tolerance,
            min_cosine=config.min_cosine,
            threads=threads,
            device_id=config.gpu.device_id,
            fallback=config.fallback,
            gpu=config.gpu.as_dict(),
            min_agreement=config.min_agreement,
            lock_timeout=config.lock_timeout,
            missing_cache=config.missing_cache.value,
            saved_cache_dir=str(cache_dir.expanduser().absolute()) if cache_dir else None,
            # Kept in memory for the load hooks (new weights need calibrating again);
            # never written: see saved() and __getstate__.
            calibration_texts=list(config.calibration_texts) if config.calibration_texts else None,
            calibration_sha256=config.calibration_sha256,
            calibration_count=config.calibration_count,
        )

    def to_config(self) -> OptimizeConfig:
        """The validated options for the machine the pipeline loads on."""
        config = build_config(
            self.provider,
            self.precision,
            cache_dir=saved_cache_dir(self.cache_dir, self.saved_cache_dir),
            warmup=self.warmup,
            verify=self.verify,
            tolerance=self.tolerance,
            min_cosine=self.min_cosine,
            threads=self.threads,
            device_id=self.device_id,
            fallback=self.fallback,
            gpu=self.gpu,
            calibration_texts=self.calibration_texts,
            min_agreement=self.min_agreement,
            lock_timeout=self.lock_timeout,
            missing_cache=self.missing_cache,
        )
        if self.calibration_texts is None and self.calibration_sha256 is not None:
            config = replace(
                config,
                calibration_sha256=self.calibration_sha256,
                calibration_count=self.calibration_count,
            )
        return config

    def saved(self) -> dict[str, Any]:
        """The options as written into ``config.cfg``: the load-time overrides empty."""
        return asdict(replace(self, cache_dir=None, calibration_texts=None))

    def __getstate__(self) -> dict[str, Any]:
        # A pickled pipeline carries no calibration texts either (their digest finds the
        # cache entry).
        return {**self.__dict__, "calibration_texts": None}


def _apply(nlp: Language, request: OptimizeRequest) -> None:
    """Accelerate a loaded pipeline as recorded. Where ``missing_cache="pytorch"`` and its
    model is not cached here, it is left on PyTorch as :func:`restore` leaves it."""
    from .accelerate import apply_config, restore  # the entry point imports this module

    try:
        # Recorded as loaded, not as resolved here: a pipeline saved without cache_dir keeps
        # following the environment where it is loaded next.
        config = request.to_config()
        apply_config(nlp, config, threads=request.threads, reloading=True, request=request)
    except CacheMissError as missing:
        restore(nlp)
        logger.warning(
            "spacy-accelerate: %s This pipeline runs on PyTorch; call "
            "spacy_accelerate.optimize(nlp) to accelerate it.",
            missing,
        )


@dataclass(frozen=True)
class ReoptimizeAfterLoading:
    """Stands in for ``nlp.from_disk`` / ``nlp.from_bytes`` on an accelerated pipeline.

    The PyTorch modules are put back before the weights load (a proxy refuses
    new weights), and the pipeline is optimized again with the new weights. When the
    load or that optimization fails, the pipeline is optimized again with whatever
    weights it holds, or, failing that too, restored to plain PyTorch; the error is
    raised either way.
    """

    nlp: Language
    method: str
    request: OptimizeRequest

    def __call__(self, *args: Any, **kwargs: Any) -> Language:
        from .accelerate import restore, unpatch_all

        unpatch_all(self.nlp)
        try:
            loaded = getattr(type(self.nlp), self.method)(self.nlp, *args, **kwargs)
        except BaseException:
            self._settle()
            raise
        try:
            _apply(self.nlp, self.request)
        except BaseException:
            restore(self.nlp)
            raise
        return loaded

    def _settle(self) -> None:
        """After a failed load: accelerated again as recorded, or plain."""
        from .accelerate import restore

        try:
            _apply(self.nlp, self.request)
        except Exception as error:
            restore(self.nlp)
            logger.warning(
                "spacy-accelerate: after the failed nlp.%s() the pipeline could not be "
                "accelerated again (%s); it runs on PyTorch, as restore() leaves it.",
                self.method,
                error,
            )


def install_load_hooks(nlp: Language, request: OptimizeRequest) -> None:
    for method in LOAD_METHODS:
        setattr(nlp, method, ReoptimizeAfterLoading(nlp, method, request))


def remove_load_hooks(nlp: Language) -> None:
    for method in LOAD_METHODS:
        if isinstance(nlp.__dict__.get(method), ReoptimizeAfterLoading):
            del nlp.__dict__[method]


def _is_ours(section: Any) -> bool:
    return isinstance(section, dict) and section.get("@callbacks") in (
        CALLBACK_NAME,
        CALLBACK_NAME_V1,
    )


def record(nlp: Language, request: OptimizeRequest) -> None:
    """Write ``request`` into ``nlp.config`` as the after-creation callback."""
    section = nlp.config["nlp"].get(CALLBACK_KEY)
    previous = section.get("previous") if _is_ours(section) else section
    nlp.config["nlp"][CALLBACK_KEY] = {
        "@callbacks": CALLBACK_NAME,
        "enabled": True,
        **request.saved(),
        "previous": previous,
    }


def forget(nlp: Language) -> None:
    """Remove the record, putting back whatever callback was there before."""
    section = nlp.config["nlp"].get(CALLBACK_KEY)
    if _is_ours(section):
        nlp.config["nlp"][CALLBACK_KEY] = section.get("previous")


@registry.callbacks(CALLBACK_NAME)
def make_optimize_callback(
    provider: str = "auto",
    precision: str = "fp32",
    enabled: bool = True,
    warmup: bool = True,
    verify: bool = True,
    tolerance: float | None = None,
    min_cosine: float | None = None,
    threads: int | None = None,
    device_id: int = 0,
    fallback: bool = False,
    gpu: dict[str, Any] | None = None,
    min_agreement: float | None = None,
    lock_timeout: float | None = None,
    missing_cache: str = MissingCache.REBUILD.value,
    cache_dir: str | None = None,
    saved_cache_dir: str | None = None,
    calibration_texts: list[str] | None = None,
    calibration_sha256: str | None = None,
    calibration_count: int | None = None,
    previous: Callable[[Language], Language] | None = None,
) -> Callable[[Language], Language]:
    """spaCy's ``after_pipeline_creation`` callback that accelerates the loaded pipeline.
    ``cache_dir`` and ``calibration_texts`` are load-time overrides (never saved)."""
    request = OptimizeRequest(
        provider=provider,
        precision=precision,
        warmup=warmup,
        verify=verify,
        tolerance=tolerance,
        min_cosine=min_cosine,
        threads=threads,
        device_id=device_id,
        fallback=fallback,
        gpu=dict(gpu) if gpu is not None else None,
        min_agreement=min_agreement,
        lock_timeout=lock_timeout,
        missing_cache=missing_cache,
        cache_dir=cache_dir,
        saved_cache_dir=saved_cache_dir,
        calibration_texts=list(calibration_texts) if calibration_texts is not None else None,
        calibration_sha256=calibration_sha256,
        calibration_count=calibration_count,
    )
    return AfterCreation(request=request, enabled=enabled, previous=previous)


@registry.callbacks(CALLBACK_NAME_V1)
def make_optimize_callback_v1(
    provider: str = "auto",
    precision: str = "fp32",
    enabled: bool = True,
    cache_dir: str | None = None,
    warmup: bool = True,
    verify: bool = True,
    tolerance: float | None = None,
    min_cosine: float | None = None,
    threads: int | None = None,
    device_id: int = 0,
    fallback: bool = False,
    gpu: dict[str, Any] | None = None,
    calibration_texts: list[str] | None = None,
    min_agreement: float | None = None,
    previous: Callable[[Language], Language] | None = None,
) -> Callable[[Language], Language]:
    """The callback of pipelines saved by the first release: its ``cache_dir`` is where
    the cache was (used only if it still works), its texts are used as saved."""
    return make_optimize_callback(
        provider=provider,
        precision=precision,
        enabled=enabled,
        warmup=warmup,
        verify=verify,
        tolerance=tolerance,
        min_cosine=min_cosine,
        threads=threads,
        device_id=device_id,
        fallback=fallback,
        gpu=gpu,
        min_agreement=min_agreement,
        saved_cache_dir=cache_dir,
        calibration_texts=calibration_texts,
        previous=previous,
    )


@dataclass(frozen=True)
class AfterCreation:
    """Runs the previous callback, then arms the load hooks (or does nothing if disabled)."""

    request: OptimizeRequest
    enabled: bool
    previous: Callable[[Language], Language] | None

    def __call__(self, nlp: Language) -> Language:
        if self.previous is not None:
            nlp = self.previous(nlp)
        if self.enabled:
            install_load_hooks(nlp, self.request)
        return nlp


__all__ = [
    "CALLBACK_NAME",
    "OptimizeRequest",
    "forget",
    "install_load_hooks",
    "make_optimize_callback",
    "record",
    "remove_load_hooks",
]
