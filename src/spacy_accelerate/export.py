"""Step 6 (build half): Hugging Face model -> ONNX file with every hidden state.

The exported graph takes ``input_ids``, ``attention_mask`` and (where the
model has token types) ``token_type_ids`` with dynamic batch and sequence
axes and returns the embedding output followed by every layer's hidden state
(and the pooled output where the model has a pooler), so one file serves
both last-layer and all-layer listeners. ONNX Runtime's transformer optimizer
then fuses attention, layer norms and GELU for the target provider.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from transformers import PreTrainedModel

from .architectures.spec import POOLER_OUTPUT, EncoderSpec
from .config import Precision, Provider
from .encoder_inputs import EncoderInputs
from .errors import ConversionError

logger = logging.getLogger("spacy_accelerate")

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
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as error:
        raise ConversionError(
            f"The exported {spec.family} model is not valid ONNX: {error}. Please report this "
            "with your torch and onnx versions."
        ) from error


@contextmanager
def _quiet_optimizer_logs() -> Iterator[None]:
    """ONNX Runtime's optimizer logs every fusion at INFO, and fusions it skips at WARNING,
    on the root handlers; keep it quiet: the parity gate judges the result."""
    loggers = [logging.getLogger(name) for name in ("onnx_model", "onnx_model_bert", "fusion_base")]
    loggers += [
        logging.getLogger(name)
        for name in logging.root.manager.loggerDict
        if name.startswith(("fusion_", "onnxruntime.transformers"))
    ]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


@dataclass(frozen=True)
class GraphPlan:
    """What is done to the exported graph for one provider and precision."""

    #: ONNX Runtime's transformer fusions (attention, layer norms, GELU).
    fuse: bool
    #: Fusions for the CUDA kernels rather than the CPU ones.
    for_gpu: bool = False
    #: Weights and arithmetic in half precision; inputs and outputs stay
    #: int64 / float32, so the proxy's contract does not change.
    float16: bool = False


def graph_plan(provider: Provider, precision: Precision) -> GraphPlan:
    """The plan of ``provider`` at ``precision``.

    TensorRT and OpenVINO get the plain graph: they fuse on their own and do
    not take ONNX Runtime's fused operators, and their fp16/bf16 is a build
    option, not a graph rewrite. int8 graphs are quantized unfused (see
    :mod:`spacy_accelerate.quantize`).
    """
    if provider in (Provider.TENSORRT, Provider.OPENVINO):
        return GraphPlan(fuse=False)
    if provider is Provider.CUDA:
        return GraphPlan(fuse=True, for_gpu=True, float16=precision is Precision.FP16)
    return GraphPlan(fuse=True)


def optimize_graph(path: Path, spec: EncoderSpec, plan: GraphPlan) -> None:
    """Apply ``plan`` to the model at ``path``, in place.

    The result keeps every output; a parity check afterwards decides whether
    it is served.
    """
    if not plan.fuse:
        return
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    # The default turns the mask into one length per row, which assumes that
    # padding only trails. spaCy masks every padding_idx piece wherever it is,
    # so the fused attention must take the full 2-D mask.
    options.attention_mask_format = AttentionMaskFormat.AttentionMask
    with warnings.catch_warnings(), _quiet_optimizer_logs():
        warnings.simplefilter("ignore")
        try:
            optimized = optimize_model(
                str(path),
                model_type="bert",
                num_heads=spec.num_attention_heads,
                hidden_size=spec.hidden_width,
                optimization_options=options,
                opt_level=0,
                use_gpu=plan.for_gpu,
            )
            if plan.float16:
                optimized.convert_float_to_float16(keep_io_types=True)
        except Exception as error:  # the optimizer raises many unrelated types
            raise ConversionError(
                f"ONNX Runtime's transformer optimizer failed on the {spec.family} model: "
                f"{error}. Please report this with your onnxruntime version."
            ) from error
        missing = set(spec.output_names) - {out.name for out in optimized.model.graph.output}
        if missing:
            raise ConversionError(
                f"ONNX Runtime's optimizer dropped outputs {sorted(missing)}. Please report this."
            )
        logger.debug("fused operators: %s", optimized.get_fused_operator_statistics())
        optimized.save_model_to_file(str(path))
