"""Where and how a session over a cached model is opened.

TensorRT's engines and timing cache are derived data: rebuilt from the
cached ONNX file when missing, only valid on the GPU model, TensorRT build
and builder settings that made them. They live beside the cache entries,
under ``<cache_dir>/tensorrt/<gpu>-<onnxruntime>/<key>/<settings>/`` (the
settings folder is a hash of precision, workspace, builder level, profile
shapes and the TensorRT version), never inside an entry (whose files are
checksummed and immutable), and go when the entry is evicted or the cache
cleared. Building an engine takes its folder's lock, so two processes
starting together build it once. OpenVINO's compiled blobs follow the same
rules under ``<cache_dir>/openvino/<cpu>-<openvino>/<key>/``, and are checked
against their recorded sha256 before each compile (:mod:`.openvino_blobs`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import logging
from pathlib import Path

from .architectures.spec import EncoderSpec
from .buckets import BucketPlan
from .cache import ModelCache
from .config import OptimizeConfig, Provider
from .errors import CacheError
from .openvino_blobs import checked_blobs
from .openvino_runtime import OpenVINOSession, cpu_slug
from .provider_options import SessionLayout, device_slug, engine_settings
from .providers import ResolvedProvider
from .runtime import EncoderSession

#: Distributions that ship TensorRT's libraries, in order of preference.
TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt-cu12", "tensorrt-cu12-libs", "tensorrt-libs")


logger = logging.getLogger("spacy_accelerate")


def tensorrt_version() -> str:
    """The installed TensorRT's version (engines of another version cannot be loaded):
    from pip's metadata, else from the module of a system-wide install."""
    for name in TENSORRT_DISTRIBUTIONS:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        return f"tensorrt {importlib.import_module('tensorrt').__version__}"
    except Exception:  # not importable (or broken): engines are then keyed as unknown
        return "unknown"


def session_layout(
    config: OptimizeConfig, spec: EncoderSpec, buckets: BucketPlan, cache: ModelCache, key: str
) -> SessionLayout:
    """The layout of the session over entry ``key`` for ``config``'s provider."""
    engine_dir = timing_dir = None
    trt = config.gpu.tensorrt
    if config.provider is Provider.TENSORRT and (trt.engine_cache or trt.timing_cache):
        settings = engine_settings(config, spec.input_names, buckets)
        settings["tensorrt"] = tensorrt_version()
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
        device = device_slug(config.gpu.device_id)
        try:
            engine_dir = cache.engine_dir(key, device, digest[:16]) if trt.engine_cache else None
            timing_dir = cache.timing_dir(device) if trt.timing_cache else None
        except CacheError as error:
            # Engines are an optimisation: without a writable cache TensorRT builds anew.
            logger.warning("spacy-accelerate: TensorRT's engines will not be cached: %s", error)
            engine_dir = timing_dir = None
    compiled_dir = (
        cache.compiled_dir(key, cpu_slug()) if config.provider is Provider.OPENVINO else None
    )
    return SessionLayout(
        input_names=spec.input_names,
        padding_idx=spec.padding_idx,
        buckets=buckets,
        engine_dir=engine_dir,
        timing_dir=timing_dir,
        compiled_dir=compiled_dir,
    )


def open_session(
    model: Path,
    provider: ResolvedProvider,
    config: OptimizeConfig,
    layout: SessionLayout,
    cache: ModelCache | None,
) -> EncoderSession:
    """A session over ``model``; TensorRT's build (or engine load) under the engine lock,
    OpenVINO's compile under its blob folder's lock, the blobs checked (none are kept
    without a ``cache``)."""
    if provider.provider is Provider.OPENVINO:
        blobs = layout.compiled_dir
        if blobs is not None and cache is not None:
            try:
                with cache.compiled_lock(blobs), checked_blobs(blobs):
                    return OpenVINOSession(model, provider, config, layout, cache_dir=blobs)
            except CacheError as error:
                # A read-only cache serves its entries without locks; its blobs cannot be
                # checked under one, so they are not read: OpenVINO compiles instead.
                logger.warning(
                    "spacy-accelerate: OpenVINO's compiled blobs are not used: %s", error
                )
        return OpenVINOSession(model, provider, config, layout)
    if layout.engine_dir is None or cache is None:
        return EncoderSession(model, provider, config, layout)
    with cache.engine_lock(layout.engine_dir):
        return EncoderSession(model, provider, config, layout)
