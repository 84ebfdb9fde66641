"""What every backend needs to say where it runs: a resolved provider, and its optional
runtime package imported or explained (which extra installs it).

Which provider serves a request (``auto``, availability, fallback) is decided by
:mod:`spacy_accelerate.backends.registry`, the one place that knows every backend.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from spacy_accelerate.errors import ProviderUnavailableError
from spacy_accelerate.options.config import Precision, Provider


@dataclass(frozen=True)
class ResolvedProvider:
    """A concrete, installed provider (``auto`` resolved) and the precision it serves;
    what the runtime itself is asked for is its backend's business."""

    provider: Provider
    precision: Precision


def import_runtime(module: str, what: str, install: str) -> ModuleType:
    """Import an optional runtime package, or say what installs it (``install``)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ProviderUnavailableError(
            f"{what} is not installed ({error}). Install it with: {install}"
        ) from error


def torch_cuda_problem() -> str | None:
    """Why torch cannot hold CUDA tensors here, or None. The GPU providers exchange
    torch CUDA tensors with spaCy, so they need a CUDA build of torch and a GPU."""
    import torch

    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    return f"torch {torch.__version__} sees no CUDA device (check nvidia-smi, CUDA_VISIBLE_DEVICES)"
