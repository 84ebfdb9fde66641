"""curated ``RobertaEncoder`` -> Hugging Face ``RobertaModel``.

RoBERTa is BERT with position ids counted from ``padding_idx + 1`` over the
non-padding pieces; Hugging Face computes them from ``pad_token_id`` exactly
as curated-transformers does, so only the embeddings' place differs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from curated_transformers.models.bert.embeddings import BertEmbeddings
from curated_transformers.models.roberta.encoder import RobertaEncoder
from transformers import RobertaConfig, RobertaModel

from spacy_accelerate.architectures.bert.convert import BertArchitecture
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.errors import UnsupportedArchitectureError


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
        curated: Any = encoder  # curated-transformers ships no type information
        if curated.embeddings.padding_idx != curated.padding_idx:
            raise UnsupportedArchitectureError(
                f"The RoBERTa encoder pads with {curated.padding_idx} but counts positions from "
                f"{curated.embeddings.padding_idx}; Hugging Face RoBERTa cannot represent that."
            )
        return replace(super().read_spec(encoder), position_offset=curated.padding_idx + 1)
