"""Hugging Face models held by spacy-transformers: exported as they are.

spacy-transformers' shim holds a Hugging Face ``PreTrainedModel``, so there
are no weights to remap; the model is rebuilt with the eager attention (the
plain pattern ONNX Runtime's optimizer fuses) and loaded strictly with the
same tensors. The families differ only in what their config calls things
and in whether they have a pooler or token types, which is what
:class:`HuggingFaceFamily` records.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import (
    AlbertModel,
    BertModel,
    CamembertModel,
    DistilBertModel,
    ElectraModel,
    PretrainedConfig,
    PreTrainedModel,
    RobertaModel,
    XLMRobertaModel,
)
from transformers.utils import ModelOutput

from spacy_accelerate.architectures.base import Architecture, Tensors, module_device
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.errors import ConversionError, UnsupportedArchitectureError

if TYPE_CHECKING:  # the inputs module imports this package
    from spacy_accelerate.architectures.inputs import EncoderInputs


@dataclass(frozen=True)
class HuggingFaceFamily:
    """How one Hugging Face model class names its dimensions."""

    family: str
    intermediate: str = "intermediate_size"
    activation: str = "hidden_act"
    #: None where the model hard-codes its epsilon (DistilBERT: 1e-12).
    layer_norm_eps: str | None = "layer_norm_eps"
    #: None where the model has no token types (DistilBERT).
    type_vocab_size: str | None = "type_vocab_size"
    #: None where the embeddings are as wide as the hidden states.
    embedding_size: str | None = None
    #: Whether the constructor takes ``add_pooling_layer`` (models that may have a pooler).
    optional_pooler: bool = True
    #: Whether positions count from ``pad_token_id + 1`` (RoBERTa's scheme) rather than 0.
    positions_after_padding: bool = False


#: Supported Hugging Face classes (dispatch is on the exact class).
HF_FAMILIES: dict[type[PreTrainedModel], HuggingFaceFamily] = {
    BertModel: HuggingFaceFamily("bert"),
    RobertaModel: HuggingFaceFamily("roberta", positions_after_padding=True),
    XLMRobertaModel: HuggingFaceFamily("xlm-roberta", positions_after_padding=True),
    CamembertModel: HuggingFaceFamily("camembert", positions_after_padding=True),
    ElectraModel: HuggingFaceFamily(
        "electra", embedding_size="embedding_size", optional_pooler=False
    ),
    AlbertModel: HuggingFaceFamily("albert", embedding_size="embedding_size"),
    DistilBertModel: HuggingFaceFamily(
        "distilbert",
        intermediate="hidden_dim",
        activation="activation",
        layer_norm_eps=None,
        type_vocab_size=None,
        optional_pooler=False,
    ),
}

#: DistilBERT's layer norms use this epsilon, fixed in its code rather than its config.
_DISTILBERT_EPS = 1e-12


def _family(model: torch.nn.Module) -> HuggingFaceFamily:
    try:
        return HF_FAMILIES[type(model)]
    except KeyError:
        supported = ", ".join(sorted(cls.__name__ for cls in HF_FAMILIES))
        raise UnsupportedArchitectureError(
            f"Hugging Face model {type(model).__name__} is not supported yet. Supported: "
            f"{supported}. Keep this pipeline on PyTorch, or report its config."
        ) from None


def _has_pooler(model: torch.nn.Module, family: HuggingFaceFamily) -> bool:
    return family.optional_pooler and getattr(model, "pooler", None) is not None


class HuggingFaceArchitecture(Architecture):
    """Every Hugging Face class of :data:`HF_FAMILIES`; the family is read per model."""

    encoder_type = PreTrainedModel
    family = "huggingface"

    @classmethod
    def read_spec(cls, encoder: torch.nn.Module) -> EncoderSpec:
        family = _family(encoder)
        config: PretrainedConfig = encoder.config
        if config.output_attentions:
            raise UnsupportedArchitectureError(
                "The transformer's config asks for attention weights (output_attentions = true); "
                "the accelerated model computes attention in fused kernels that do not return "
                "them. Set output_attentions to false in the transformer_config, or keep this "
                "pipeline on PyTorch."
            )
        hidden = int(config.hidden_size)
        eps_name, types_name, emb_name = (
            family.layer_norm_eps,
            family.type_vocab_size,
            family.embedding_size,
        )
        padding_idx = int(config.pad_token_id if config.pad_token_id is not None else 0)
        return EncoderSpec(
            family=family.family,
            vocab_size=int(config.vocab_size),
            hidden_width=hidden,
            num_attention_heads=int(config.num_attention_heads),
            intermediate_width=int(getattr(config, family.intermediate)),
            num_hidden_layers=int(config.num_hidden_layers),
            hidden_act=str(getattr(config, family.activation)),
            layer_norm_eps=float(getattr(config, eps_name) if eps_name else _DISTILBERT_EPS),
            max_position_embeddings=int(config.max_position_embeddings),
            type_vocab_size=int(getattr(config, types_name)) if types_name else 0,
            padding_idx=padding_idx,
            model_max_length=int(config.max_position_embeddings),
            embedding_width=int(getattr(config, emb_name)) if emb_name else hidden,
            num_hidden_groups=int(getattr(config, "num_hidden_groups", 1)),
            inner_group_num=int(getattr(config, "inner_group_num", 1)),
            has_pooler=_has_pooler(encoder, family),
            position_offset=padding_idx + 1 if family.positions_after_padding else 0,
        )

    @classmethod
    def hf_config(cls, spec: EncoderSpec) -> PretrainedConfig:  # pragma: no cover - unused
        raise NotImplementedError("Hugging Face models keep their own config.")

    @classmethod
    def hf_state_dict(cls, encoder: torch.nn.Module, spec: EncoderSpec) -> Tensors:
        return {name: tensor.detach() for name, tensor in encoder.state_dict().items()}

    @classmethod
    def to_hugging_face(cls, encoder: torch.nn.Module, spec: EncoderSpec) -> PreTrainedModel:
        """A float32 copy of ``encoder`` with eager attention and the very same tensors."""
        family = _family(encoder)
        config: Any = copy.deepcopy(encoder.config)
        config._attn_implementation = "eager"
        kwargs: dict[str, Any] = {"add_pooling_layer": spec.has_pooler}
        model = type(encoder)(config, **kwargs) if family.optional_pooler else type(encoder)(config)
        try:
            model.load_state_dict(cls.hf_state_dict(encoder, spec), strict=True)
        except RuntimeError as error:
            raise ConversionError(
                f"Could not copy the {spec.family} model's weights into a fresh "
                f"{type(encoder).__name__}: {error}. Please report this with your transformers "
                "version."
            ) from error
        return model.float().eval()

    @classmethod
    def reference_outputs(
        cls, module: torch.nn.Module, inputs: EncoderInputs, spec: EncoderSpec
    ) -> list[np.ndarray]:
        device = module_device(module)
        kwargs = {name: tensor.to(device) for name, tensor in inputs.as_torch(spec).items()}
        with torch.no_grad():
            output: ModelOutput = module(**kwargs, output_hidden_states=True, return_dict=True)
        tensors = list(output.hidden_states)
        if spec.has_pooler:
            tensors.append(output.pooler_output)
        return [tensor.detach().cpu().float().numpy() for tensor in tensors]
