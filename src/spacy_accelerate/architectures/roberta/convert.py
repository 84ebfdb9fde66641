"""curated ``RobertaEncoder`` -> Hugging Face ``RobertaModel``.

RoBERTa is BERT with position ids counted from ``padding_idx + 1`` over the
non-padding pieces; Hugging Face computes them from ``pad_token_id`` exactly
as curated-transformers does, so only the embeddings' place differs.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from curated_transformers.models.bert.embeddings import BertEmbeddings
from curated_transformers.models.roberta.encoder import RobertaEncoder
from transformers import RobertaConfig, RobertaModel

from ...errors import UnsupportedArchitectureError
from ..bert.convert import BertArchitecture
from ..spec import EncoderSpec


class RobertaArchitecture(BertArchitecture):
    encoder_type = RobertaEncoder
    hf_model_type = RobertaModel
    hf_config_type = RobertaConfig
    family = "roberta"
    embeddings_prefix = "embeddings.inner."

    @classmethod
    def embeddings(cls, encoder: torch.nn.Module) -> BertEmbeddings:
        return encoder.embeddings.inner

    @classmethod
    def read_spec(cls, encoder: torch.nn.Module) -> EncoderSpec:
        if encoder.embeddings.padding_idx != encoder.padding_idx:
            raise UnsupportedArchitectureError(
                f"The RoBERTa encoder pads with {encoder.padding_idx} but counts positions from "
                f"{encoder.embeddings.padding_idx}; Hugging Face RoBERTa cannot represent that."
            )
        return replace(super().read_spec(encoder), position_offset=encoder.padding_idx + 1)
