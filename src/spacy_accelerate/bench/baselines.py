"""The ways a user could run a pipeline, as interchangeable benchmark variants.

A benchmark is only honest against the alternatives a user would otherwise
pick: PyTorch fp32, PyTorch bf16 autocast on a CPU that has bf16 units,
PyTorch fp16 autocast on a GPU, and this library with each provider and
precision. Every variant switches one ``Language`` object in place
(``apply``), so they can be alternated in one process.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from spacy.language import Language

from spacy_accelerate.api import optimize, restore
from spacy_accelerate.backends.registry import check_provider
from spacy_accelerate.errors import InvalidOptionError, ProviderUnavailableError
from spacy_accelerate.options.config import Precision, Provider
from spacy_accelerate.options.providers import PROVIDERS
from spacy_accelerate.options.request import build_config
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.patch import StandIn, remove_stand_ins, stand_in
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.planning.autocast import AutocastModule


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


@dataclass(frozen=True)
class PyTorchAutocast(Variant):
    """PyTorch with autocast: bf16 on a CPU, fp16 on a GPU."""

    device_type: str = "cpu"
    dtype: str = "bfloat16"

    def apply(self, nlp: Language) -> None:
        restore(nlp)
        for component in transformer_components(nlp):
            location = find_shim(component)
            dtype = getattr(torch, self.dtype)
            stand_in(location, AutocastModule(location.shim._model, self.device_type, dtype))

    def describe(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, "device": self.device_type, "dtype": self.dtype}


class RivalModule(StandIn):
    """What a PyTorch user would run instead of the encoder ``inner`` (``run``: compiled,
    quantized), standing in the shim until the next variant puts ``inner`` back."""

    def __init__(self, inner: torch.nn.Module, run: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.run = run

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)


@dataclass(frozen=True)
class Rival(Variant):
    """A PyTorch user's own speed-up of the encoder, made once per encoder and kept, so
    that switching back to it costs nothing (its set-up is the first pass's extra time)."""

    _made: dict[int, RivalModule] = field(default_factory=dict, compare=False, repr=False)

    def apply(self, nlp: Language) -> None:
        restore(nlp)
        for component in transformer_components(nlp):
            location = find_shim(component)
            module = location.shim._model
            if id(module) not in self._made:
                self._made[id(module)] = RivalModule(module, self.make(module))
            stand_in(location, self._made[id(module)])

    @abstractmethod
    def make(self, encoder: torch.nn.Module) -> torch.nn.Module:
        """What runs in place of ``encoder``."""


@dataclass(frozen=True)
class TorchCompiled(Rival):
    """``torch.compile`` of the encoder (dynamic shapes: spaCy's batches vary in length),
    under bf16 autocast with ``bf16``."""

    bf16: bool = False

    def make(self, encoder: torch.nn.Module) -> torch.nn.Module:
        compiled = cast(torch.nn.Module, torch.compile(encoder, dynamic=True))
        return AutocastModule(compiled, "cpu", torch.bfloat16) if self.bf16 else compiled

    def describe(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, "bf16_autocast": self.bf16}


@dataclass(frozen=True)
class DynamicQuantized(Rival):
    """``torch.ao.quantization.quantize_dynamic`` of the encoder's Linear layers to int8
    (a copy: the pipeline's own weights stay float)."""

    def make(self, encoder: torch.nn.Module) -> torch.nn.Module:
        return torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(encoder), {torch.nn.Linear}, dtype=torch.qint8
        )


@dataclass(frozen=True)
class Accelerated(Variant):
    """spacy-accelerate with the given ``optimize()`` options."""

    options: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, nlp: Language) -> None:
        remove_stand_ins(nlp)  # optimize() serves the PyTorch module, not a comparison's
        optimize(nlp, **self.options)

    def describe(self) -> dict[str, Any]:
        return {"kind": type(self).__name__, **self.options}


#: What a PyTorch user would do instead of this library, by benchmark name.
RIVALS: dict[str, Variant] = {
    "pytorch torch.compile": TorchCompiled(),
    "pytorch torch.compile + bf16 autocast": TorchCompiled(bf16=True),
    "pytorch quantize_dynamic int8": DynamicQuantized(),
}


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
    variants.update(RIVALS)
    for provider, precision in PROVIDERS.served():
        name = f"accelerate {provider.value} {precision.value}"
        reason = unavailable_reason(provider, precision)
        if reason is None:
            variants[name] = Accelerated({"provider": provider.value, "precision": precision.value})
        else:
            skipped[name] = reason
    # The fastest plan that passes the gate, among every provider and precision above.
    variants["accelerate auto"] = Accelerated({"provider": "auto", "precision": "auto"})
    return variants, skipped
