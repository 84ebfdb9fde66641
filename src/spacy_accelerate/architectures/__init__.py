"""Step 3: detect the encoder's architecture from its class.

Dispatch is on types: the shim's module is either a curated-transformers
``CuratedTransformer`` (spacy-curated-transformers), dispatched further on
its encoder class, or a Hugging Face ``PreTrainedModel`` (spacy-transformers),
dispatched on the model class. The dimensions come from the encoder's own
layers or config (see :mod:`.spec`), never from guesses.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import singledispatch

import torch
from curated_transformers.models.curated_transformer import CuratedTransformer
from transformers import PreTrainedModel

from spacy_accelerate.architectures.albert import AlbertArchitecture
from spacy_accelerate.architectures.base import Architecture
from spacy_accelerate.architectures.bert import BertArchitecture
from spacy_accelerate.architectures.huggingface import HF_FAMILIES, HuggingFaceArchitecture
from spacy_accelerate.architectures.roberta import RobertaArchitecture
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.errors import UnsupportedArchitectureError

#: Supported curated families, keyed by the curated encoder class. RoBERTa's
#: encoder also carries XLM-R and CamemBERT, which differ only in their pieces.
ARCHITECTURES: dict[type[torch.nn.Module], type[Architecture]] = {
    arch.encoder_type: arch for arch in (AlbertArchitecture, BertArchitecture, RobertaArchitecture)
}


@dataclass(frozen=True)
class DetectedEncoder:
    """The encoder to export, its family and its spec.

    ``encoder`` is the curated encoder inside a ``CuratedTransformer``, or the
    Hugging Face model itself.
    """

    encoder: torch.nn.Module
    architecture: type[Architecture]
    spec: EncoderSpec


def supported_encoders() -> list[str]:
    curated = [encoder_type.__name__ for encoder_type in ARCHITECTURES]
    return sorted(curated + [model_type.__name__ for model_type in HF_FAMILIES])


@singledispatch
def detect_architecture(module: torch.nn.Module) -> DetectedEncoder:
    """Identify the encoder inside ``module`` (a thinc shim's ``_model``)."""
    if isinstance(module, torch.jit.ScriptModule):
        raise UnsupportedArchitectureError(
            "The transformer was loaded as TorchScript, which spacy-accelerate cannot convert. "
            "Load the pipeline with its PyTorch weights (torchscript = false in the config)."
        )
    raise UnsupportedArchitectureError(
        f"Expected a curated-transformers CuratedTransformer or a Hugging Face model, found "
        f"{type(module).__name__}. spacy-accelerate supports these encoders: "
        f"{', '.join(supported_encoders())}."
    )


@detect_architecture.register
def _(module: CuratedTransformer) -> DetectedEncoder:
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


@detect_architecture.register
def _(module: PreTrainedModel) -> DetectedEncoder:
    return DetectedEncoder(
        encoder=module,
        architecture=HuggingFaceArchitecture,
        spec=HuggingFaceArchitecture.read_spec(module),
    )


__all__ = ["ARCHITECTURES", "Architecture", "DetectedEncoder", "EncoderSpec", "detect_architecture"]
