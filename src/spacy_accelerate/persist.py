"""Persistence: an optimized pipeline saved with ``to_disk`` comes back optimized.

``optimize()`` records itself in ``nlp.config`` as the pipeline's
``after_pipeline_creation`` callback (``spacy_accelerate.optimize.v1``,
registered in spaCy's registry and found through an entry point), keeping
any callback that was there before as ``previous``. spaCy calls it right after
building the components, before their weights are loaded, so the callback
only arms a hook on ``from_disk``/``from_bytes``: once the weights are in, the
hook runs ``optimize()`` with the recorded options, which finds its model in
the cache. Nothing but options is ever written to disk: no sessions, no
pickles. Loading with ``config={"nlp": {"after_pipeline_creation":
{"enabled": False}}}`` keeps a saved pipeline on PyTorch, and the recorded
provider and precision can be overridden the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from spacy.language import Language
from spacy.util import registry

from .config import OptimizeConfig

CALLBACK_NAME = "spacy_accelerate.optimize.v1"
CALLBACK_KEY = "after_pipeline_creation"
LOAD_METHODS = ("from_disk", "from_bytes")


@dataclass(frozen=True)
class OptimizeRequest:
    """The options of an ``optimize()`` call as the user gave them (not resolved for
    this machine: ``auto`` and the thread count are resolved again where it loads)."""

    provider: str = "auto"
    precision: str = "fp32"
    cache_dir: str | None = None
    warmup: bool = True
    verify: bool = True
    tolerance: float | None = None
    min_cosine: float | None = None
    threads: int | None = None
    device_id: int = 0
    fallback: bool = False
    #: :class:`~spacy_accelerate.GpuOptions` as plain values (``GpuOptions.as_dict``).
    gpu: dict[str, Any] | None = None
    #: OpenVINO int8's calibration texts as given (None: the built-in sample).
    calibration_texts: list[str] | None = None
    min_agreement: float | None = None

    @classmethod
    def from_config(cls, config: OptimizeConfig, *, threads: int | None) -> OptimizeRequest:
        """The request behind ``config``; ``threads`` as given (None: this machine's CPUs)."""
        return cls(
            provider=config.provider.value,
            precision=config.precision.value,
            cache_dir=str(config.cache_dir) if config.cache_dir is not None else None,
            warmup=config.warmup,
            verify=config.verify,
            tolerance=config.tolerance,
            min_cosine=config.min_cosine,
            threads=threads,
            device_id=config.gpu.device_id,
            fallback=config.fallback,
            gpu=config.gpu.as_dict(),
            calibration_texts=list(config.calibration_texts) if config.calibration_texts else None,
            min_agreement=config.min_agreement,
        )

    def optimize_kwargs(self) -> dict[str, Any]:
        return asdict(self)


def _apply(nlp: Language, request: OptimizeRequest) -> None:
    from .accelerate import optimize  # the entry point imports this module

    options = request.optimize_kwargs()
    optimize(nlp, options.pop("provider"), options.pop("precision"), **options)


@dataclass(frozen=True)
class ReoptimizeAfterLoading:
    """Stands in for ``nlp.from_disk`` / ``nlp.from_bytes`` on an accelerated pipeline.

    The PyTorch modules are put back before the weights load (a proxy refuses
    new weights), and the pipeline is optimized again with the new weights.
    """

    nlp: Language
    method: str
    request: OptimizeRequest

    def __call__(self, *args: Any, **kwargs: Any) -> Language:
        from .accelerate import unpatch_all

        unpatch_all(self.nlp)
        loaded = getattr(type(self.nlp), self.method)(self.nlp, *args, **kwargs)
        _apply(self.nlp, self.request)
        return loaded


def install_load_hooks(nlp: Language, request: OptimizeRequest) -> None:
    for method in LOAD_METHODS:
        setattr(nlp, method, ReoptimizeAfterLoading(nlp, method, request))


def remove_load_hooks(nlp: Language) -> None:
    for method in LOAD_METHODS:
        if isinstance(nlp.__dict__.get(method), ReoptimizeAfterLoading):
            del nlp.__dict__[method]


def _is_ours(section: Any) -> bool:
    return isinstance(section, dict) and section.get("@callbacks") == CALLBACK_NAME


def record(nlp: Language, request: OptimizeRequest) -> None:
    """Write ``request`` into ``nlp.config`` as the after-creation callback."""
    section = nlp.config["nlp"].get(CALLBACK_KEY)
    previous = section.get("previous") if _is_ours(section) else section
    nlp.config["nlp"][CALLBACK_KEY] = {
        "@callbacks": CALLBACK_NAME,
        "enabled": True,
        **request.optimize_kwargs(),
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
    """spaCy's ``after_pipeline_creation`` callback that accelerates the loaded pipeline."""
    request = OptimizeRequest(
        provider=provider,
        precision=precision,
        cache_dir=cache_dir,
        warmup=warmup,
        verify=verify,
        tolerance=tolerance,
        min_cosine=min_cosine,
        threads=threads,
        device_id=device_id,
        fallback=fallback,
        gpu=dict(gpu) if gpu is not None else None,
        calibration_texts=list(calibration_texts) if calibration_texts is not None else None,
        min_agreement=min_agreement,
    )
    return AfterCreation(request=request, enabled=enabled, previous=previous)


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
