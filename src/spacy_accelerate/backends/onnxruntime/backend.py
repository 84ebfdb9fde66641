"""ONNX Runtime: the CPU, CUDA and TensorRT providers.

fp32 and fp16 models are the exported graph after ONNX Runtime's transformer optimizer
(:mod:`.graph`); int8 is its dynamic quantization, a ladder of plans searched until one
passes the gate (:mod:`.quantize`). TensorRT's engines and timing cache are derived
folders (:mod:`spacy_accelerate.cache.derived`), only valid on the GPU model, TensorRT
build and builder settings that made them:
``<cache_dir>/tensorrt/<gpu>-<onnxruntime>/<key>/<settings>/`` (the settings folder is a
hash of precision, workspace, builder level, profile shapes and the TensorRT version).
Building an engine takes its folder's lock, so two processes starting together build it
once.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.backends.base import Backend, BuildJob
from spacy_accelerate.backends.onnxruntime.graph import graph_plan, optimize_graph
from spacy_accelerate.backends.onnxruntime.int8_recipe import Int8Recipe, recipe_for
from spacy_accelerate.backends.onnxruntime.provider_options import (
    EXTRAS,
    INSTALL_HINTS,
    ORT_PROVIDER_NAMES,
    OnnxRuntimeLayout,
    device_slug,
    engine_settings,
    import_onnxruntime,
)
from spacy_accelerate.backends.onnxruntime.quantize import quantize_within_gate
from spacy_accelerate.backends.onnxruntime.session import EncoderSession
from spacy_accelerate.cache.derived import DerivedFolders
from spacy_accelerate.cache.store import ModelCache
from spacy_accelerate.cpu_features import cpu_features
from spacy_accelerate.errors import CacheError, ProviderUnavailableError
from spacy_accelerate.export.onnx import MODEL_FILE
from spacy_accelerate.options.config import OptimizeConfig, Precision, Provider
from spacy_accelerate.runtime.buckets import BucketPlan
from spacy_accelerate.runtime.providers import ResolvedProvider
from spacy_accelerate.runtime.session import Session, SessionLayout
from spacy_accelerate.verify.record import BuiltModel

logger = logging.getLogger("spacy_accelerate")

#: Distributions that ship TensorRT's libraries, in order of preference.
TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt-cu12", "tensorrt-cu12-libs", "tensorrt-libs")


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


def int8_recipe() -> Int8Recipe:
    """How this CPU's int8 model is made (:func:`.int8_recipe.recipe_for` of the CPU the
    detection sees, or a test simulates)."""
    return recipe_for(cpu_features())


#: TensorRT's engines (a folder per builder settings under each key and GPU) and its
#: per-GPU timing cache, beside the cache entries.
TENSORRT_ENGINES = DerivedFolders(
    name="tensorrt",
    label="tensorrt-engines",
    variants=True,
    shared=(("timing", "tensorrt-timing"),),
)


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime's execution providers over the exported ONNX file."""

    derived_folders = (TENSORRT_ENGINES,)

    def install_hint(self, provider: Provider) -> str:
        return INSTALL_HINTS[provider]

    def pip_extra(self, provider: Provider) -> str:
        return EXTRAS[provider][0]

    def runtime_name(self, provider: Provider) -> str:
        return f"ONNX Runtime's {ORT_PROVIDER_NAMES[provider]}"

    def describe(self) -> str:
        try:
            ort = import_onnxruntime()
        except ProviderUnavailableError:
            return "ONNX Runtime: not installed"
        listed = ", ".join(ort.get_available_providers())
        return f"ONNX Runtime {ort.__version__}: execution providers {listed}"

    def present(self) -> set[Provider]:
        try:
            listed = set(import_onnxruntime().get_available_providers())
        except ProviderUnavailableError:
            return set()
        return {provider for provider, name in ORT_PROVIDER_NAMES.items() if name in listed}

    def model_file(self, config: OptimizeConfig) -> str:
        return MODEL_FILE

    def runtime_version(self) -> str | None:
        try:
            return str(importlib.import_module("onnxruntime").__version__)
        except ImportError:
            return None

    def key_options(self, config: OptimizeConfig) -> dict[str, Any]:
        if config.precision is not Precision.INT8:
            return {}
        # The plan ladder's verdict depends on the gate and on what the CPU's int8
        # kernels compute (see quantize).
        return {
            "int8": asdict(int8_recipe()),
            "plan_gate": {"min_cosine": config.gate().min_cosine},
            "cpu_int8_kernels": list(cpu_features().int8_kernels),
        }

    def layout(
        self,
        config: OptimizeConfig,
        spec: EncoderSpec,
        buckets: BucketPlan,
        cache: ModelCache | None,
        key: str,
    ) -> SessionLayout:
        engine_dir = timing_dir = None
        trt = config.gpu.tensorrt
        wanted = trt.engine_cache or trt.timing_cache
        if config.provider is Provider.TENSORRT and wanted and cache is not None:
            settings = engine_settings(config, spec.input_names, buckets)
            settings["tensorrt"] = tensorrt_version()
            digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
            device = device_slug(config.gpu.device_id)
            try:
                if trt.engine_cache:
                    engine_dir = cache.derived_dir(TENSORRT_ENGINES, key, device, digest[:16])
                if trt.timing_cache:
                    timing_dir = cache.shared_dir(TENSORRT_ENGINES, device, "timing")
            except CacheError as error:
                # Engines are an optimisation: without a writable cache TensorRT builds anew.
                logger.warning("spacy-accelerate: TensorRT's engines will not be cached: %s", error)
                engine_dir = timing_dir = None
        return OnnxRuntimeLayout(
            input_names=spec.input_names,
            padding_idx=spec.padding_idx,
            buckets=buckets,
            engine_dir=engine_dir,
            timing_dir=timing_dir,
        )

    def open_session(
        self,
        model: Path,
        provider: ResolvedProvider,
        config: OptimizeConfig,
        layout: SessionLayout,
        cache: ModelCache | None,
    ) -> Session:
        """TensorRT's build (or engine load) under the engine folder's lock."""
        engine_dir = layout.engine_dir if isinstance(layout, OnnxRuntimeLayout) else None
        if engine_dir is None or cache is None:
            return EncoderSession(model, provider, config, layout)
        with cache.derived_lock(engine_dir):
            return EncoderSession(model, provider, config, layout)

    def build(self, job: BuildJob) -> BuiltModel:
        config = job.config
        if config.precision is Precision.INT8:
            return quantize_within_gate(
                job,
                int8_recipe(),
                lambda path: EncoderSession(path, job.provider, config, job.layout),
            )
        plan = graph_plan(config.provider, config.precision)
        if plan.fuse:  # read from the export, the fused graph written into the entry
            optimize_graph(job.export.path, job.path, job.spec, plan)
        else:
            job.export.copy_to(job.path)
        session = self.open_session(job.path, job.provider, config, job.layout, job.cache)
        return job.judged(session)
