"""``fallback=True``: serve the pipeline on the next provider when one cannot.

By default a provider that is missing, or that cannot build or run the
model here, is an error: a user who asked for TensorRT should not silently
get the CPU. With ``fallback=True`` the request walks TensorRT -> CUDA ->
CPU, logging a warning at each step with the reason; a precision the next
provider does not serve (fp16 on the CPU) becomes fp32. Accuracy failures
never fall back: they are not the provider's fault. With ``cuda_graph=True``
the CUDA provider is tried again without graphs before the CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from .config import OptimizeConfig, Provider
from .errors import ProviderUnavailableError
from .providers import check_provider

logger = logging.getLogger("spacy_accelerate")

#: What each provider falls back to, in order.
FALLBACK_ORDER: dict[Provider, tuple[Provider, ...]] = {
    Provider.TENSORRT: (Provider.TENSORRT, Provider.CUDA, Provider.CPU),
    Provider.CUDA: (Provider.CUDA, Provider.CPU),
    Provider.OPENVINO: (Provider.OPENVINO, Provider.CPU),
    Provider.CPU: (Provider.CPU,),
}

T = TypeVar("T")


def fallback_chain(config: OptimizeConfig) -> list[OptimizeConfig]:
    """The requests to try in order: ``config`` alone, or with ``fallback`` the chain
    from its provider (``auto`` resolved first) down to the CPU."""
    if not config.fallback:
        return [config]
    first = config.provider
    if first is Provider.AUTO:
        first = check_provider(config).provider
    chain: list[OptimizeConfig] = []
    for provider in FALLBACK_ORDER[first]:
        attempt = config.served_by(provider)
        chain.append(attempt)
        if attempt.gpu.cuda_graph and provider is Provider.CUDA:
            # A graph ONNX Runtime cannot capture is no reason to leave the GPU.
            chain.append(replace(attempt, gpu=replace(attempt.gpu, cuda_graph=False)))
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
