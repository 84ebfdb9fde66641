"""curated ``BertEncoder`` -> Hugging Face ``BertModel``.

BERT is also the base of the other BERT-like families: they share the layer
stack and differ in where the embeddings live and in the Hugging Face classes.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from curated_transformers.models.bert.embeddings import BertEmbeddings
from curated_transformers.models.bert.encoder import BertEncoder
from transformers import BertConfig, BertModel, PretrainedConfig

from ..base import Architecture, Tensors, bert_like_config_kwargs, bert_like_state_dict
from ..spec import EncoderSpec, read_bert_like_spec


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
        return read_bert_like_spec(
            family=cls.family,
            embeddings=cls.embeddings(encoder),
            layers=encoder.layers,
            padding_idx=encoder.padding_idx,
            model_max_length=encoder.max_seq_len,
        )

    @classmethod
    def hf_config(cls, spec: EncoderSpec) -> PretrainedConfig:
        return cls.hf_config_type(**bert_like_config_kwargs(spec))

    @classmethod
    def hf_state_dict(cls, encoder: torch.nn.Module, spec: EncoderSpec) -> Tensors:
        return bert_like_state_dict(
            encoder.state_dict(), spec, embeddings_prefix=cls.embeddings_prefix
        )
