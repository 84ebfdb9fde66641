"""int8 for CPUs: ONNX Runtime's quantization of the exported encoder, as a plan search.

Two kinds of plan (:mod:`~spacy_accelerate.verify.plan_search` races and judges them):

- **dynamic int8** (:class:`KeptFloat`, ``quantize_dynamic``): the weights of the
  projection MatMuls int8, one scale per output channel; each activation quantized on the
  fly with one scale for the whole tensor. The fastest, but one scale cannot follow the
  outlier channels of a real checkpoint's activations (all-MiniLM-L6-v2's feed-forward
  outputs carry them), so the pipeline's annotations can change. It is the ladder's base:
  the MatMuls whose int8 harms the calibration texts' outputs most (:func:`matmul_harm`)
  go back to float.
- **blockwise int8** (:class:`Blockwise`, ``MatMulNBits`` with 8-bit weights and
  ``accuracy_level`` 4): int8 weights with a scale per block of input channels, and each
  token's activations quantized at run time per block too, multiplied in int8. Per-token,
  per-block scales follow the outliers that one scale per tensor cannot, for less speed.

Embedding lookups, layer norms, softmax and the attention products stay float. Measured
figures: ``docs/accuracy.md`` and ``benchmarks/results/``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from spacy_accelerate import progress
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.backends.onnxruntime.graph import GraphPlan, graph_plan, optimize_graph
from spacy_accelerate.backends.onnxruntime.int8_recipe import HARM_ROWS, Int8Recipe
from spacy_accelerate.errors import Advice, Said
from spacy_accelerate.options.config import Precision, Provider
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.verify.calibration import spread
from spacy_accelerate.verify.plan_search import (
    Built,
    Int8Search,
    PlanUnavailable,
    Quantizer,
    sensitivity_ladder,
)
from spacy_accelerate.verify.record import BuiltModel
from spacy_accelerate.verify.speed import Rival

if TYPE_CHECKING:
    import onnx

    # the backend interface names this module's plan search
    from spacy_accelerate.backends.base import BuildJob

logger = logging.getLogger("spacy_accelerate")


#: Operators whose weights are quantized (``Attention`` appears only in a fused graph).
QUANTIZED_OPS = ("MatMul", "Attention")


def prepare(source: Path, target: Path) -> None:
    """ONNX Runtime's quantization pre-processing of ``source`` into ``target``: the graph
    clean-up its quantizer expects (the basic graph optimizations, constant folding
    among them), which changes what ``quantize_dynamic`` makes. This is the step
    ``quant_pre_process`` runs, written by the session itself (``quant_pre_process``
    parses and writes the model once more after it, for the same graph and its mark),
    and its shape inferences add nothing here (the symbolic one cannot
    follow the dynamic mask arithmetic; ONNX's gave the same int8 model on the BERT and
    RoBERTa exports), only time (measured: ``docs/performance.md``, "Issue 29 on an
    Intel Xeon with AMX")."""
    import onnx  # here, not at the top: loading a built model never needs it
    import onnxruntime
    from onnxruntime.quantization.quant_utils import add_pre_process_metadata

    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(target)
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with progress.third_party_output(root_records_of=["onnxruntime"]):
        onnxruntime.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    # The mark ``quant_pre_process`` sets (the quantizer warns without it), appended: a
    # serialized message followed by another parses as their merge, so the model's
    # metadata gains the entry without the model being parsed and written again.
    mark = onnx.ModelProto()
    add_pre_process_metadata(mark)
    with target.open("ab") as file:
        file.write(mark.SerializeToString())


def weighted_matmuls(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The MatMuls whose second input is a constant weight: what int8 quantizes, and the
    units of ONNX Runtime's ladder."""
    weights = {init.name for init in graph.initializer}
    return [node for node in graph.node if _weighted_matmul(node, weights)]


def _weighted_matmul(node: onnx.NodeProto, weights: Collection[str]) -> bool:
    return node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in weights


def harm_rows(items: Sequence[EncoderInputs], count: int = HARM_ROWS) -> list[EncoderInputs]:
    """The first row of ``count`` items spread over ``items``, each cut to its real pieces."""
    return [row for item in spread(items, count) for row in itertools.islice(item.rows(), 1)]


def matmul_harm(
    prepared: onnx.ModelProto,
    items: Sequence[EncoderInputs],
    recipe: Int8Recipe,
) -> dict[str, float]:
    """Per MatMul with a constant weight of ``prepared`` (by node name; the model is made
    switchable in place, so pass one nothing else reads): how far the model's outputs move
    on ``recipe.harm_rows`` calibration rows (:func:`harm_rows`) when that MatMul alone is
    int8 (one minus the mean cosine of the pieces, averaged over the hidden states).

    Why end to end and not the MatMul's own error: the MatMul with the smallest error of
    its own can be the one that, alone in int8, changes the annotations most, since
    earlier layers' errors are partly absorbed by the layers after them (measured:
    ``docs/accuracy.md``, "One int8 search").

    One session measures them all (:func:`switchable_model`), rather than a model
    quantized once per MatMul, which a base model's 72 would take minutes for."""
    import onnxruntime

    model, switches = switchable_model(prepared, recipe)
    options = onnxruntime.SessionOptions()
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs() if i.name not in switches.values()]
    measured = harm_rows(items, recipe.harm_rows)
    off = {switch: np.array(False) for switch in switches.values()}

    def outputs(switch: str | None) -> list[list[np.ndarray]]:
        flags = {**off, switch: np.array(True)} if switch else off
        return [session.run(None, {**row.feeds(names), **flags}) for row in measured]

    reference = outputs(None)
    harm: dict[str, float] = {}
    measuring = "measuring each MatMul's int8 harm on the calibration texts"
    for name, switch in progress.track(switches.items(), measuring):
        deficits = [
            1.0 - float(np.mean(_cosines(actual, expected)))
            for got, want in zip(outputs(switch), reference, strict=True)
            for actual, expected in zip(got, want, strict=True)
        ]
        harm[name] = float(np.mean(deficits))
    return harm


def switchable_model(
    model: onnx.ModelProto, recipe: Int8Recipe
) -> tuple[onnx.ModelProto, dict[str, str]]:
    """``model`` with every MatMul that has a constant weight made an ``If`` on a boolean
    input of its own: off, the float MatMul; on, its int8 twin, the input through
    ``DynamicQuantizeLinear`` and back (what ONNX Runtime's dynamic int8 does to
    activations: per tensor, uint8 with a zero point) times the weight rounded as
    ``recipe`` rounds it. Only the branch taken runs, so a measurement costs one model's
    time. Returns the model and each MatMul's switch input by node name."""
    import onnx  # here, not at the top: loading a built model never needs it
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    switches: dict[str, str] = {}
    for node in graph.node:
        if not _weighted_matmul(node, weights):
            nodes.append(node)
            continue
        tag = f"harm{len(switches)}"
        source, weight, target = node.input[0], node.input[1], node.output[0]
        rounded = _int8_weight(numpy_helper.to_array(weights[weight]), recipe)
        graph.initializer.append(numpy_helper.from_array(rounded.astype(np.float32), f"{tag}_w"))
        quantized = [
            helper.make_node(
                "DynamicQuantizeLinear", [source], [f"{tag}_q", f"{tag}_s", f"{tag}_z"]
            ),
            helper.make_node(
                "DequantizeLinear", [f"{tag}_q", f"{tag}_s", f"{tag}_z"], [f"{tag}_x"]
            ),
            helper.make_node("MatMul", [f"{tag}_x", f"{tag}_w"], [f"{tag}_int8"]),
        ]
        plain = [helper.make_node("MatMul", [source, weight], [f"{tag}_float"])]
        nodes.append(
            helper.make_node(
                "If",
                [tag],
                [target],
                name=f"{tag}_if",
                then_branch=_branch(f"{tag}_on", quantized, f"{tag}_int8"),
                else_branch=_branch(f"{tag}_off", plain, f"{tag}_float"),
            )
        )
        graph.input.append(helper.make_tensor_value_info(tag, onnx.TensorProto.BOOL, []))
        switches[node.name] = tag
    del graph.node[:]
    graph.node.extend(nodes)
    return model, switches


def _branch(name: str, nodes: list[onnx.NodeProto], output: str) -> onnx.GraphProto:
    """A branch of an ``If``: ``nodes`` reading the outer graph's tensors, one float output."""
    import onnx  # here, not at the top: loading a built model never needs it
    from onnx import helper

    value = helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, None)
    return helper.make_graph(nodes, name, [], [value])


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


#: The operators of one dynamically quantized MatMul, between its activations'
#: ``DynamicQuantizeLinear`` and its output (as ``quantize_dynamic`` makes them, and the
#: fused form).
_INT8_MATMUL_OPS = frozenset({"MatMulInteger", "Cast", "Mul", "DynamicQuantizeMatMul"})


def with_float_matmuls(
    quantized: onnx.ModelProto, prepared: onnx.ModelProto, kept: Sequence[str]
) -> onnx.ModelProto | None:
    """A copy of ``quantized`` (every MatMul dynamic int8) with the MatMuls named in
    ``kept`` back as ``prepared``'s float MatMuls: the model ``quantize_dynamic`` makes
    with them in ``nodes_to_exclude`` (a test holds the two to the same outputs), in a
    fraction of a second instead of seconds of a base model's ladder plan.

    Each int8 MatMul is the chain of nodes that computes the float MatMul's output from
    the activations' ``DynamicQuantizeLinear`` and the weight's constants; it is replaced
    by the float node, and what nothing reads any more is dropped. None where a chain is
    not found as expected (another quantizer's layout): the plan is quantized instead."""
    import onnx  # here, not at the top: loading a built model never needs it

    names = set(kept)
    originals = [node for node in weighted_matmuls(prepared.graph) if node.name in names]
    if len(originals) != len(names):
        return None
    model = onnx.ModelProto()
    model.CopyFrom(quantized)
    graph = model.graph
    nodes: list[onnx.NodeProto | None] = list(graph.node)
    producers = {output: index for index, node in enumerate(graph.node) for output in node.output}
    weights = {init.name: init for init in prepared.graph.initializer}
    present = {init.name for init in graph.initializer}
    for original in originals:
        chain = _int8_chain(original.output[0], graph, producers)
        if chain is None or any(nodes[index] is None for index in chain):
            return None  # not one int8 MatMul's nodes, or shared with another's
        for index in chain:
            nodes[index] = None
        nodes[min(chain)] = original  # where the chain began: its inputs exist by then
        if original.input[1] not in present:
            graph.initializer.append(weights[original.input[1]])
            present.add(original.input[1])
    del graph.node[:]
    graph.node.extend(node for node in nodes if node is not None)
    _drop_unread(graph)
    return model


def _int8_chain(output: str, graph: onnx.GraphProto, producers: dict[str, int]) -> list[int] | None:
    """The indices of the nodes between ``output`` and the ``DynamicQuantizeLinear`` and
    constants it is computed from, where they are one int8 MatMul's
    (:data:`_INT8_MATMUL_OPS`, one int8 product among them), else None."""
    chain: list[int] = []
    stack = [output]
    while stack:
        index = producers.get(stack.pop())
        if index is None or index in chain:
            continue
        node = graph.node[index]
        if node.op_type == "DynamicQuantizeLinear":
            continue
        if node.op_type not in _INT8_MATMUL_OPS:
            return None
        chain.append(index)
        stack.extend(node.input)
    products = [
        i for i in chain if graph.node[i].op_type in {"MatMulInteger", "DynamicQuantizeMatMul"}
    ]
    return chain if len(products) == 1 else None


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Remove the ``DynamicQuantizeLinear`` nodes and the initializers nothing reads (a
    node, a subgraph of one, an output, or the graph's inputs)."""
    read = _read_names(graph)
    kept = [
        node
        for node in graph.node
        if node.op_type != "DynamicQuantizeLinear" or any(out in read for out in node.output)
    ]
    del graph.node[:]
    graph.node.extend(kept)
    read = _read_names(graph) | {value.name for value in graph.input}
    initializers = [init for init in graph.initializer if init.name in read]
    del graph.initializer[:]
    graph.initializer.extend(initializers)


def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Every name ``graph``'s nodes (and their subgraphs') read, and its outputs."""
    read = {output.name for output in graph.output}
    for node in graph.node:
        read.update(node.input)
        for attribute in node.attribute:
            for subgraph in [attribute.g, *attribute.graphs]:
                read |= _read_names(subgraph)
    return read


@dataclass(frozen=True)
class KeptFloat:
    """A dynamic int8 plan: every MatMul with a weight int8 but those named in ``kept``."""

    kept: tuple[str, ...] = ()


@dataclass(frozen=True)
class Blockwise:
    """A blockwise int8 plan: every MatMul with a weight in 8-bit blocks of
    ``block_size`` input channels, activations per token and block at run time."""

    block_size: int


OrtPlan = KeptFloat | Blockwise


@dataclass(frozen=True)
class PreparedModels:
    """What a first round of ``auto``'s search hands its second
    (:meth:`OnnxRuntimeQuantizer.carry`): the prepared model and the all-int8 one, in
    memory, so that neither is made again."""

    prepared: onnx.ModelProto
    all_int8: onnx.ModelProto


def plan_label(kept: Sequence[str], total: int | None = None) -> str:
    """How the manifest, the served summary and the errors name a dynamic plan: "every
    MatMul int8", or the MatMuls kept in float out of the ``total`` with a weight, most
    harmful first (node names as the export made them): "2 of 72 MatMuls kept float: ..."."""
    if not kept:
        return "every MatMul int8"
    out_of = f" of {total}" if total is not None else ""
    return f"{len(kept)}{out_of} MatMuls kept float: " + ", ".join(kept)


def blockwise_label(block_size: int) -> str:
    return f"every MatMul int8 in blocks of {block_size}, activations per token (MatMulNBits)"


def quantize_blockwise(prepared: Path, target: Path, block_size: int) -> None:
    """Write the blockwise int8 version of the prepared model to ``target``
    (ONNX Runtime's ``MatMulNBitsQuantizer``: 8 bits, symmetric, int8 arithmetic)."""
    import onnx  # here, not at the top: loading a built model never needs it
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # Its logger says INFO for every node it passes (thousands of lines on a BERT-base).
    quiet = progress.third_party_output(
        MatMulNBitsQuantizer.__module__, root_records_of=["onnxruntime"]
    )
    with warnings.catch_warnings(), quiet:
        warnings.simplefilter("ignore")
        quantizer = MatMulNBitsQuantizer(
            onnx.load(str(prepared)),
            bits=8,
            block_size=block_size,
            is_symmetric=True,
            accuracy_level=4,  # int8 arithmetic: activations quantized per block
        )
        quantizer.process()
        quantizer.model.save_model_to_file(str(target), False)


class OnnxRuntimeQuantizer(Quantizer[Session, OrtPlan]):
    """ONNX Runtime's plans for the int8 search: dynamic int8 and the blockwise plans are
    whole plans, each quantized from the prepared model; the float plan to beat is the fp32
    model ONNX Runtime serves (fused); the ladder's units are dynamic int8's MatMuls,
    ranked by :func:`matmul_harm`, measured only where the ladder is searched."""

    advice: Said = (
        "Use ",
        Advice("precision", "fp32"),
        ", calibrate on texts like yours (",
        Advice("calibration_texts", ...),
        "), or lower ",
        Advice("min_agreement"),
        " (or ",
        Advice("min_cosine"),
        ") if less accuracy is enough for you.",
    )

    def __init__(
        self,
        job: BuildJob,
        recipe: Int8Recipe,
        open_session: Callable[[Path], Session],
        carried: PreparedModels | None = None,
    ) -> None:
        self.job, self.recipe, self.open_session = job, recipe, open_session
        path = job.path
        self.float_model = path.with_name(f"float-{path.name}")  # fused first, if at all
        self.prepared = path.with_name(f"prepared-{path.name}")
        self.files: dict[str, Path] = {}
        self.matmuls: int | None = None  # how many MatMuls have a weight, once measured
        self._baseline: Rival | None = None
        if carried is not None:  # a second round: the first one's models
            self.__dict__.update(prepared_model=carried.prepared, all_int8=carried.all_int8)
            return
        source = job.export.path  # only read
        if recipe.fuse_first:
            optimize_graph(source, self.float_model, job.spec, GraphPlan(fuse=True))
            source = self.float_model
        prepare(source, self.prepared)

    def whole_plans(self) -> Sequence[OrtPlan]:
        return [KeptFloat(), *(Blockwise(size) for size in self.recipe.blocks)]

    def faster_plan(self, plan: OrtPlan) -> OrtPlan | None:
        """Blocks of 32 after blocks of 128: the same MatMulNBits kernel with four times
        the scales, never the faster of the two."""
        if not isinstance(plan, Blockwise):
            return None
        coarser = [size for size in self.recipe.blocks if size > plan.block_size]
        return Blockwise(min(coarser)) if coarser else None

    def float_share(self, plan: OrtPlan) -> float | None:
        """A dynamic plan's float MatMuls' share of the weights of all MatMuls that have
        one (a MatMul's work grows with its weight)."""
        if not isinstance(plan, KeptFloat):
            return None
        sizes = self.weight_sizes
        return sum(sizes[name] for name in plan.kept) / max(1, sum(sizes.values()))

    @functools.cached_property
    def weight_sizes(self) -> dict[str, int]:
        """Each MatMul with a constant weight (by node name): its weight's elements."""
        graph = self.prepared_model.graph
        elements = {init.name: int(np.prod(init.dims)) for init in graph.initializer}
        return {node.name: elements[node.input[1]] for node in weighted_matmuls(graph)}

    def label(self, plan: OrtPlan) -> str:
        if isinstance(plan, Blockwise):
            return blockwise_label(plan.block_size)
        return plan_label(plan.kept, self.matmuls)

    def build(self, plan: OrtPlan) -> Built[Session, OrtPlan]:
        label = self.label(plan)
        target = self.files[label] = self.job.path.with_name(f"plan-{len(self.files)}-model.onnx")
        if isinstance(plan, Blockwise):
            try:
                quantize_blockwise(self.prepared_file(), target, plan.block_size)
                session = self.open_session(target)
            except Exception as error:  # an ONNX Runtime without 8-bit MatMulNBits
                raise PlanUnavailable(f"{label}: not available here ({error})") from error
        else:
            self.write_dynamic(plan, target)
            session = self.open_session(target)
        return Built(plan, label, session, functools.partial(self.job.measure, session))

    def write_dynamic(self, plan: KeptFloat, target: Path) -> None:
        """The dynamic int8 ``plan`` written to ``target``: a ladder's plan made from the
        all-int8 model (:func:`with_float_matmuls`), else quantized."""
        import onnx  # here, not at the top: loading a built model never needs it

        if plan.kept:
            model = with_float_matmuls(self.all_int8, self.prepared_model, plan.kept)
            if model is not None:
                onnx.save(model, str(target))
                return
        quantize_int8(self.prepared_file(), target, self.recipe, plan.kept)

    @functools.cached_property
    def all_int8(self) -> onnx.ModelProto:
        """The all-int8 plan's model: the file this search built for it (a second round
        of ``auto``'s search is handed its first round's), else quantized now."""
        import onnx  # here, not at the top: loading a built model never needs it

        built = self.files.get(self.label(KeptFloat()))
        if built is None or not built.exists():
            built = self.files["all-int8"] = self.job.path.with_name(f"int8-{self.job.path.name}")
            quantize_int8(self.prepared_file(), built, self.recipe, ())
        return onnx.load(str(built))

    @functools.cached_property
    def prepared_model(self) -> onnx.ModelProto:
        import onnx  # here, not at the top: loading a built model never needs it

        return onnx.load(str(self.prepared))

    def prepared_file(self) -> Path:
        """The prepared model's file, written from memory where a second round was handed
        the model alone (only a plan the ladder surgery cannot make needs it)."""
        import onnx  # here, not at the top: loading a built model never needs it

        if not self.prepared.exists():
            onnx.save(self.prepared_model, str(self.prepared))
        return self.prepared

    def prepared_copy(self) -> onnx.ModelProto:
        """A copy of the prepared model that may be changed: read from its file where
        there is one (the model in memory may not be loaded yet), else copied."""
        import onnx  # here, not at the top: loading a built model never needs it

        if self.prepared.exists():
            return onnx.load(str(self.prepared))
        copy = onnx.ModelProto()
        copy.CopyFrom(self.prepared_model)
        return copy

    def carry(self) -> PreparedModels:
        return PreparedModels(self.prepared_model, self.all_int8)

    def baseline(self) -> Rival:
        """The fp32 model this provider serves (the exported graph, fused)."""
        if self._baseline is None:
            fused = self.job.path.with_name("baseline-model.onnx")
            plan = graph_plan(Provider.CPU, Precision.FP32)
            optimize_graph(self.job.export.path, fused, self.job.spec, plan)
            self.files["baseline"] = fused
            self._baseline = Rival("cpu fp32", self.open_session(fused))
        return self._baseline

    def ladder_base(self) -> OrtPlan:
        return KeptFloat()

    def ladders(self, base: Built[Session, OrtPlan]) -> Iterator[Sequence[OrtPlan]]:
        job = self.job
        rows = job.calibration.items if job.calibration is not None else job.batches
        harm = matmul_harm(self.prepared_copy(), rows, self.recipe)
        self.matmuls = len(harm)
        yield [KeptFloat(kept) for kept in sensitivity_ladder(harm, max(1, len(harm) - 1))]

    def serve(self, built: Built[Session, OrtPlan]) -> None:
        os.replace(self.files.pop(built.label), self.job.path)

    def discard(self) -> None:
        for leftover in (self.float_model, self.prepared, *self.files.values()):
            leftover.unlink(missing_ok=True)
        for cached in ("all_int8", "prepared_model", "weight_sizes"):  # hundreds of MB
            self.__dict__.pop(cached, None)


@progress.step("ONNX Runtime int8: quantizing, racing and judging plans")
def quantize_within_gate(
    job: BuildJob, recipe: Int8Recipe, open_session: Callable[[Path], Session]
) -> BuiltModel:
    """Quantize the exported fp32 model (``job.export``, only read) with the fastest plan
    that passes the gate (token cosine, then the pipeline's agreement) and outruns the
    fp32 model (and the rivals of ``job.limits``), written to ``job.path``; the other
    candidates are removed either way (see :mod:`~spacy_accelerate.verify.plan_search`)."""
    carried = job.limits.carried(PreparedModels)
    quantizer = OnnxRuntimeQuantizer(job, recipe, open_session, carried)
    items = job.calibration.items if job.calibration is not None else job.batches
    search = Int8Search(quantizer, gate=job.gate, judge=job.judge, items=items, limits=job.limits)
    return search.run()


__all__ = ["Int8Recipe", "quantize_int8"]
