"""ONNX Runtime's transformer optimizer over the exported graph: fused attention, layer
norms and GELU for the provider that serves it, and fp16 weights for the CUDA provider."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.errors import ConversionError
from spacy_accelerate.options.config import Precision, Provider

logger = logging.getLogger("spacy_accelerate")


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

    TensorRT gets the plain graph: it fuses on its own and does not take ONNX
    Runtime's fused operators, and its fp16 is a build option, not a graph rewrite.
    int8 graphs are quantized unfused (see :mod:`.quantize`).
    """
    if provider is Provider.TENSORRT:
        return GraphPlan(fuse=False)
    if provider is Provider.CUDA:
        return GraphPlan(fuse=True, for_gpu=True, float16=precision is Precision.FP16)
    if provider is Provider.CPU:
        return GraphPlan(fuse=True)
    raise ValueError(f"{provider.value!r} is not served by ONNX Runtime")


def optimize_graph(source: Path, target: Path, spec: EncoderSpec, plan: GraphPlan) -> None:
    """The model at ``source`` with ``plan``'s fusions, written to ``target`` (which may
    be ``source``): read from the export, the graph is parsed and written once.

    The result keeps every output; a parity check afterwards decides whether
    it is served.
    """
    if not plan.fuse:
        raise ValueError(f"{plan} fuses nothing: copy the graph instead")
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    # The default turns the mask into one length per row, which assumes that
    # padding only trails. spaCy masks every padding_idx piece wherever it is,
    # so the fused attention must take the full 2-D mask.
    options.attention_mask_format = AttentionMaskFormat.AttentionMask
    # Its symbolic shape inference only checks that a residual Add's inputs may be fused
    # into SkipLayerNormalization; every Add an encoder's layers add is of equal shapes,
    # so it fuses the same graph without it (the BERT and RoBERTa exports, node for node),
    # in a second instead of several on a base model. The parity check still follows.
    options.enable_shape_inference = False
    with warnings.catch_warnings(), _quiet_optimizer_logs():
        warnings.simplefilter("ignore")
        try:
            optimized = optimize_model(
                str(source),
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
        optimized.save_model_to_file(str(target))
