"""The execution providers, with their options, that a session is created with.

Every option ONNX Runtime gets is built here, from the validated config and
the session's bucket plan, as the exact string dictionaries ONNX Runtime
takes; one builder per provider, chosen by the provider enum.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spacy_accelerate.options.config import OptimizeConfig, Precision, Provider
from spacy_accelerate.runtime.buckets import BucketPlan
from spacy_accelerate.runtime.providers import import_runtime
from spacy_accelerate.runtime.session import SessionLayout

#: ONNX Runtime's name for each provider's execution provider.
ORT_PROVIDER_NAMES: dict[Provider, str] = {
    Provider.CPU: "CPUExecutionProvider",
    Provider.CUDA: "CUDAExecutionProvider",
    Provider.TENSORRT: "TensorrtExecutionProvider",
}

#: The extra of spacy-accelerate that installs each provider's runtime, and what it holds.
EXTRAS: dict[Provider, tuple[str, str]] = {
    Provider.CPU: ("cpu", "installs onnxruntime"),
    Provider.CUDA: ("gpu", "installs onnxruntime-gpu and cupy"),
    Provider.TENSORRT: ("tensorrt", "onnxruntime-gpu with TensorRT"),
}
#: What to install for each provider.
INSTALL_HINTS: dict[Provider, str] = {
    provider: f"pip install 'spacy-accelerate[{extra}]'  ({holds})"
    for provider, (extra, holds) in EXTRAS.items()
}


def import_onnxruntime() -> Any:
    """ONNX Runtime, or what installs it."""
    return import_runtime("onnxruntime", "ONNX Runtime", INSTALL_HINTS[Provider.CPU])


#: One execution provider as ONNX Runtime takes it: its name and its options.
ProviderEntry = tuple[str, dict[str, str]]


@dataclass(frozen=True)
class OnnxRuntimeLayout(SessionLayout):
    """An ONNX Runtime session's layout: where TensorRT keeps this model's engines, and its
    (per-GPU) timing cache (None: not kept)."""

    engine_dir: Path | None = None
    timing_dir: Path | None = None


def _flag(value: bool) -> str:
    return "1" if value else "0"


def _shapes(names: tuple[str, ...], shape: tuple[int, int]) -> str:
    return ",".join(f"{name}:{shape[0]}x{shape[1]}" for name in names)


def cpu_entries(config: OptimizeConfig, layout: SessionLayout) -> list[ProviderEntry]:
    return [(ORT_PROVIDER_NAMES[Provider.CPU], {})]


def cuda_options(config: OptimizeConfig, layout: SessionLayout, *, graphs: bool) -> dict[str, str]:
    """The CUDA execution provider's options."""
    return {
        "device_id": str(config.gpu.device_id),
        # Copies between host and device on the compute stream: no cross-stream races.
        "do_copy_in_default_stream": "1",
        # TF32 tensor cores round fp32 products to a 10-bit mantissa: fine inside an
        # fp16 model, but an fp32 model is asked for true fp32.
        "use_tf32": _flag(config.precision is not Precision.FP32),
        "enable_cuda_graph": _flag(graphs),
    }


def cuda_entries(config: OptimizeConfig, layout: SessionLayout) -> list[ProviderEntry]:
    options = cuda_options(config, layout, graphs=config.gpu.cuda_graph)
    return [(ORT_PROVIDER_NAMES[Provider.CUDA], options)]


def engine_settings(
    config: OptimizeConfig, input_names: tuple[str, ...], buckets: BucketPlan
) -> dict[str, str]:
    """What a TensorRT engine is built for: precision, builder and one optimization
    profile spanning every bucket (so that no new shape rebuilds it)."""
    trt = config.gpu.tensorrt
    low, opt, high = buckets.profile_shapes()
    return {
        "trt_fp16_enable": _flag(config.precision is Precision.FP16),
        "trt_max_workspace_size": str(trt.max_workspace_size),
        "trt_builder_optimization_level": str(trt.builder_optimization_level),
        "trt_profile_min_shapes": _shapes(input_names, low),
        "trt_profile_opt_shapes": _shapes(input_names, opt),
        "trt_profile_max_shapes": _shapes(input_names, high),
    }


def tensorrt_options(config: OptimizeConfig, layout: SessionLayout) -> dict[str, str]:
    """TensorRT's options: the engine's settings, and where its engines are cached."""
    trt = config.gpu.tensorrt
    options = {
        "device_id": str(config.gpu.device_id),
        **engine_settings(config, layout.input_names, layout.buckets),
    }
    engine_dir = layout.engine_dir if isinstance(layout, OnnxRuntimeLayout) else None
    timing_dir = layout.timing_dir if isinstance(layout, OnnxRuntimeLayout) else None
    if trt.engine_cache and engine_dir is not None:
        options["trt_engine_cache_enable"] = "1"
        options["trt_engine_cache_path"] = str(engine_dir)
    if trt.timing_cache and timing_dir is not None:
        options["trt_timing_cache_enable"] = "1"
        options["trt_timing_cache_path"] = str(timing_dir)
    return options


def tensorrt_entries(config: OptimizeConfig, layout: SessionLayout) -> list[ProviderEntry]:
    # Nodes TensorRT cannot take run on the CUDA provider, never on the CPU.
    return [
        (ORT_PROVIDER_NAMES[Provider.TENSORRT], tensorrt_options(config, layout)),
        (ORT_PROVIDER_NAMES[Provider.CUDA], cuda_options(config, layout, graphs=False)),
    ]


_ENTRIES: dict[Provider, Callable[[OptimizeConfig, SessionLayout], list[ProviderEntry]]] = {
    Provider.CPU: cpu_entries,
    Provider.CUDA: cuda_entries,
    Provider.TENSORRT: tensorrt_entries,
}


def execution_providers(config: OptimizeConfig, layout: SessionLayout) -> list[ProviderEntry]:
    """The providers, in priority order, with their options, for ``config.provider``."""
    return _ENTRIES[config.provider](config, layout)


def device_slug(device_id: int) -> str:
    """A folder name for this GPU model and ONNX Runtime release: TensorRT engines and
    timing caches are only valid on the GPU model and TensorRT build that made them."""
    import onnxruntime
    import torch

    name = f"cuda{device_id}"
    if torch.cuda.is_available() and device_id < torch.cuda.device_count():
        major, minor = torch.cuda.get_device_capability(device_id)
        name = f"{torch.cuda.get_device_name(device_id)}-sm{major}{minor}"
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{name}-ort{onnxruntime.__version__}")
    return slug.strip("-").lower()
