"""int8 for CPUs: ONNX Runtime's dynamic quantization of the exported encoder.

Weights of the projection MatMuls become int8 (one scale per output channel
by default: per tensor loses far more on real checkpoints, for the same
speed); activations are quantized on the fly. Embedding lookups, layer
norms, softmax and the attention products stay float.

Some checkpoints carry outlier activations into their feed-forward output
projections (all-MiniLM-L6-v2 does), where one scale for a whole activation
tensor cannot keep them. So quantization is a ladder of plans, from all
projections in int8 to only the attention projections: the first plan whose
model passes the accuracy gate is served (:func:`quantize_within_gate`).
The projections are found by their weight shapes (hidden -> intermediate and
back), read from the graph, not from node names that differ by family.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.backends.onnxruntime.graph import GraphPlan, optimize_graph
from spacy_accelerate.cpu_features import CpuFeatures
from spacy_accelerate.errors import AccuracyError
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.verify.parity import ParityReport
from spacy_accelerate.verify.plan_search import Judged, PlanSearch

if TYPE_CHECKING:  # the backend interface names this module's plan search
    from spacy_accelerate.backends.base import BuildJob

logger = logging.getLogger("spacy_accelerate")


class KeepFloat(str, Enum):
    """Which projections a quantization plan leaves in float32, least first."""

    NOTHING = "nothing"
    FFN_OUTPUT = "ffn_output"
    FFN = "ffn"


#: The plans tried in turn until one passes the gate.
FALLBACK_PLANS: tuple[KeepFloat, ...] = (KeepFloat.NOTHING, KeepFloat.FFN_OUTPUT, KeepFloat.FFN)


@dataclass(frozen=True)
class Int8Recipe:
    """How the int8 model is made; part of the cache key."""

    #: One scale per output channel of each weight instead of one per tensor.
    per_channel: bool = True
    #: 7-bit weights, where the CPU's int8 products saturate (see
    #: :func:`recipe_for`); 8-bit elsewhere.
    reduce_range: bool = False
    #: Apply ONNX Runtime's transformer fusions (fused attention) before quantizing.
    fuse_first: bool = False
    #: The plans tried in turn (see :class:`KeepFloat`).
    plans: tuple[KeepFloat, ...] = FALLBACK_PLANS


DEFAULT_INT8_RECIPE = Int8Recipe()


def recipe_for(cpu: CpuFeatures) -> Int8Recipe:
    """The recipe for ``cpu``: 7-bit weights on an x86 CPU without VNNI, where ONNX
    Runtime's u8 x s8 products saturate (its quantization guide recommends
    ``reduce_range`` there). Measured on an AVX2-only AMD EPYC, MiniLM-L6 with trained
    heads: with 8-bit weights no plan kept every real piece's cosine >= 0.99 (best 0.986,
    the whole feed-forward in float); with 7-bit weights that plan reached 0.995."""
    return Int8Recipe(reduce_range=cpu.int8_products_saturate)


#: Operators whose weights are quantized (``Attention`` appears only in a fused graph).
QUANTIZED_OPS = ("MatMul", "Attention")


def kept_matmuls(model: onnx.ModelProto, spec: EncoderSpec, keep: KeepFloat) -> list[str]:
    """MatMul nodes whose constant weight has the shape of a kept projection."""
    hidden, inner = spec.hidden_width, spec.intermediate_width
    shapes = {
        KeepFloat.NOTHING: set(),
        KeepFloat.FFN_OUTPUT: {(inner, hidden)},
        KeepFloat.FFN: {(inner, hidden), (hidden, inner)},
    }[keep]
    weights = {init.name: tuple(init.dims) for init in model.graph.initializer}
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and any(weights.get(i) in shapes for i in node.input)
    ]


def quantize_int8(
    source: Path, target: Path, spec: EncoderSpec, recipe: Int8Recipe, keep: KeepFloat
) -> int:
    """Write the dynamically quantized int8 version of ``source`` to ``target``.

    The model first goes through ONNX Runtime's quantization pre-processing
    (ONNX shape inference and graph clean-up; its symbolic shape inference
    cannot follow the dynamic mask arithmetic), the step its quantizer
    expects. Returns how many MatMuls were kept in float32.
    """
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = target.with_name(f"{target.stem}.prepared{target.suffix}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        kept = kept_matmuls(onnx.load(str(prepared)), spec, keep)
        quantize_dynamic(
            model_input=str(prepared),
            model_output=str(target),
            op_types_to_quantize=list(QUANTIZED_OPS),
            per_channel=recipe.per_channel,
            reduce_range=recipe.reduce_range,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=kept,
            # Tensors made by ONNX Runtime's own fused operators have no type in
            # ONNX's shape inference; every activation here is float32.
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": TensorProto.FLOAT},
        )
    os.remove(prepared)
    logger.debug("quantized %s to int8 (%s, %d MatMuls kept float)", source.name, recipe, len(kept))
    return len(kept)


def quantize_within_gate(
    job: BuildJob, recipe: Int8Recipe, open_session: Callable[[Path], Session]
) -> tuple[Session, ParityReport]:
    """Quantize the fp32 model at ``job.path`` with the first plan of ``recipe`` whose
    model passes the gate; the float model is removed either way."""
    path, spec = job.path, job.spec
    float_model = path.with_name(f"float-{path.name}")
    os.replace(path, float_model)
    if recipe.fuse_first:
        optimize_graph(float_model, spec, GraphPlan(fuse=True))
    search: PlanSearch[Session] = PlanSearch()

    def attempt(plan: KeepFloat) -> Judged[Session]:
        kept = quantize_int8(float_model, path, spec, recipe, plan)
        session = open_session(path)
        try:
            report = job.check(session)
        except AccuracyError as error:
            described = f"{plan.value} kept float ({kept} MatMuls)"
            return search.judged(plan.value, session, None, str(error), described=described)
        logger.info("int8 plan %r passed the gate (%d MatMuls kept float)", plan.value, kept)
        return search.judged(plan.value, session, report, None)

    chosen = search.first_passing(recipe.plans, attempt)
    float_model.unlink()
    if chosen is None or not chosen.passed:
        raise search.no_plan(
            "Use precision='fp32', or lower min_cosine if less accuracy is enough for you."
        )
    return search.served(chosen)


__all__ = [
    "DEFAULT_INT8_RECIPE",
    "recipe_for",
    "FALLBACK_PLANS",
    "Int8Recipe",
    "KeepFloat",
    "quantize_int8",
]
