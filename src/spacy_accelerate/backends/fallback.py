"""``fallback=True``: serve the pipeline on the next provider when one cannot.

By default a provider that is missing, or that cannot build or run the
model here, is an error: a user who asked for TensorRT should not silently
get the CPU. With ``fallback=True`` the request walks TensorRT -> CUDA ->
CPU, logging a warning at each step with the reason; a precision the next
provider does not serve (fp16 on the CPU) becomes fp32. Accuracy failures
never fall back: they are not the provider's fault. With ``cuda_graph=True``
the CUDA provider is tried again without graphs before the CPU. ``auto``
walks its candidates the same way even without ``fallback``: a provider
ONNX Runtime lists but cannot start (onnxruntime-gpu lists TensorRT whether
or not TensorRT's libraries are there) must not make ``auto`` fail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from spacy_accelerate.backends.registry import FALLBACK_ORDER, LAST_RESORT, auto_candidates
from spacy_accelerate.errors import ProviderUnavailableError
from spacy_accelerate.options.config import (
    SUPPORTED_COMBINATIONS,
    OptimizeConfig,
    Provider,
    check_supported,
)

logger = logging.getLogger("spacy_accelerate")

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
