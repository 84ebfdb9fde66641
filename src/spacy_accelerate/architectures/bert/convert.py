"""curated ``BertEncoder`` -> Hugging Face ``BertModel``.

BERT is also the base of the other BERT-like families: they share the layer
stack and differ in where the embeddings live and in the Hugging Face classes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from curated_transformers.models.bert.embeddings import BertEmbeddings
from curated_transformers.models.bert.encoder import BertEncoder
from transformers import BertConfig, BertModel, PretrainedConfig

from spacy_accelerate.architectures.base import (
    Architecture,
    Tensors,
    bert_like_config_kwargs,
    bert_like_state_dict,
)
from spacy_accelerate.architectures.spec import EncoderSpec, read_bert_like_spec


class BertArchitecture(Architecture):
    encoder_type = BertEncoder
    hf_model_type = BertModel
    hf_config_type: ClassVar[type[PretrainedConfig]] = BertConfig
    family: ClassVar[str] = "bert"
    #: Where the family's BERT embeddings sit in the curated state dict.
    embeddings_prefix: ClassVar[str] = "embeddings."

    @classmethod
    def embeddings(cls, encoder: torch.nn.Module) -> BertEmbeddings:
        return encoder.embeddings

    @classmethod
    def read_spec(cls, encoder: torch.nn.Module) -> EncoderSpec:
        curated: Any = encoder  # curated-transformers ships no type information
        return read_bert_like_spec(
            family=cls.family,
            embeddings=cls.embeddings(encoder),
            layers=curated.layers,
            padding_idx=curated.padding_idx,
            model_max_length=curated.max_seq_len,
        )

    @classmethod
    def hf_config(cls, spec: EncoderSpec) -> PretrainedConfig:
        return cls.hf_config_type(**bert_like_config_kwargs(spec))

    @classmethod
    def hf_state_dict(cls, encoder: torch.nn.Module, spec: EncoderSpec) -> Tensors:
        return bert_like_state_dict(
            encoder.state_dict(), spec, embeddings_prefix=cls.embeddings_prefix
        )
