"""Step 5: the provider registry, the one module that loads backends.

Each row of the provider table (:data:`~spacy_accelerate.options.providers.PROVIDERS`)
names the backend that serves it; the registry loads each backend once. From there:
which providers are installed and usable here, ``auto``'s choice (the fastest this
release serves on this machine), the checks that fail early (before any export) with the
package to install, the order ``fallback=True`` walks, and the session layout and
opening of a cached model.

``fallback=True`` serves the pipeline on the next provider when one cannot. By default a
provider that is missing, or that cannot build or run the model here, is an error: a
user who asked for TensorRT should not silently get the CPU. With ``fallback=True`` the
request walks the table's fallbacks (TensorRT -> CUDA -> CPU), logging a warning at each
step with the reason; a precision the next provider does not serve (fp16 on the CPU)
becomes fp32. Accuracy failures never fall back: they are not the provider's fault. With
``cuda_graph=True`` a provider that captures graphs is tried again without them before
the next one. ``auto`` walks its candidates the same way even without ``fallback``: a
provider ONNX Runtime lists but cannot start (onnxruntime-gpu lists TensorRT whether or
not TensorRT's libraries are there) must not make ``auto`` fail.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.backends.base import Backend
from spacy_accelerate.cache.derived import register as register_derived
from spacy_accelerate.cache.store import ModelCache
from spacy_accelerate.cpu_features import cpu_features
from spacy_accelerate.errors import Advice, ProviderUnavailableError, spelled
from spacy_accelerate.options.config import (
    OptimizeConfig,
    Precision,
    Provider,
    check_gpu_options,
    check_supported,
)
from spacy_accelerate.options.providers import PROVIDERS, ProviderSpec
from spacy_accelerate.runtime.buckets import BucketPlan
from spacy_accelerate.runtime.providers import ResolvedProvider, torch_cuda_problem
from spacy_accelerate.runtime.session import Session, SessionLayout

logger = logging.getLogger("spacy_accelerate")

#: One instance of each backend class the provider table names, by its import path.
_LOADED: dict[str, Backend] = {}


def _load(path: str) -> Backend:
    backend = _LOADED.get(path)
    if backend is None:
        module, _, name = path.partition(":")
        backend_type = getattr(importlib.import_module(module), name)
        if not (isinstance(backend_type, type) and issubclass(backend_type, Backend)):
            raise TypeError(f"{path} (a provider table row) is not a Backend subclass")
        backend = _LOADED[path] = backend_type()
        for folders in backend.derived_folders:  # the cache removes them with their entries
            register_derived(folders)
    return backend


def backend_for(provider: Provider) -> Backend:
    """The backend serving ``provider`` (a concrete one: ``auto`` is resolved first)."""
    return _load(registered(provider).backend)


def registered(provider: Provider) -> ProviderSpec:
    """``provider``'s row of the table; a provider read back from a saved pipeline or a
    cache entry that no package registered here is a provider this machine cannot use."""
    if provider not in PROVIDERS:
        raise ProviderUnavailableError(
            Advice("provider", provider.value),
            " is not registered here: import the package that registers it before loading "
            f"the pipeline, or ask for one of {PROVIDERS.choices()}.",
        )
    return PROVIDERS[provider]


def backends() -> list[Backend]:
    """Every backend of the provider table, each once."""
    return list({id(backend): backend for backend in map(backend_for, PROVIDERS.names())}.values())


backends()  # every built-in backend's derived folders are known to the cache from here on


def install_hint(provider: Provider) -> str:
    """What to install for ``provider``."""
    return backend_for(provider).install_hint(provider)


def pip_extra(provider: Provider) -> str:
    """The extra of spacy-accelerate that installs ``provider``'s runtime."""
    return backend_for(provider).pip_extra(provider)


def auto_order(precision: Precision) -> list[Provider]:
    """Every provider in ``auto``'s order for ``precision`` on this CPU: the table's ranks,
    as each backend adjusts them for the CPU (:meth:`Backend.auto_rank`)."""
    cpu = cpu_features()
    ranked = {
        row.provider: backend_for(row.provider).auto_rank(row, precision, cpu) for row in PROVIDERS
    }
    return sorted(ranked, key=ranked.__getitem__)


def listed_providers() -> set[Provider]:
    """The providers present here: those whose backend's runtime is installed."""
    found: set[Provider] = set()
    for backend in backends():
        found |= backend.present()
    return found & set(PROVIDERS.names())


def available_providers() -> set[Provider]:
    """The providers that can run here: installed and, for the GPU ones, with a torch
    that can use the GPU."""
    found = listed_providers()
    if torch_cuda_problem():
        return {provider for provider in found if not PROVIDERS.on_gpu(provider)}
    return found


def auto_candidates(config: OptimizeConfig) -> list[Provider]:
    """What ``auto`` may serve ``config`` with, fastest first: installed, usable here,
    serving the precision and the GPU options asked for."""
    installed = available_providers()
    return [
        provider
        for provider in auto_order(config.precision)
        if provider in installed
        and PROVIDERS.serves(provider, config.precision)
        and check_gpu_options(provider, config.gpu) is None
    ]


def precision_candidates(config: OptimizeConfig) -> list[tuple[Provider, Precision]]:
    """``precision="auto"``'s candidates: every precision the provider serves (with
    ``fallback``, also those its fallbacks serve), or for ``provider="auto"`` every usable
    provider's (in ``auto``'s order), each provider's in the table's order. Whether the
    machine can run one (bf16 units, a GPU) is found when it is tried."""
    if config.provider is not Provider.AUTO:  # with fallback, its fallbacks' too
        chain = PROVIDERS.fallback_chain(config.provider)
        providers = list(chain if config.fallback else chain[:1])
    else:
        usable = available_providers()
        providers = [
            provider
            for provider in auto_order(config.precision)
            if provider in usable and check_gpu_options(provider, config.gpu) is None
        ] or [PROVIDERS.last_resort()]
    return [
        (provider, precision)
        for provider in providers
        for precision in PROVIDERS.precisions_of(provider)
    ]


def check_provider(config: OptimizeConfig) -> ResolvedProvider:
    """Resolve ``auto``, then make sure the provider is installed and served."""
    installed = available_providers()
    provider = config.provider
    if provider is not Provider.AUTO:
        registered(provider)
    if provider is Provider.AUTO:
        candidates = auto_candidates(config)
        if not candidates:
            last_resort = PROVIDERS.last_resort()
            check_supported(last_resort, config.precision)
            raise ProviderUnavailableError(
                "No usable provider was found for ",
                Advice("provider", "auto"),
                f". Install one with: {install_hint(last_resort)}",
            )
        provider = candidates[0]
    backend = backend_for(provider)
    on_gpu = PROVIDERS.on_gpu(provider)
    if on_gpu and provider in listed_providers() and provider not in installed:
        raise ProviderUnavailableError(
            Advice("provider", provider.value),
            f" runs on torch CUDA tensors, but {torch_cuda_problem()}. Install a CUDA build of "
            "torch (https://pytorch.org/get-started/locally/) on a machine with an NVIDIA GPU, "
            "or pass ",
            Advice("fallback", True),
            ".",
        )
    if provider not in installed:
        raise ProviderUnavailableError(
            Advice("provider", provider.value),
            f" needs {backend.runtime_name(provider)}, which is not available here. Install it "
            f"with: {install_hint(provider)}",
        )
    check_supported(provider, config.precision)
    backend.check(config)
    return ResolvedProvider(provider=provider, precision=config.precision)


def session_layout(
    config: OptimizeConfig,
    spec: EncoderSpec,
    buckets: BucketPlan,
    cache: ModelCache | None,
    key: str,
) -> SessionLayout:
    """The layout of the session over entry ``key`` for ``config``'s provider."""
    return backend_for(config.provider).layout(config, spec, buckets, cache, key)


def open_session(
    model: Path,
    provider: ResolvedProvider,
    config: OptimizeConfig,
    layout: SessionLayout,
    cache: ModelCache | None,
) -> Session:
    """A session over ``model`` by ``provider``'s backend (no derived artefacts are kept
    without a ``cache``)."""
    return backend_for(provider.provider).open_session(model, provider, config, layout, cache)


T = TypeVar("T")


def fallback_chain(config: OptimizeConfig) -> list[OptimizeConfig]:
    """The requests to try in order.

    An explicit provider: that request alone, or with ``fallback`` the providers after
    it down to the CPU (skipping those that cannot serve the precision; the CPU serves
    fp16 requests as fp32). ``auto``: every usable provider that serves the precision,
    fastest first (a provider ONNX Runtime lists but cannot start is no reason to
    fail), and with ``fallback`` the CPU last, at fp32 if need be. Wherever a CUDA
    graph is asked for and there is a next step, the CUDA provider is tried again
    without graphs first.
    """
    if config.provider is Provider.AUTO:
        providers = auto_candidates(config)
        if config.fallback and PROVIDERS.last_resort() not in providers:
            providers.append(PROVIDERS.last_resort())
        steps = [config.served_by(provider) for provider in providers] or [config]
    else:
        # The request itself must be valid: fallback never turns a pair this release
        # does not serve (cpu fp16, cuda int8) into another.
        registered(config.provider)
        check_supported(config.provider, config.precision)
        if not config.fallback:
            return [config]
        last_resort = PROVIDERS.last_resort()
        steps = [config] + [
            config.served_by(provider)
            for provider in PROVIDERS.fallback_chain(config.provider)[1:]
            if provider is last_resort or PROVIDERS.serves(provider, config.precision)
        ]
    return _retry_without_graphs(steps)


def _retry_without_graphs(steps: list[OptimizeConfig]) -> list[OptimizeConfig]:
    # A graph ONNX Runtime cannot capture is no reason to leave the GPU.
    chain: list[OptimizeConfig] = []
    for step in steps:
        chain.append(step)
        row = PROVIDERS.get(step.provider)
        if step.gpu.cuda_graph and row is not None and row.captures_graphs and len(steps) > 1:
            chain.append(replace(step, gpu=replace(step.gpu, cuda_graph=False)))
    return chain


def serve_first(chain: Sequence[OptimizeConfig], serve: Callable[[OptimizeConfig], T]) -> T:
    """``serve`` the first request of ``chain`` whose provider works; the last one's error
    is raised when none does."""
    for index, attempt in enumerate(chain):
        try:
            return serve(attempt)
        except ProviderUnavailableError as error:
            if index == len(chain) - 1:
                raise
            following = chain[index + 1]
            logger.warning(
                "spacy-accelerate: %s could not be used (%s); falling back to %s",
                spelled([Advice("provider", attempt.provider.value)]),
                error,
                spelled(
                    [
                        Advice("provider", following.provider.value),
                        ", ",
                        Advice("precision", following.precision.value),
                    ]
                ),
            )
    raise ValueError("serve_first() needs at least one request")
