"""curated ``BertEncoder`` -> Hugging Face ``BertModel``."""

from __future__ import annotations

import torch
from curated_transformers.models.bert.encoder import BertEncoder
from transformers import BertConfig, BertModel, PretrainedConfig

from ..base import Architecture, Tensors, bert_like_state_dict
from ..spec import EncoderSpec, read_bert_like_spec


class BertArchitecture(Architecture):
    encoder_type = BertEncoder
    hf_model_type = BertModel

    @classmethod
    def read_spec(cls, encoder: torch.nn.Module) -> EncoderSpec:
        assert isinstance(encoder, BertEncoder)
        return read_bert_like_spec(
            family="bert",
            embeddings=encoder.embeddings,
            layers=encoder.layers,
            padding_idx=encoder.padding_idx,
            model_max_length=encoder.max_seq_len,
        )

    @classmethod
    def hf_config(cls, spec: EncoderSpec) -> PretrainedConfig:
        return BertConfig(**hf_bert_config_kwargs(spec))

    @classmethod
    def hf_state_dict(cls, encoder: torch.nn.Module, spec: EncoderSpec) -> Tensors:
        return bert_like_state_dict(encoder.state_dict(), spec, embeddings_prefix="embeddings.")


def hf_bert_config_kwargs(spec: EncoderSpec) -> dict[str, object]:
    """Config arguments shared by Hugging Face's BERT-like models.

    Dropout is zero because the export is for inference; the attention is the
    eager implementation because it exports to the plain ONNX pattern that
    ONNX Runtime's transformer optimizer recognises.
    """
    return {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_width,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "intermediate_size": spec.intermediate_width,
        "hidden_act": spec.hidden_act,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": spec.max_position_embeddings,
        "type_vocab_size": spec.type_vocab_size,
        "layer_norm_eps": spec.layer_norm_eps,
        "pad_token_id": spec.padding_idx,
        "attn_implementation": "eager",
    }
