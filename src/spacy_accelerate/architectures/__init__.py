"""Step 3: detect the encoder's architecture from its class.

Dispatch is on the curated encoder's type; the dimensions come from the
encoder's own layers (see :mod:`.spec`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from curated_transformers.models.curated_transformer import CuratedTransformer

from ..errors import UnsupportedArchitectureError
from .base import Architecture
from .bert import BertArchitecture
from .roberta import RobertaArchitecture
from .spec import EncoderSpec

#: Supported families, keyed by the curated encoder class.
ARCHITECTURES: dict[type[torch.nn.Module], type[Architecture]] = {
    arch.encoder_type: arch for arch in (BertArchitecture, RobertaArchitecture)
}


@dataclass(frozen=True)
class DetectedEncoder:
    """A curated encoder together with its family and spec."""

    encoder: torch.nn.Module
    architecture: type[Architecture]
    spec: EncoderSpec


def supported_encoders() -> list[str]:
    return sorted(encoder_type.__name__ for encoder_type in ARCHITECTURES)


def detect_architecture(module: torch.nn.Module) -> DetectedEncoder:
    """Identify the curated encoder inside ``module`` (a thinc shim's ``_model``)."""
    if isinstance(module, torch.jit.ScriptModule):
        raise UnsupportedArchitectureError(
            "The transformer was loaded as TorchScript, which spacy-accelerate cannot convert. "
            "Load the pipeline with its PyTorch weights (torchscript = false in the config)."
        )
    if not isinstance(module, CuratedTransformer):
        raise UnsupportedArchitectureError(
            f"Expected a curated-transformers CuratedTransformer, found {type(module).__name__}. "
            "spacy-accelerate supports the encoders built by spacy-curated-transformers' "
            f"architectures ({', '.join(supported_encoders())})."
        )
    encoder = module.curated_encoder
    architecture = ARCHITECTURES.get(type(encoder))
    if architecture is None:
        raise UnsupportedArchitectureError(
            f"Encoder {type(encoder).__name__} is not supported yet. Supported encoders: "
            f"{', '.join(supported_encoders())}."
        )
    return DetectedEncoder(
        encoder=encoder, architecture=architecture, spec=architecture.read_spec(encoder)
    )


__all__ = ["ARCHITECTURES", "Architecture", "DetectedEncoder", "EncoderSpec", "detect_architecture"]
