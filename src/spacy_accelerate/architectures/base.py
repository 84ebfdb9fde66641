"""What every supported encoder family provides: its spec and its conversion.

One subclass per family, beside the family's own folder, in the manner of
curated-transformers: the family reads its :class:`EncoderSpec` from the
curated encoder and maps the curated weights onto the Hugging Face model of
the same family, which is what gets exported to ONNX.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from transformers import PretrainedConfig, PreTrainedModel

from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.errors import ConversionError

if TYPE_CHECKING:  # the inputs module imports this package
    from spacy_accelerate.architectures.inputs import EncoderInputs

Tensors = dict[str, torch.Tensor]

# curated BERT-layer parameter -> Hugging Face BERT-layer parameter. The
# combined attention input (query, key and value stacked) is split separately.
_LAYER_RENAMES = {
    "mha.output": "attention.output.dense",
    "attn_output_layernorm": "attention.output.LayerNorm",
    "ffn.intermediate": "intermediate.dense",
    "ffn.output": "output.dense",
    "ffn_output_layernorm": "output.LayerNorm",
}
_EMBEDDING_RENAMES = {
    "word_embeddings": "word_embeddings",
    "token_type_embeddings": "token_type_embeddings",
    "position_embeddings": "position_embeddings",
    "layer_norm": "LayerNorm",
}


class Architecture(ABC):
    """A supported encoder family: how to read its spec and produce the model to export."""

    #: The encoder class this family converts (dispatch is on this type).
    encoder_type: ClassVar[type[torch.nn.Module]]
    #: Hugging Face model class of the same family.
    hf_model_type: ClassVar[type[PreTrainedModel]]
    #: Short name, recorded in the spec and the cache manifest.
    family: ClassVar[str]

    @classmethod
    @abstractmethod
    def read_spec(cls, encoder: torch.nn.Module) -> EncoderSpec:
        """Read the encoder's dimensions from its layers."""

    @classmethod
    @abstractmethod
    def hf_config(cls, spec: EncoderSpec) -> PretrainedConfig:
        """The Hugging Face config describing the same network."""

    @classmethod
    @abstractmethod
    def hf_state_dict(cls, encoder: torch.nn.Module, spec: EncoderSpec) -> Tensors:
        """The encoder's weights under Hugging Face names, every tensor accounted for."""

    @classmethod
    def to_hugging_face(cls, encoder: torch.nn.Module, spec: EncoderSpec) -> PreTrainedModel:
        """Build the Hugging Face model and load the mapped weights strictly."""
        model = cls.hf_model_type(cls.hf_config(spec), add_pooling_layer=False)
        try:
            model.load_state_dict(cls.hf_state_dict(encoder, spec), strict=True)
        except RuntimeError as error:
            raise ConversionError(
                f"The converted {spec.family} weights do not fit Hugging Face's "
                f"{cls.hf_model_type.__name__}: {error}. Please report this with the pipeline's "
                "config."
            ) from error
        return model.eval()

    @classmethod
    def reference_outputs(
        cls, module: torch.nn.Module, inputs: EncoderInputs, spec: EncoderSpec
    ) -> list[np.ndarray]:
        """What the shim's PyTorch module returns for ``inputs``, called the way spaCy calls it.

        spacy-curated-transformers passes the padded piece ids alone and the
        module masks every ``padding_idx`` piece itself.
        """
        with torch.no_grad():
            output = module(torch.from_numpy(inputs.input_ids).to(module_device(module)))
        return [tensor.detach().cpu().float().numpy() for tensor in output.all_outputs]


def module_device(module: torch.nn.Module) -> torch.device:
    """Where ``module``'s weights are (the GPU under ``spacy.require_gpu()``)."""
    first = next(module.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


class TensorTaker:
    """Hands out the curated tensors by name and remembers which were used."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        self._remaining = {name: tensor.detach() for name, tensor in state.items()}

    def take(self, name: str) -> torch.Tensor:
        try:
            return self._remaining.pop(name)
        except KeyError:
            raise ConversionError(
                f"The encoder has no weight {name!r}, which its architecture requires. Was the "
                "pipeline built with an unusual encoder? Please report its config."
            ) from None

    def assert_all_taken(self) -> None:
        if self._remaining:
            raise ConversionError(
                "These encoder weights have no place in the converted model, so converting "
                f"would drop them: {sorted(self._remaining)}. Please report the pipeline's config."
            )


def bert_like_config_kwargs(spec: EncoderSpec) -> dict[str, object]:
    """Hugging Face config arguments shared by the BERT-like families.

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


def take_embeddings(taker: TensorTaker, prefix: str) -> Tensors:
    """Curated BERT embeddings under ``prefix`` -> Hugging Face ``embeddings.*`` names."""
    out: Tensors = {}
    for curated, hf in _EMBEDDING_RENAMES.items():
        for param in ("weight", "bias") if curated == "layer_norm" else ("weight",):
            out[f"embeddings.{hf}.{param}"] = taker.take(f"{prefix}{curated}.{param}")
    return out


def take_split_qkv(taker: TensorTaker, layer: str, attention: str) -> Tensors:
    """Split a curated layer's stacked query/key/value projection into Hugging Face's three."""
    out: Tensors = {}
    for param in ("weight", "bias"):
        query, key, value = taker.take(f"{layer}.mha.input.{param}").chunk(3, dim=0)
        out[f"{attention}.query.{param}"] = query
        out[f"{attention}.key.{param}"] = key
        out[f"{attention}.value.{param}"] = value
    return out


def bert_like_state_dict(
    state: Mapping[str, torch.Tensor], spec: EncoderSpec, *, embeddings_prefix: str
) -> Tensors:
    """Map curated BERT-style weights (embeddings + BERT layers) to Hugging Face names.

    ``embeddings_prefix`` is where the family keeps its BERT embeddings
    (``embeddings.`` for BERT, ``embeddings.inner.`` for RoBERTa).
    """
    taker = TensorTaker(state)
    out = take_embeddings(taker, embeddings_prefix)
    for i in range(spec.num_hidden_layers):
        src, dst = f"layers.{i}", f"encoder.layer.{i}"
        out.update(take_split_qkv(taker, src, f"{dst}.attention.self"))
        for param in ("weight", "bias"):
            for curated, hf in _LAYER_RENAMES.items():
                out[f"{dst}.{hf}.{param}"] = taker.take(f"{src}.{curated}.{param}")
    taker.assert_all_taken()
    return out
