"""int8 for CPUs: ONNX Runtime's dynamic quantization of the exported encoder.

Weights of the projection MatMuls become int8 (one scale per output channel
by default: per tensor loses far more on real checkpoints, for the same
speed); activations are quantized on the fly. Embedding lookups, layer
norms, softmax and the attention products stay float.

Some checkpoints carry outlier activations that one scale for a whole activation
tensor cannot keep (all-MiniLM-L6-v2's feed-forward outputs do), and a pipeline's heads
may turn a small change into a changed tag. So quantization is a plan search
(:func:`quantize_within_gate`): all MatMuls in int8 first; where the pipeline's
annotations of the calibration texts then change more than ``min_agreement`` allows, the
MatMuls whose int8 harms their outputs on the calibration texts most
(:func:`matmul_harm`) go back to float, the fewest that pass found by bisection on the
ladder shared with OpenVINO (:func:`~spacy_accelerate.verify.plan_search.sensitivity_ladder`;
OpenVINO's units are whole layers). MatMuls, not layers, because the harm concentrates:
on minilm-ewt, five of six layers back in float still changed 1.8% of the calibration
tags, the one layer left in int8 holding the outlier feed-forward output.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from spacy_accelerate import progress
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.backends.onnxruntime.graph import GraphPlan, optimize_graph
from spacy_accelerate.cpu_features import CpuFeatures
from spacy_accelerate.errors import AccuracyError, AgreementError
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.verify.parity import ParityReport
from spacy_accelerate.verify.plan_search import (
    Judged,
    PlanSearch,
    bisect_ladder,
    sensitivity_ladder,
)

if TYPE_CHECKING:  # the backend interface names this module's plan search
    from spacy_accelerate.backends.base import BuildJob

logger = logging.getLogger("spacy_accelerate")


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
    #: How the plans after all-int8 are found (part of the key: a changed search may
    #: serve another plan).
    ladder: str = "MatMuls back in float by measured harm, bisected"


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


def prepare(source: Path, target: Path) -> None:
    """ONNX Runtime's quantization pre-processing of ``source`` into ``target`` (ONNX
    shape inference and graph clean-up; its symbolic shape inference cannot follow the
    dynamic mask arithmetic), the step its quantizer expects."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with warnings.catch_warnings(), progress.third_party_output(root_records_of=["onnxruntime"]):
        warnings.simplefilter("ignore")
        quant_pre_process(str(source), str(target), skip_symbolic_shape=True)


#: Calibration items each MatMul's harm is measured on.
HARM_ITEMS = 8


def matmul_harm(
    prepared: Path, items: Sequence[EncoderInputs], recipe: Int8Recipe
) -> dict[str, float]:
    """Per MatMul with a constant weight (by node name): how far the model's outputs move
    on the first calibration items when that MatMul alone is int8 (one minus the mean
    cosine of the pieces, averaged over the hidden states).

    Why end to end and not the MatMul's own error: on minilm-ewt the final feed-forward
    output has the smallest error of its own (1.2% per piece) yet, alone in int8,
    changed 0.58% of the calibration tags and 4.3% of the dependencies, more than any
    other; earlier layers' errors are partly absorbed by the layers after them.

    One session measures them all (:func:`switchable_model`): quantizing the model once
    per MatMul took over twelve minutes for trf-base's 72 on two CPUs."""
    import onnxruntime

    model, switches = switchable_model(onnx.load(str(prepared)), recipe)
    options = onnxruntime.SessionOptions()
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs() if i.name not in switches.values()]
    rows = list(items[:HARM_ITEMS])
    off = {switch: np.array(False) for switch in switches.values()}

    def outputs(switch: str | None) -> list[list[np.ndarray]]:
        flags = {**off, switch: np.array(True)} if switch else off
        return [session.run(None, {**item.feeds(names), **flags}) for item in rows]

    reference = outputs(None)
    harm: dict[str, float] = {}
    measuring = "measuring each MatMul's int8 harm on the calibration texts"
    for name, switch in progress.track(switches.items(), measuring):
        deficits = [
            1.0 - float(np.mean(_cosines(actual, expected)[item.attention_mask.astype(bool)]))
            for item, got, want in zip(rows, outputs(switch), reference, strict=True)
            for actual, expected in zip(got, want, strict=True)
        ]
        harm[name] = float(np.mean(deficits))
    return harm


def switchable_model(
    model: onnx.ModelProto, recipe: Int8Recipe
) -> tuple[onnx.ModelProto, dict[str, str]]:
    """``model`` with every MatMul that has a constant weight given an int8 twin: its
    input through ``DynamicQuantizeLinear`` and back (what ONNX Runtime's dynamic int8 does
    to activations: per tensor, uint8 with a zero point) times its weight rounded as
    ``recipe`` rounds it, selected by a boolean input of its own (off: the float
    MatMul). Returns the model and each MatMul's switch input by node name."""
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    switches: dict[str, str] = {}
    for node in graph.node:
        nodes.append(node)
        if not (node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in weights):
            continue
        tag = f"harm{len(switches)}"
        source, weight, target = node.input[0], node.input[1], node.output[0]
        rounded = _int8_weight(numpy_helper.to_array(weights[weight]), recipe)
        graph.initializer.append(numpy_helper.from_array(rounded.astype(np.float32), f"{tag}_w"))
        node.output[0] = f"{tag}_float"
        nodes += [
            helper.make_node(
                "DynamicQuantizeLinear", [source], [f"{tag}_q", f"{tag}_s", f"{tag}_z"]
            ),
            helper.make_node(
                "DequantizeLinear", [f"{tag}_q", f"{tag}_s", f"{tag}_z"], [f"{tag}_x"]
            ),
            helper.make_node("MatMul", [f"{tag}_x", f"{tag}_w"], [f"{tag}_int8"]),
            helper.make_node("Where", [tag, f"{tag}_int8", f"{tag}_float"], [target]),
        ]
        graph.input.append(helper.make_tensor_value_info(tag, onnx.TensorProto.BOOL, []))
        switches[node.name] = tag
    del graph.node[:]
    graph.node.extend(nodes)
    return model, switches


def _int8_weight(weight: np.ndarray, recipe: Int8Recipe) -> np.ndarray:
    """``weight`` (in, out) through symmetric int8 as ``recipe`` rounds it: per output
    channel or per tensor, 7 bits with ``reduce_range``."""
    limit = 63 if recipe.reduce_range else 127
    peak = np.abs(weight).max(axis=0, keepdims=True) if recipe.per_channel else np.abs(weight).max()
    scale = np.where(peak > 0, peak / limit, 1.0)
    return np.asarray(np.clip(np.round(weight / scale), -limit, limit) * scale)


def _cosines(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(e, axis=-1)
    return np.sum(a * e, axis=-1) / np.maximum(norms, 1e-30)


def quantize_int8(prepared: Path, target: Path, recipe: Int8Recipe, kept: Sequence[str]) -> None:
    """Write the dynamically quantized int8 version of the prepared model to ``target``,
    the MatMuls named in ``kept`` left in float32."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with warnings.catch_warnings(), progress.third_party_output(root_records_of=["onnxruntime"]):
        warnings.simplefilter("ignore")
        quantize_dynamic(
            model_input=str(prepared),
            model_output=str(target),
            op_types_to_quantize=list(QUANTIZED_OPS),
            per_channel=recipe.per_channel,
            reduce_range=recipe.reduce_range,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=list(kept),
            # Tensors made by ONNX Runtime's own fused operators have no type in
            # ONNX's shape inference; every activation here is float32.
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": TensorProto.FLOAT},
        )
    logger.debug("quantized %s to int8 (%s, %d MatMuls kept float)", target.name, recipe, len(kept))


def plan_label(kept: Sequence[str], total: int | None = None) -> str:
    """How the manifest, the served summary and the errors name a plan: "every MatMul
    int8", or the MatMuls kept in float out of the ``total`` with a weight, most harmful
    first (node names as the export made them): "2 of 72 MatMuls kept float: ..."."""
    if not kept:
        return "every MatMul int8"
    out_of = f" of {total}" if total is not None else ""
    return f"{len(kept)}{out_of} MatMuls kept float: " + ", ".join(kept)


@progress.step("ONNX Runtime int8: quantizing and judging plans")
def quantize_within_gate(
    job: BuildJob, recipe: Int8Recipe, open_session: Callable[[Path], Session]
) -> tuple[Session, ParityReport]:
    """Quantize the fp32 model at ``job.path`` with the plan with the fewest float MatMuls
    that passes the gate (token cosine, then the pipeline's agreement), written to
    ``job.path``; the float model and the other candidates are removed either way."""
    path, spec = job.path, job.spec
    float_model = path.with_name(f"float-{path.name}")
    prepared = path.with_name(f"prepared-{path.name}")
    os.replace(path, float_model)
    if recipe.fuse_first:
        optimize_graph(float_model, spec, GraphPlan(fuse=True))
    prepare(float_model, prepared)
    float_model.unlink()
    search: PlanSearch[Session] = PlanSearch()
    files: dict[str, Path] = {}
    matmuls: list[int] = []  # how many MatMuls have a weight, once measured

    def attempt(kept: tuple[str, ...]) -> Judged[Session]:
        label = plan_label(kept, matmuls[0] if matmuls else None)
        search.trying(f"{len(kept)} MatMuls kept float" if kept else label)
        files[label] = path.with_name(f"plan-{len(files)}-{path.name}")
        quantize_int8(prepared, files[label], recipe, kept)
        session = open_session(files[label])
        try:
            report = job.judged(session)
        except AgreementError as error:
            return search.judged(label, session, None, error.finding, by_agreement=True)
        except AccuracyError as error:
            return search.judged(label, session, None, str(error))
        logger.info("int8 plan %r passed the gate (%d MatMuls kept float)", label, len(kept))
        return search.judged(label, session, report, None)

    try:
        chosen = attempt(())
        if not chosen.passed:
            rows = job.calibration.items if job.calibration is not None else job.batches
            harm = matmul_harm(prepared, rows, recipe)
            matmuls.append(len(harm))
            ladder = sensitivity_ladder(harm, max(1, len(harm) - 1))
            chosen = bisect_ladder(ladder, attempt) or chosen
        if chosen.passed:
            os.replace(files[chosen.label], path)
    finally:
        for leftover in (prepared, *files.values()):
            leftover.unlink(missing_ok=True)
    if not chosen.passed:
        raise search.no_plan(
            "Use precision='fp32', calibrate on texts like yours (calibration_texts=...), or "
            "lower min_agreement (or min_cosine) if less accuracy is enough for you."
        )
    return search.served(chosen)


__all__ = ["DEFAULT_INT8_RECIPE", "Int8Recipe", "quantize_int8", "recipe_for"]
