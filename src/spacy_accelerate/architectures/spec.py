"""The shape of an encoder, read from the encoder itself.

curated-transformers does not keep its config object on the module, so every
dimension is read from the module's own layers (embedding tables, linear
layers, layer norms, activation modules). Nothing is assumed: the head width
need not be 64, the feed-forward width need not be four times the hidden
width, and the padding index differs by model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from curated_transformers.models.activations import GeluNew
from curated_transformers.models.bert.embeddings import BertEmbeddings
from curated_transformers.models.bert.layer import BertEncoderLayer

from spacy_accelerate.errors import InvalidInputError, UnsupportedArchitectureError

#: ONNX name of the pooled output (Hugging Face models with a pooler only).
POOLER_OUTPUT = "pooler_output"


def check_span_length(length: int, longest: int) -> None:
    """Refuse a row of more pieces than the model has positions. PyTorch fails on it; an
    exported graph may not (OpenVINO's Gather reads past the position table and returns
    numbers), and the served model would then annotate it silently."""
    if length > longest:
        raise InvalidInputError(
            f"A span of {length} pieces is longer than the {longest} positions this model has "
            "(PyTorch would fail on it too). Lower the transformer's span window or the "
            "tokenizer's max length in the pipeline's config."
        )


@dataclass(frozen=True)
class EncoderSpec:
    """Dimensions and hyper-parameters of a BERT-like encoder.

    ``embedding_width`` differs from ``hidden_width`` where the embeddings are
    projected (ALBERT, ELECTRA); ``num_hidden_groups`` and ``inner_group_num``
    describe ALBERT's shared layers and are 1 elsewhere. ``type_vocab_size``
    is 0 for models without token types (DistilBERT): their graph then has no
    ``token_type_ids`` input. ``has_pooler`` is true only for Hugging Face
    models whose pooled output reaches the pipeline (spacy-transformers keeps
    every field of the model output).
    """

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
    embedding_width: int = 0
    num_hidden_groups: int = 1
    inner_group_num: int = 1
    has_pooler: bool = False
    #: Positions before the first piece's: RoBERTa, XLM-R and CamemBERT count from
    #: ``padding_idx + 1``; BERT, ALBERT, ELECTRA and DistilBERT from 0.
    position_offset: int = 0

    @property
    def head_width(self) -> int:
        return self.hidden_width // self.num_attention_heads

    @property
    def longest_input(self) -> int:
        """The most pieces one row may hold: one per position after the offset."""
        return self.max_position_embeddings - self.position_offset

    def check_length(self, length: int) -> None:
        """Refuse a row longer than :attr:`longest_input` (see :func:`check_span_length`)."""
        check_span_length(length, self.longest_input)

    @property
    def input_names(self) -> tuple[str, ...]:
        """ONNX input names; ``token_type_ids`` only where the model has token types."""
        names = ("input_ids", "attention_mask")
        return (*names, "token_type_ids") if self.type_vocab_size > 0 else names

    @property
    def hidden_state_names(self) -> tuple[str, ...]:
        """The embedding output, then each layer's hidden state."""
        return tuple(f"hidden_state_{i}" for i in range(self.num_hidden_layers + 1))

    @property
    def output_names(self) -> tuple[str, ...]:
        """Every ONNX output: the hidden states, then the pooled output if there is one."""
        pooled = (POOLER_OUTPUT,) if self.has_pooler else ()
        return (*self.hidden_state_names, *pooled)

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
    layers: Sequence[BertEncoderLayer],
    padding_idx: int,
    model_max_length: int,
    num_hidden_layers: int | None = None,
    num_hidden_groups: int = 1,
    inner_group_num: int = 1,
    projected: bool = False,
) -> EncoderSpec:
    """Read the spec of BERT embeddings followed by BERT layers (BERT, RoBERTa, ALBERT).

    ``layers`` are the distinct layer modules; ALBERT applies them
    ``num_hidden_layers`` times in total, hence the separate count.
    """
    if (embeddings.projection is not None) != projected:
        raise UnsupportedArchitectureError(
            f"This {family} encoder "
            + ("projects" if embeddings.projection is not None else "does not project")
            + f" its embeddings, which Hugging Face's {family} model cannot represent; keep this "
            "pipeline on PyTorch, or report its config."
        )
    stack: list[BertEncoderLayer] = list(layers)
    if not stack:
        raise UnsupportedArchitectureError(
            f"This {family} encoder has no layers, so there is nothing to accelerate; keep the "
            "pipeline on PyTorch."
        )
    embedding_width = embeddings.word_embeddings.embedding_dim
    hidden = (
        embeddings.projection.out_features if embeddings.projection is not None else embedding_width
    )
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
        num_hidden_layers=len(stack) if num_hidden_layers is None else num_hidden_layers,
        hidden_act=_single_value({activation_name(layer.ffn.activation) for layer in stack}, "act"),
        layer_norm_eps=_single_value(eps, "layer-norm epsilon"),
        max_position_embeddings=embeddings.position_embeddings.num_embeddings,
        type_vocab_size=embeddings.token_type_embeddings.num_embeddings,
        padding_idx=int(padding_idx),
        model_max_length=int(model_max_length),
        embedding_width=embedding_width,
        num_hidden_groups=num_hidden_groups,
        inner_group_num=inner_group_num,
    )
