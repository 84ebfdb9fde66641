"""curated ``AlbertEncoder`` -> Hugging Face ``AlbertModel``.

ALBERT shares its layers: ``num_hidden_groups`` groups of ``inner_group_num``
BERT layers each, every group applied ``num_hidden_layers / num_hidden_groups``
times in turn, after embeddings of their own (smaller) width projected to the
hidden width. Both libraries apply group ``i // layers_per_group`` at layer
``i`` and report one hidden state per application, so the hidden states line
up one to one; only the names differ.
"""

from __future__ import annotations

from typing import Any

import torch
from curated_transformers.models.albert.encoder import AlbertEncoder
from transformers import AlbertConfig, AlbertModel, PretrainedConfig

from spacy_accelerate.architectures.base import (
    Architecture,
    Tensors,
    TensorTaker,
    bert_like_config_kwargs,
    take_embeddings,
    take_split_qkv,
)
from spacy_accelerate.architectures.spec import EncoderSpec, read_bert_like_spec

# curated BERT-layer parameter -> Hugging Face ALBERT-layer parameter.
_LAYER_RENAMES = {
    "mha.output": "attention.dense",
    "attn_output_layernorm": "attention.LayerNorm",
    "ffn.intermediate": "ffn",
    "ffn.output": "ffn_output",
    "ffn_output_layernorm": "full_layer_layer_norm",
}


class AlbertArchitecture(Architecture):
    encoder_type = AlbertEncoder
    hf_model_type = AlbertModel
    family = "albert"

    @classmethod
    def read_spec(cls, encoder: torch.nn.Module) -> EncoderSpec:
        curated: Any = encoder  # curated-transformers ships no type information
        layers = [layer for group in curated.groups for layer in group.group_layers]
        return read_bert_like_spec(
            family=cls.family,
            embeddings=curated.embeddings,
            layers=layers,
            padding_idx=curated.padding_idx,
            model_max_length=curated.max_seq_len,
            num_hidden_layers=curated.num_hidden_layers,
            num_hidden_groups=len(curated.groups),
            inner_group_num=len(curated.groups[0].group_layers),
            projected=True,
        )

    @classmethod
    def hf_config(cls, spec: EncoderSpec) -> PretrainedConfig:
        return AlbertConfig(
            **bert_like_config_kwargs(spec),
            embedding_size=spec.embedding_width,
            num_hidden_groups=spec.num_hidden_groups,
            inner_group_num=spec.inner_group_num,
            classifier_dropout_prob=0.0,
        )

    @classmethod
    def hf_state_dict(cls, encoder: torch.nn.Module, spec: EncoderSpec) -> Tensors:
        taker = TensorTaker(encoder.state_dict())
        out = take_embeddings(taker, "embeddings.")
        for param in ("weight", "bias"):
            out[f"encoder.embedding_hidden_mapping_in.{param}"] = taker.take(
                f"embeddings.projection.{param}"
            )
        for group in range(spec.num_hidden_groups):
            for inner in range(spec.inner_group_num):
                src = f"groups.{group}.group_layers.{inner}"
                dst = f"encoder.albert_layer_groups.{group}.albert_layers.{inner}"
                out.update(take_split_qkv(taker, src, f"{dst}.attention"))
                for param in ("weight", "bias"):
                    for curated, hf in _LAYER_RENAMES.items():
                        out[f"{dst}.{hf}.{param}"] = taker.take(f"{src}.{curated}.{param}")
        taker.assert_all_taken()
        return out
