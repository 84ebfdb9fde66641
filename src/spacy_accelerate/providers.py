"""Step 5: check that the requested execution provider is installed and usable.

Resolves ``auto`` to the fastest provider this release serves on this
machine, and otherwise fails early, before any export, with the package to
install.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from .config import (
    GPU_PROVIDERS,
    SUPPORTED_COMBINATIONS,
    OptimizeConfig,
    Precision,
    Provider,
    check_gpu_options,
    check_supported,
)
from .cpu_features import cpu_features
from .errors import ProviderUnavailableError

#: ONNX Runtime's name for each provider's execution provider.
ORT_PROVIDER_NAMES: dict[Provider, str] = {
    Provider.CPU: "CPUExecutionProvider",
    Provider.CUDA: "CUDAExecutionProvider",
    Provider.TENSORRT: "TensorrtExecutionProvider",
}

#: What to install for each provider.
INSTALL_HINTS: dict[Provider, str] = {
    Provider.CPU: "pip install 'spacy-accelerate[cpu]'  (installs onnxruntime)",
    Provider.CUDA: "pip install 'spacy-accelerate[gpu]'  (installs onnxruntime-gpu and cupy)",
    Provider.TENSORRT: "pip install 'spacy-accelerate[tensorrt]'  (onnxruntime-gpu with TensorRT)",
    Provider.OPENVINO: "pip install 'spacy-accelerate[openvino]'  (installs openvino and nncf)",
}

#: Preference order of ``auto``: fastest first (the CPU pair is ordered by
#: :func:`cpu_order`).
AUTO_ORDER: tuple[Provider, ...] = (
    Provider.TENSORRT,
    Provider.CUDA,
    Provider.CPU,
    Provider.OPENVINO,
)

#: The precisions at which OpenVINO beats ONNX Runtime's CPU provider on Intel CPUs:
#: static int8 (ONNX Runtime's CPU int8 is dynamic) and bf16 (ONNX Runtime serves none).
#: At fp32 both ran at the same speed in benchmarks/run.py (1.11x vs 1.10x PyTorch on a
#: BERT-base shape), and ONNX Runtime is the lighter dependency.
OPENVINO_FIRST: frozenset[Precision] = frozenset({Precision.INT8, Precision.BF16})


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


@dataclass(frozen=True)
class ResolvedProvider:
    """A concrete, installed provider and the ONNX Runtime providers to ask for."""

    provider: Provider
    precision: Precision
    ort_providers: tuple[str, ...]


def import_runtime(module: str, what: str, provider: Provider) -> ModuleType:
    """Import an optional runtime package, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ProviderUnavailableError(
            f"{what} is not installed ({error}). Install it with: {INSTALL_HINTS[provider]}"
        ) from error


def import_onnxruntime() -> ModuleType:
    return import_runtime("onnxruntime", "ONNX Runtime", Provider.CPU)


def torch_cuda_problem() -> str | None:
    """Why torch cannot hold CUDA tensors here, or None. The GPU providers exchange
    torch CUDA tensors with spaCy, so they need a CUDA build of torch and a GPU."""
    import torch

    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    return f"torch {torch.__version__} sees no CUDA device (check nvidia-smi, CUDA_VISIBLE_DEVICES)"


def listed_providers() -> set[Provider]:
    """The providers present here: ONNX Runtime's execution providers of this build, and
    OpenVINO when its package is installed (it runs on its own runtime)."""
    try:
        present = set(import_onnxruntime().get_available_providers())
    except ProviderUnavailableError:  # OpenVINO alone needs no ONNX Runtime
        present = set()
    found = {provider for provider, name in ORT_PROVIDER_NAMES.items() if name in present}
    if importlib.util.find_spec("openvino") is not None:
        found.add(Provider.OPENVINO)
    return found


def available_providers() -> set[Provider]:
    """The providers that can run here: present in ONNX Runtime and, for the GPU ones,
    with a torch that can use the GPU."""
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


def check_provider(config: OptimizeConfig) -> ResolvedProvider:
    """Resolve ``auto``, then make sure the provider is installed and served."""
    installed = available_providers()
    provider = config.provider
    if provider is Provider.AUTO:
        candidates = auto_candidates(config)
        if not candidates:
            check_supported(Provider.CPU, config.precision)
            raise ProviderUnavailableError(
                "No usable ONNX Runtime execution provider was found. Install one with: "
                f"{INSTALL_HINTS[Provider.CPU]}"
            )
        provider = candidates[0]
    if provider in GPU_PROVIDERS and provider in listed_providers() and provider not in installed:
        raise ProviderUnavailableError(
            f"provider={provider.value!r} runs on torch CUDA tensors, but {torch_cuda_problem()}. "
            "Install a CUDA build of torch (https://pytorch.org/get-started/locally/) on a machine "
            "with an NVIDIA GPU, or pass fallback=True to optimize()."
        )
    if provider not in installed:
        runtime = (
            "OpenVINO"
            if provider is Provider.OPENVINO
            else f"ONNX Runtime's {ORT_PROVIDER_NAMES[provider]}"
        )
        raise ProviderUnavailableError(
            f"provider={provider.value!r} needs {runtime}, which is not available here. "
            f"Install it with: {INSTALL_HINTS[provider]}"
        )
    check_supported(provider, config.precision)
    if provider is Provider.OPENVINO:  # bf16 needs the CPU's bf16 units: say so before exporting
        from .openvino_runtime import check_precision  # it imports this module

        check_precision(config.precision)
    return ResolvedProvider(
        provider=provider,
        precision=config.precision,
        ort_providers=(ORT_PROVIDER_NAMES[provider],) if provider in ORT_PROVIDER_NAMES else (),
    )
