"""The shape of an encoder, read from the encoder itself.

curated-transformers does not keep its config object on the module, so every
dimension is read from the module's own layers (embedding tables, linear
layers, layer norms, activation modules). Nothing is assumed: the head width
need not be 64, the feed-forward width need not be four times the hidden
width, and the padding index differs by model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from curated_transformers.models.activations import GeluNew
from curated_transformers.models.bert.embeddings import BertEmbeddings
from curated_transformers.models.bert.layer import BertEncoderLayer

from ..errors import UnsupportedArchitectureError


@dataclass(frozen=True)
class EncoderSpec:
    """Dimensions and hyper-parameters of a BERT-like encoder."""

    family: str
    vocab_size: int
    hidden_width: int
    num_attention_heads: int
    intermediate_width: int
    num_hidden_layers: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int
    padding_idx: int
    model_max_length: int

    @property
    def head_width(self) -> int:
        return self.hidden_width // self.num_attention_heads

    @property
    def output_names(self) -> tuple[str, ...]:
        """ONNX output names: the embedding output, then each layer's hidden state."""
        return tuple(f"hidden_state_{i}" for i in range(self.num_hidden_layers + 1))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def activation_name(module: torch.nn.Module) -> str:
    """The Hugging Face name of a curated feed-forward activation."""
    if type(module) is torch.nn.GELU:
        return {"none": "gelu", "tanh": "gelu_pytorch_tanh"}[module.approximate]
    names = {torch.nn.ReLU: "relu", GeluNew: "gelu_new"}
    try:
        return names[type(module)]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"Unsupported feed-forward activation {type(module).__name__}. Supported: "
            "GELU (exact or tanh), ReLU and gelu_new."
        ) from None


def _single_value(values: set[Any], what: str) -> Any:
    if len(values) != 1:
        raise UnsupportedArchitectureError(
            f"The encoder's layers disagree on {what} ({sorted(values)}); a Hugging Face model "
            "has one value for all layers, so this encoder cannot be converted. Keep this "
            "component on PyTorch (do not optimize this pipeline), or report its config."
        )
    return values.pop()


def read_bert_like_spec(
    *,
    family: str,
    embeddings: BertEmbeddings,
    layers: torch.nn.ModuleList,
    padding_idx: int,
    model_max_length: int,
) -> EncoderSpec:
    """Read the spec shared by BERT and RoBERTa: BERT embeddings and BERT layers."""
    if embeddings.projection is not None:
        raise UnsupportedArchitectureError(
            f"This {family} encoder projects its embeddings "
            f"({embeddings.word_embeddings.embedding_dim} -> "
            f"{embeddings.projection.out_features}), which Hugging Face's {family} model cannot "
            "represent; keep this pipeline on PyTorch, or report its config."
        )
    stack: list[BertEncoderLayer] = list(layers)
    if not stack:
        raise UnsupportedArchitectureError(
            f"This {family} encoder has no layers, so there is nothing to accelerate; keep the "
            "pipeline on PyTorch."
        )
    hidden = embeddings.word_embeddings.embedding_dim
    eps = {embeddings.layer_norm.eps}
    eps |= {layer.attn_output_layernorm.eps for layer in stack}
    eps |= {layer.ffn_output_layernorm.eps for layer in stack}
    return EncoderSpec(
        family=family,
        vocab_size=embeddings.word_embeddings.num_embeddings,
        hidden_width=_single_value({layer.mha.model_dim for layer in stack} | {hidden}, "width"),
        num_attention_heads=_single_value({layer.mha.num_heads for layer in stack}, "heads"),
        intermediate_width=_single_value(
            {layer.ffn.intermediate.out_features for layer in stack}, "feed-forward width"
        ),
        num_hidden_layers=len(stack),
        hidden_act=_single_value({activation_name(layer.ffn.activation) for layer in stack}, "act"),
        layer_norm_eps=_single_value(eps, "layer-norm epsilon"),
        max_position_embeddings=embeddings.position_embeddings.num_embeddings,
        type_vocab_size=embeddings.token_type_embeddings.num_embeddings,
        padding_idx=int(padding_idx),
        model_max_length=int(model_max_length),
    )
