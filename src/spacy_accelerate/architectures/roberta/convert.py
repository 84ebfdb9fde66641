"""curated ``RobertaEncoder`` -> Hugging Face ``RobertaModel``.

RoBERTa is BERT with position ids counted from ``padding_idx + 1`` over the
non-padding pieces; Hugging Face computes them from ``pad_token_id`` exactly
as curated-transformers does, so only the embedding prefix differs.
"""

from __future__ import annotations

import torch
from curated_transformers.models.roberta.encoder import RobertaEncoder
from transformers import PretrainedConfig, RobertaConfig, RobertaModel

from ...errors import UnsupportedArchitectureError
from ..base import Architecture, Tensors, bert_like_state_dict
from ..bert.convert import hf_bert_config_kwargs
from ..spec import EncoderSpec, read_bert_like_spec


class RobertaArchitecture(Architecture):
    encoder_type = RobertaEncoder
    hf_model_type = RobertaModel

    @classmethod
    def read_spec(cls, encoder: torch.nn.Module) -> EncoderSpec:
        assert isinstance(encoder, RobertaEncoder)
        if encoder.embeddings.padding_idx != encoder.padding_idx:
            raise UnsupportedArchitectureError(
                f"The RoBERTa encoder pads with {encoder.padding_idx} but counts positions from "
                f"{encoder.embeddings.padding_idx}; Hugging Face RoBERTa cannot represent that."
            )
        return read_bert_like_spec(
            family="roberta",
            embeddings=encoder.embeddings.inner,
            layers=encoder.layers,
            padding_idx=encoder.padding_idx,
            model_max_length=encoder.max_seq_len,
        )

    @classmethod
    def hf_config(cls, spec: EncoderSpec) -> PretrainedConfig:
        return RobertaConfig(**hf_bert_config_kwargs(spec))

    @classmethod
    def hf_state_dict(cls, encoder: torch.nn.Module, spec: EncoderSpec) -> Tensors:
        return bert_like_state_dict(
            encoder.state_dict(), spec, embeddings_prefix="embeddings.inner."
        )
