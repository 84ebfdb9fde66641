"""An ALBERT architecture whose layer groups may hold more than one layer.

curated-transformers' ``AlbertEncoder`` supports ``inner_group_num`` (layers per shared group),
but ``spacy-curated-transformers.AlbertTransformer.v1`` does not expose it and always builds
one layer per group.  A sample that exercises inner layers therefore needs this architecture:
the same construction as the upstream one with that one extra parameter.  It is registered
when ``spacy_accelerate_samples`` is imported, which must happen before ``spacy.load`` of a
pipeline that uses it (:func:`~spacy_accelerate_samples.load_sample` does this).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from curated_transformers.models.albert import AlbertConfig, AlbertEncoder
from spacy.util import SimpleFrozenDict, registry
from spacy_curated_transformers.models.architectures import (
    _pytorch_encoder,
    _torchscript_encoder,
    build_transformer_or_listener_wrapper_v1,
)
from thinc.api import Model

ALBERT_ARCHITECTURE = "spacy-accelerate.samples.AlbertTransformer.v1"
_NO_GRAD_SCALER_CONFIG: dict[str, Any] = SimpleFrozenDict()


@registry.architectures(ALBERT_ARCHITECTURE)
def build_albert_transformer_model(
    *,
    vocab_size: int,
    with_spans: Callable[[Model], Model],
    piece_encoder: Model,
    attention_probs_dropout_prob: float = 0.0,
    embedding_width: int = 128,
    hidden_act: str = "gelu_new",
    hidden_dropout_prob: float = 0.0,
    hidden_width: int = 768,
    inner_group_num: int = 1,
    intermediate_width: int = 3072,
    layer_norm_eps: float = 1e-12,
    max_position_embeddings: int = 512,
    model_max_length: int = 512,
    num_attention_heads: int = 12,
    num_hidden_groups: int = 1,
    num_hidden_layers: int = 12,
    padding_idx: int = 0,
    type_vocab_size: int = 2,
    torchscript: bool = False,
    mixed_precision: bool = False,
    grad_scaler_config: dict[str, Any] = _NO_GRAD_SCALER_CONFIG,
    wrapped_listener: Model | None = None,
) -> Model:
    """``AlbertTransformer.v1`` plus ``inner_group_num`` (layers in each shared group)."""
    config = AlbertConfig(
        embedding_width=embedding_width,
        hidden_width=hidden_width,
        inner_group_num=inner_group_num,
        intermediate_width=intermediate_width,
        num_attention_heads=num_attention_heads,
        num_hidden_groups=num_hidden_groups,
        num_hidden_layers=num_hidden_layers,
        attention_probs_dropout_prob=attention_probs_dropout_prob,
        hidden_dropout_prob=hidden_dropout_prob,
        hidden_act=hidden_act,
        vocab_size=vocab_size,
        type_vocab_size=type_vocab_size,
        max_position_embeddings=max_position_embeddings,
        model_max_length=model_max_length,
        layer_norm_eps=layer_norm_eps,
        padding_idx=padding_idx,
    )
    if torchscript:
        transformer = _torchscript_encoder(
            model_max_length=model_max_length, padding_idx=padding_idx
        )
    else:
        transformer = _pytorch_encoder(
            AlbertEncoder(config),
            hidden_width=hidden_width,
            mixed_precision=mixed_precision,
            grad_scaler_config=grad_scaler_config,
        )
    return build_transformer_or_listener_wrapper_v1(
        with_spans=with_spans,
        piece_encoder=piece_encoder,
        transformer=transformer,
        wrapped_listener=wrapped_listener,
    )
