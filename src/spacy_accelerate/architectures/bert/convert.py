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

from ..base import Architecture, Tensors, bert_like_state_dict
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
        # Dropout is zero because the export is for inference; the attention is
        # the eager implementation because it exports to the plain ONNX pattern
        # that ONNX Runtime's transformer optimizer recognises.
        return cls.hf_config_type(
            vocab_size=spec.vocab_size,
            hidden_size=spec.hidden_width,
            num_hidden_layers=spec.num_hidden_layers,
            num_attention_heads=spec.num_attention_heads,
            intermediate_size=spec.intermediate_width,
            hidden_act=spec.hidden_act,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            max_position_embeddings=spec.max_position_embeddings,
            type_vocab_size=spec.type_vocab_size,
            layer_norm_eps=spec.layer_norm_eps,
            pad_token_id=spec.padding_idx,
            attn_implementation="eager",
        )

    @classmethod
    def hf_state_dict(cls, encoder: torch.nn.Module, spec: EncoderSpec) -> Tensors:
        return bert_like_state_dict(
            encoder.state_dict(), spec, embeddings_prefix=cls.embeddings_prefix
        )
