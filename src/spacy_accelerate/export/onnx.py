"""Step 6 (build half): Hugging Face model -> ONNX file with every hidden state.

The exported graph takes ``input_ids``, ``attention_mask`` and (where the
model has token types) ``token_type_ids`` with dynamic batch and sequence
axes and returns the embedding output followed by every layer's hidden state
(and the pooled output where the model has a pooler), so one file serves
both last-layer and all-layer listeners. Each backend then makes the
file it serves of it (``backends/``).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from transformers import PreTrainedModel

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import POOLER_OUTPUT, EncoderSpec
from spacy_accelerate.errors import ConversionError

MODEL_FILE = "model.onnx"
#: Bumped whenever conversion or export changes what is written, so that
#: entries made by older code (even of the same release) are not reused.
EXPORT_FORMAT_VERSION = 3


class _AllOutputs(torch.nn.Module):
    """Adapts a Hugging Face encoder to positional inputs and a flat tuple of outputs."""

    def __init__(self, model: PreTrainedModel, spec: EncoderSpec) -> None:
        super().__init__()
        self.model = model
        self.input_names = spec.input_names
        self.has_pooler = spec.has_pooler

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kwargs = dict(zip(self.input_names, inputs, strict=True))
        output = self.model(**kwargs, output_hidden_states=True, return_dict=True)
        pooled = (output.pooler_output,) if self.has_pooler else ()
        return (*output.hidden_states, *pooled)


def _example_inputs(spec: EncoderSpec) -> tuple[torch.Tensor, ...]:
    # Two rows of different lengths, so that the traced graph keeps the mask path.
    length = min(8, spec.longest_input)
    ids = EncoderInputs.uniform(spec, 2, length).input_ids
    ids[1, length // 2 :] = spec.padding_idx
    inputs = EncoderInputs.from_ids(ids, spec.padding_idx).as_torch(spec)
    return tuple(inputs.values())


def export_onnx(model: PreTrainedModel, spec: EncoderSpec, path: Path, *, opset: int) -> None:
    """Trace ``model`` to an ONNX file at ``path``."""
    axes = {0: "batch", 1: "sequence"}
    dynamic_axes = {name: axes for name in (*spec.input_names, *spec.hidden_state_names)}
    if spec.has_pooler:
        dynamic_axes[POOLER_OUTPUT] = {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                _AllOutputs(model, spec).eval(),
                _example_inputs(spec),
                str(path),
                input_names=list(spec.input_names),
                output_names=list(spec.output_names),
                dynamic_axes=dynamic_axes,
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
        except Exception as error:  # the exporter raises many unrelated types
            raise ConversionError(
                f"Exporting the {spec.family} encoder to ONNX failed: {error}. Please report this "
                "with your torch and transformers versions."
            ) from error
    # Imported here: onnx costs about a second, which loading a built model never needs.
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as error:
        raise ConversionError(
            f"The exported {spec.family} model is not valid ONNX: {error}. Please report this "
            "with your torch and onnx versions."
        ) from error
