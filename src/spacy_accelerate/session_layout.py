"""Where and how a session over a cached model is opened.

TensorRT's engines and timing cache are derived data: rebuilt from the
cached ONNX file when missing, only valid on the GPU model and TensorRT
build that made them. They live beside the cache entries, under
``<cache_dir>/tensorrt/<gpu>-<onnxruntime>/``, never inside an entry (whose
files are checksummed and immutable), and go when the entry is evicted or
the cache cleared. Building an engine takes the entry's engine lock, so two
processes starting together build it once.
"""

from __future__ import annotations

from pathlib import Path

from .architectures.spec import EncoderSpec
from .buckets import BucketPlan
from .cache import ModelCache
from .config import OptimizeConfig, Provider
from .provider_options import SessionLayout, device_slug
from .providers import ResolvedProvider
from .runtime import EncoderSession


def session_layout(
    config: OptimizeConfig, spec: EncoderSpec, buckets: BucketPlan, cache: ModelCache, key: str
) -> SessionLayout:
    """The layout of the session over entry ``key`` for ``config``'s provider."""
    engine_dir = timing_dir = None
    if config.provider is Provider.TENSORRT:
        engine_dir, timing_dir = cache.engine_dirs(key, device_slug(config.gpu.device_id))
    return SessionLayout(
        input_names=spec.input_names,
        padding_idx=spec.padding_idx,
        buckets=buckets,
        engine_dir=engine_dir,
        timing_dir=timing_dir,
    )


def open_session(
    model: Path,
    provider: ResolvedProvider,
    config: OptimizeConfig,
    layout: SessionLayout,
    cache: ModelCache,
) -> EncoderSession:
    """A session over ``model``; TensorRT's build (or engine load) under the engine lock."""
    if layout.engine_dir is None:
        return EncoderSession(model, provider, config, layout)
    with cache.engine_lock(layout.engine_dir):
        return EncoderSession(model, provider, config, layout)
