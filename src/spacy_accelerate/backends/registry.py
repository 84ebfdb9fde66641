"""Step 5: the provider registry, the one module that knows every backend.

Each provider maps to the backend that serves it. From there: which providers are
installed and usable here, ``auto``'s choice (the fastest this release serves on this
machine), the checks that fail early (before any export) with the package to install,
the order ``fallback=True`` walks, and the session layout and opening of a cached model.

``fallback=True`` serves the pipeline on the next provider when one cannot. By default a
provider that is missing, or that cannot build or run the model here, is an error: a
user who asked for TensorRT should not silently get the CPU. With ``fallback=True`` the
request walks TensorRT -> CUDA -> CPU, logging a warning at each step with the reason; a
precision the next provider does not serve (fp16 on the CPU) becomes fp32. Accuracy
failures never fall back: they are not the provider's fault. With ``cuda_graph=True``
the CUDA provider is tried again without graphs before the CPU. ``auto`` walks its
candidates the same way even without ``fallback``: a provider ONNX Runtime lists but
cannot start (onnxruntime-gpu lists TensorRT whether or not TensorRT's libraries are
there) must not make ``auto`` fail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.backends.base import Backend
from spacy_accelerate.backends.onnxruntime.backend import OnnxRuntimeBackend
from spacy_accelerate.backends.openvino.backend import OpenVINOBackend
from spacy_accelerate.cache.derived import register as register_derived
from spacy_accelerate.cache.store import ModelCache
from spacy_accelerate.cpu_features import cpu_features
from spacy_accelerate.errors import ProviderUnavailableError
from spacy_accelerate.options.config import (
    GPU_PROVIDERS,
    SUPPORTED_COMBINATIONS,
    OptimizeConfig,
    Precision,
    Provider,
    check_gpu_options,
    check_supported,
    precisions_of,
)
from spacy_accelerate.runtime.buckets import BucketPlan
from spacy_accelerate.runtime.providers import ResolvedProvider, torch_cuda_problem
from spacy_accelerate.runtime.session import Session, SessionLayout

logger = logging.getLogger("spacy_accelerate")

_ONNXRUNTIME = OnnxRuntimeBackend()
_OPENVINO = OpenVINOBackend()

#: The backend of each provider.
BACKENDS: dict[Provider, Backend] = {
    Provider.CPU: _ONNXRUNTIME,
    Provider.CUDA: _ONNXRUNTIME,
    Provider.TENSORRT: _ONNXRUNTIME,
    Provider.OPENVINO: _OPENVINO,
}

for _backend in set(BACKENDS.values()):
    for _folders in _backend.derived_folders:
        register_derived(_folders)

#: Preference order of ``auto``: fastest first (the CPU pair is ordered by
#: :func:`cpu_order`).
AUTO_ORDER: tuple[Provider, ...] = (
    Provider.TENSORRT,
    Provider.CUDA,
    Provider.CPU,
    Provider.OPENVINO,
)

#: What each provider falls back to with ``fallback=True``, in order.
FALLBACK_ORDER: dict[Provider, tuple[Provider, ...]] = {
    Provider.TENSORRT: (Provider.TENSORRT, Provider.CUDA, Provider.CPU),
    Provider.CUDA: (Provider.CUDA, Provider.CPU),
    Provider.OPENVINO: (Provider.OPENVINO, Provider.CPU),
    Provider.CPU: (Provider.CPU,),
}

#: The CPU provider everything falls back to last.
LAST_RESORT = Provider.CPU

#: The precisions at which OpenVINO beats ONNX Runtime's CPU provider on Intel CPUs:
#: static int8 (ONNX Runtime's CPU int8 is dynamic) and bf16 (ONNX Runtime serves none).
#: At fp32 both ran at the same speed in benchmarks/run.py, and ONNX Runtime is the
#: lighter dependency.
OPENVINO_FIRST: frozenset[Precision] = frozenset({Precision.INT8, Precision.BF16})


def backend_for(provider: Provider) -> Backend:
    """The backend serving ``provider`` (a concrete one: ``auto`` is resolved first)."""
    return BACKENDS[provider]


def install_hint(provider: Provider) -> str:
    """What to install for ``provider``."""
    return backend_for(provider).install_hint(provider)


def pip_extra(provider: Provider) -> str:
    """The extra of spacy-accelerate that installs ``provider``'s runtime."""
    return backend_for(provider).pip_extra(provider)


def cpu_vendor() -> str:
    """The CPU's vendor id (``GenuineIntel``, ``AuthenticAMD``, ...), or "" if unknown."""
    return cpu_features().vendor


def cpu_order(precision: Precision, vendor: str) -> tuple[Provider, Provider]:
    """``auto``'s CPU rule: OpenVINO before ONNX Runtime on an Intel CPU at int8 and bf16,
    where it uses the AMX/VNNI units through static quantization and bf16 kernels;
    ONNX Runtime first everywhere else (AMD and ARM CPUs, fp32)."""
    if vendor == "GenuineIntel" and precision in OPENVINO_FIRST:
        return (Provider.OPENVINO, Provider.CPU)
    return (Provider.CPU, Provider.OPENVINO)


def listed_providers() -> set[Provider]:
    """The providers present here: those whose backend's runtime is installed."""
    found: set[Provider] = set()
    for backend in set(BACKENDS.values()):
        found |= backend.present()
    return found


def available_providers() -> set[Provider]:
    """The providers that can run here: installed and, for the GPU ones, with a torch
    that can use the GPU."""
    found = listed_providers()
    return found - GPU_PROVIDERS if torch_cuda_problem() else found


def auto_candidates(config: OptimizeConfig) -> list[Provider]:
    """What ``auto`` may serve ``config`` with, fastest first: installed, usable here,
    serving the precision and the GPU options asked for."""
    installed = available_providers()
    gpus = tuple(provider for provider in AUTO_ORDER if provider in GPU_PROVIDERS)
    return [
        provider
        for provider in (*gpus, *cpu_order(config.precision, cpu_vendor()))
        if provider in installed
        and (provider, config.precision) in SUPPORTED_COMBINATIONS
        and check_gpu_options(provider, config.gpu) is None
    ]


def precision_candidates(config: OptimizeConfig) -> list[tuple[Provider, Precision]]:
    """``precision="auto"``'s candidates: every precision the provider serves (with
    ``fallback``, also those its fallbacks serve), or for ``provider="auto"`` every usable
    provider's (GPU ones first), in :data:`SERVED`'s order. Whether the machine can run
    one (bf16 units, a GPU) is found when it is tried."""
    if config.provider is not Provider.AUTO:  # with fallback, its fallbacks' too
        providers = list(FALLBACK_ORDER[config.provider] if config.fallback else [config.provider])
    else:
        usable = available_providers()
        providers = [
            provider
            for provider in AUTO_ORDER
            if provider in usable and check_gpu_options(provider, config.gpu) is None
        ] or [LAST_RESORT]
    return [
        (provider, precision) for provider in providers for precision in precisions_of(provider)
    ]


def check_provider(config: OptimizeConfig) -> ResolvedProvider:
    """Resolve ``auto``, then make sure the provider is installed and served."""
    installed = available_providers()
    provider = config.provider
    if provider is Provider.AUTO:
        candidates = auto_candidates(config)
        if not candidates:
            check_supported(LAST_RESORT, config.precision)
            raise ProviderUnavailableError(
                "No usable ONNX Runtime execution provider was found. Install one with: "
                f"{install_hint(LAST_RESORT)}"
            )
        provider = candidates[0]
    backend = backend_for(provider)
    if provider in GPU_PROVIDERS and provider in listed_providers() and provider not in installed:
        raise ProviderUnavailableError(
            f"provider={provider.value!r} runs on torch CUDA tensors, but {torch_cuda_problem()}. "
            "Install a CUDA build of torch (https://pytorch.org/get-started/locally/) on a machine "
            "with an NVIDIA GPU, or pass fallback=True to optimize()."
        )
    if provider not in installed:
        raise ProviderUnavailableError(
            f"provider={provider.value!r} needs {backend.runtime_name(provider)}, which is not "
            f"available here. Install it with: {install_hint(provider)}"
        )
    check_supported(provider, config.precision)
    backend.check(config)
    return ResolvedProvider(
        provider=provider,
        precision=config.precision,
        ort_providers=backend.runtime_providers(provider),
    )


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
        if config.fallback and LAST_RESORT not in providers:
            providers.append(LAST_RESORT)
        steps = [config.served_by(provider) for provider in providers] or [config]
    else:
        # The request itself must be valid: fallback never turns a pair this release
        # does not serve (cpu fp16, cuda int8) into another.
        check_supported(config.provider, config.precision)
        if not config.fallback:
            return [config]
        steps = [config] + [
            config.served_by(provider)
            for provider in FALLBACK_ORDER[config.provider][1:]
            if provider is LAST_RESORT or (provider, config.precision) in SUPPORTED_COMBINATIONS
        ]
    return _retry_without_graphs(steps)


def _retry_without_graphs(steps: list[OptimizeConfig]) -> list[OptimizeConfig]:
    # A graph ONNX Runtime cannot capture is no reason to leave the GPU.
    chain: list[OptimizeConfig] = []
    for step in steps:
        chain.append(step)
        if step.gpu.cuda_graph and step.provider is Provider.CUDA and len(steps) > 1:
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
                "spacy-accelerate: provider=%r could not be used (%s); falling back to "
                "provider=%r, precision=%r",
                attempt.provider.value,
                error,
                following.provider.value,
                following.precision.value,
            )
    raise ValueError("serve_first() needs at least one request")
