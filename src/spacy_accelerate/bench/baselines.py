"""The ways a user could run a pipeline, as interchangeable benchmark variants.

A benchmark is only honest against the alternatives a user would otherwise
pick: PyTorch fp32, PyTorch bf16 autocast on a CPU that has bf16 units,
PyTorch fp16 autocast on a GPU, and this library with each provider and
precision. Every variant switches one ``Language`` object in place
(``apply``), so they can be alternated in one process.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from spacy.language import Language

from spacy_accelerate.api import optimize, restore
from spacy_accelerate.backends.registry import check_provider
from spacy_accelerate.errors import InvalidOptionError, ProviderUnavailableError
from spacy_accelerate.options.config import SERVED, Precision, Provider
from spacy_accelerate.options.request import build_config
from spacy_accelerate.pipeline.autocast import AutocastModule
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.shim import find_shim


class Variant(ABC):
    """One way to run the pipeline's transformer."""

    @abstractmethod
    def apply(self, nlp: Language) -> None:
        """Switch ``nlp`` to this variant (from any other)."""

    def describe(self) -> dict[str, Any]:
        return {"kind": type(self).__name__}


@dataclass(frozen=True)
class PyTorch(Variant):
    """The pipeline as spaCy runs it: PyTorch fp32."""

    def apply(self, nlp: Language) -> None:
        restore(nlp)
        remove_autocast(nlp)


@dataclass(frozen=True)
class PyTorchAutocast(Variant):
    """PyTorch with autocast: bf16 on a CPU, fp16 on a GPU."""

    device_type: str = "cpu"
    dtype: str = "bfloat16"

    def apply(self, nlp: Language) -> None:
        restore(nlp)
        remove_autocast(nlp)
        for component in transformer_components(nlp):
            location = find_shim(component)
            location.shim._model = AutocastModule(
                location.shim._model, self.device_type, getattr(torch, self.dtype)
            )

    def describe(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, "device": self.device_type, "dtype": self.dtype}


def remove_autocast(nlp: Language) -> None:
    for component in transformer_components(nlp):
        location = find_shim(component)
        if isinstance(location.shim._model, AutocastModule):
            location.shim._model = location.shim._model.inner


@dataclass(frozen=True)
class Accelerated(Variant):
    """spacy-accelerate with the given ``optimize()`` options."""

    options: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, nlp: Language) -> None:
        remove_autocast(nlp)
        optimize(nlp, **self.options)

    def describe(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, **self.options}


def unavailable_reason(provider: Provider, precision: Precision) -> str | None:
    """None when this machine can run the pair, else why not (what to install, first)."""
    try:
        check_provider(build_config(provider, precision))
    except (ProviderUnavailableError, InvalidOptionError) as error:
        return str(error)
    return None


def available_variants() -> tuple[dict[str, Variant], dict[str, str]]:
    """The variants this machine can run, by name, and the skipped ones with the reason."""
    variants: dict[str, Variant] = {"pytorch fp32": PyTorch()}
    skipped: dict[str, str] = {}
    if torch.cuda.is_available():
        variants["pytorch fp16 autocast (gpu)"] = PyTorchAutocast("cuda", "float16")
    else:
        skipped["pytorch fp16 autocast (gpu)"] = "no CUDA device"
    variants["pytorch bf16 autocast (cpu)"] = PyTorchAutocast("cpu", "bfloat16")
    for provider, precision in SERVED:
        name = f"accelerate {provider.value} {precision.value}"
        reason = unavailable_reason(provider, precision)
        if reason is None:
            variants[name] = Accelerated({"provider": provider.value, "precision": precision.value})
        else:
            skipped[name] = reason
    # The fastest plan that passes the gate, among every provider and precision above.
    variants["accelerate auto"] = Accelerated({"provider": "auto", "precision": "auto"})
    return variants, skipped
