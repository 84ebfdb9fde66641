"""OpenVINO int8: NNCF post-training quantization, calibrated on real spans, as a plan search.

:class:`OpenVINOQuantizer` gives the one int8 search
(:mod:`spacy_accelerate.verify.plan_search`) OpenVINO's plans:

- whole plans, each one quantization: *static int8* (NNCF's transformer preset:
  SmoothQuant, int8 activations and per-channel int8 weights; what is not
  int8 runs in bf16 where the CPU has it), the same with each layer's *feed-forward output
  MatMul in float* (:class:`FloatFeedForwardOutputs`), and *dynamic int8*
  (:class:`DynamicInt8`: int8 weights, each token's activations quantized at run time,
  only where OpenVINO really does that: VNNI and f32 input);
- ladders, where no whole plan passes: whole transformer layers of the static model back
  in float, ranked by how much each one's mean token cosine drops in the static model's own
  parity report (for free), in bf16 where the CPU has it, then in fp32 (bf16's own error can
  be what fails the gate). Each float-layer plan is the static model with its layers'
  quantizers removed (:mod:`~spacy_accelerate.backends.openvino.float_layers`), not
  another quantization.

The float plan every int8 plan must outrun is OpenVINO's float model compiled as this CPU
serves it best: bf16 where it has bf16 units, fp32 elsewhere
(:func:`~spacy_accelerate.backends.openvino.session.speed_baseline`). What each plan was
judged with (the float part's precision, dynamic int8's group size) is recorded in its IR
(:func:`~spacy_accelerate.backends.openvino.session.compile_settings`), so a warm start
compiles it exactly as it was judged. Measured figures: ``docs/openvino.md``,
``benchmarks/results/int8_mechanisms-*.json``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from spacy_accelerate import progress
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.backends.base import BuildJob
from spacy_accelerate.backends.openvino.float_layers import with_float_layers
from spacy_accelerate.backends.openvino.session import (
    DYNAMIC_INT8_GROUP_SIZE,
    DYNAMIC_QUANTIZATION_RT_INFO,
    FLOAT_LAYERS_RT_INFO,
    INSTALL_HINT,
    IR_FILE,
    CompiledMatMuls,
    OpenVINOSession,
    compiled_matmuls,
    dynamic_int8_hints,
    float_model,
    float_part_hints,
    import_openvino,
    speed_baseline,
)
from spacy_accelerate.errors import Advice, ConversionError, OneOf, Said
from spacy_accelerate.options.config import Provider
from spacy_accelerate.options.gate import Gate
from spacy_accelerate.options.providers import PROVIDERS
from spacy_accelerate.runtime.providers import import_runtime
from spacy_accelerate.verify.calibration import Calibration, spread
from spacy_accelerate.verify.parity import check_parity
from spacy_accelerate.verify.plan_search import (
    Built,
    Int8Search,
    Quantizer,
    float_layer_ladder,
    layer_harm,
)
from spacy_accelerate.verify.record import BuiltModel
from spacy_accelerate.verify.speed import Rival

if TYPE_CHECKING:
    import onnx

logger = logging.getLogger("spacy_accelerate")


#: Calibration items NNCF collects its statistics on (spread over the texts): fewer changed
#: more tags, every item of the built-in sample cost time for no better agreement
#: (measured: ``docs/openvino.md``, "int8: calibrated on your texts").
QUANTIZATION_ITEMS = 16

#: Calibration items each plan's token cosine is measured on (spread over the texts), and
#: its layers' harm read from: PyTorch's outputs for them are computed once per build.
PARITY_ITEMS = 8


def parity_items(calibration: Calibration) -> tuple[EncoderInputs, ...]:
    """The calibration items every plan's parity to PyTorch is measured on."""
    return spread(calibration.items, PARITY_ITEMS)


def import_nncf() -> Any:
    """NNCF makes OpenVINO's int8 (it comes with the same extra)."""
    return import_runtime("nncf", "NNCF (OpenVINO's int8 needs it)", INSTALL_HINT)


def quietly() -> AbstractContextManager[None]:
    """Around NNCF's calls: its progress bars (rich, on stdout) and its INFO tables
    (logger ``nncf``, also on stdout) reach the user only at
    :attr:`~spacy_accelerate.progress.Verbosity.VERBOSE`; the library's own progress
    says what is being done."""
    return progress.third_party_output("nncf")


def nodes_by_layer(graph: onnx.ModelProto, spec: EncoderSpec) -> dict[int, list[onnx.NodeProto]]:
    """The nodes of each transformer layer (1-based), found by what the graph's outputs
    depend on: layer k's nodes feed ``hidden_state_k`` but not ``hidden_state_{k-1}``.
    No node names are read, so every family's export is split the same way."""
    producers = {out: node for node in graph.graph.node for out in node.output}
    ancestors: list[set[int]] = []
    seen: set[int] = set()  # node identities: a node's name may be empty
    for name in spec.hidden_state_names:  # each layer's ancestors include the previous ones
        stack = [name]
        while stack:
            node = producers.get(stack.pop())
            if node is not None and id(node) not in seen:
                seen.add(id(node))
                stack.extend(node.input)
        ancestors.append(set(seen))
    return {
        layer: [node for node in graph.graph.node if id(node) in fresh]
        for layer, fresh in ((k, ancestors[k] - ancestors[k - 1]) for k in range(1, len(ancestors)))
    }


@dataclass(frozen=True)
class FloatLayers:
    """A quantization plan: the transformer layers (1-based) left in float, and the
    OpenVINO hint they run in (``bf16`` or ``f32``)."""

    layers: tuple[int, ...] = ()
    hint: str = "f32"

    @property
    def label(self) -> str:
        if not self.layers:
            return "all layers int8"
        return "layers " + ", ".join(map(str, self.layers)) + f" float ({_named(self.hint)})"


def plan_ladder(harm: Sequence[float], *, float_in_bf16: bool = True) -> Iterator[FloatLayers]:
    """The plans after all-int8 failed: the most harmful layer in float, then the two
    most harmful, ... up to all but one layer where the float layers run in bf16,
    half of them where they run in fp32.

    Why: each float layer adds its share of the float model's time, and bf16 layers cost
    far less than fp32 ones, so with bf16 even all layers but one stay ahead of the bf16
    model, while fp32 float layers past half would cost most of what int8 gains (timings
    in ``docs/openvino.md``)."""
    most = len(harm) - 1 if float_in_bf16 else len(harm) // 2
    hint = "bf16" if float_in_bf16 else "f32"
    for layers in float_layer_ladder(harm, most):
        yield FloatLayers(layers, hint)


@dataclass(frozen=True)
class DynamicInt8:
    """A quantization plan: the weights of every MatMul and embedding table in int8
    (NNCF's weight compression, asymmetric, per output channel) and the MatMuls'
    activations quantized by OpenVINO at run time, each token's in groups of
    ``group_size`` channels; the rest (LayerNorm, attention) in the OpenVINO hint
    ``hint``.

    Why: scales made for each token follow a real checkpoint's outlier activations more
    closely than NNCF's static ones, for some speed. The group size trades the two:
    larger groups run faster and follow the activations less closely, smaller ones
    (OpenVINO's own default among them) the reverse; the default keeps a margin on both
    sides (measured: ``benchmarks/results/openvino_dynamic_int8-trf-base.json``, made by
    ``benchmarks/openvino_dynamic_int8.py``).
    """

    group_size: int = DYNAMIC_INT8_GROUP_SIZE
    hint: str = "f32"

    @property
    def label(self) -> str:
        return (
            f"dynamic int8 (activations per token, groups of {self.group_size}; "
            f"the rest {_named(self.hint)})"
        )


@dataclass(frozen=True)
class FloatFeedForwardOutputs:
    """A quantization plan: static int8 but for each layer's feed-forward output MatMul
    (its last MatMul with a weight), left in float in the OpenVINO hint ``hint``: that
    MatMul reads the GELU of the widest activations, where a real checkpoint's outliers
    sit, and writes the residual stream every later layer reads."""

    hint: str = "f32"

    @property
    def label(self) -> str:
        return f"static int8, feed-forward outputs float ({_named(self.hint)})"


def _named(hint: str) -> str:
    """How a plan's label names the OpenVINO hint its float part runs in."""
    return "bf16" if hint == "bf16" else "fp32"


Plan = FloatLayers | FloatFeedForwardOutputs | DynamicInt8


def dynamic_group_size(model: Any) -> int:
    """The largest group, up to :data:`.session.DYNAMIC_INT8_GROUP_SIZE` and
    halving, no wider than the narrowest input of a MatMul with a weight in ``model``.

    Why: OpenVINO quantizes at run time only the MatMuls whose input is at least one
    group wide; the others keep float activations with int8 weights alone, more
    slowly than the plan's label says. The two-layer test sample (inputs 48 and 100
    wide) gave the same outputs with groups of 128 as with none, and other ones
    with 16, 32 or 64."""
    narrowest = DYNAMIC_INT8_GROUP_SIZE
    for op in model.get_ops():
        weight = op.input_value(1).get_node() if op.get_type_name() == "MatMul" else None
        if weight is None or weight.get_type_name() != "Constant":
            continue
        shape = op.input(0).get_partial_shape()
        width = shape[shape.rank.get_length() - 1]
        if width.is_static:
            narrowest = min(narrowest, width.get_length())
    size = DYNAMIC_INT8_GROUP_SIZE
    while size > max(1, narrowest):
        size //= 2
    return size


@dataclass(frozen=True)
class StaticInt8Model:
    """What a first round of ``auto``'s search hands its second
    (:meth:`OpenVINOQuantizer.carry`): NNCF's all-int8 model, in memory, so that its
    quantization is not run again."""

    model: Any


class OpenVINOQuantizer(Quantizer[OpenVINOSession, Plan]):
    """OpenVINO's plans for the int8 search: static int8 (NNCF, every MatMul) and dynamic
    int8 (int8 weights, activations quantized per token at run time) are whole plans; the
    ladders put whole layers of the static model back in float, in bf16 where the CPU has
    it, then in fp32. A layer's harm is read off the static model's own parity report, for
    free: how much the mean cosine drops across it. The float plan to beat is OpenVINO's
    float model compiled as the CPU serves it best (:func:`.session.speed_baseline`)."""

    advice: Said = (
        "Use ",
        Advice("precision", OneOf(("bf16", "fp32"))),
        ", calibrate on texts like yours (",
        Advice("calibration_texts", ...),
        "), or lower ",
        Advice("min_cosine"),
        " / ",
        Advice("min_agreement"),
        " if less accuracy is enough for you.",
    )

    @property
    def instead(self) -> Said:  # type: ignore[override]
        return (Advice("precision", speed_baseline()),)

    def __init__(
        self,
        job: BuildJob,
        open_session: Callable[[Any], OpenVINOSession],
        carried: StaticInt8Model | None = None,
    ) -> None:
        import onnx  # here, not at the top: loading a built model never needs it

        calibration = job.calibration
        if calibration is None:
            raise ValueError("OpenVINO's int8 needs calibration inputs")
        self.ov, self.nncf = import_openvino(), import_nncf()
        self.job, self.calibration, self.open_session = job, calibration, open_session
        self.folder = job.path.parent  # the served IR goes there, named IR_FILE
        progress.note("PyTorch fp32's hidden states on the calibration items (the reference)")
        self.references = job.references(parity_items(self.calibration))
        self.float_model = float_model(job.export)
        graph = onnx.load(str(job.export.path), load_external_data=False)
        self.layer_nodes = present_layer_nodes(graph, self.float_model, job.spec)
        self.feed_forward_outputs = feed_forward_outputs(graph, self.layer_nodes)
        self.compiled: dict[str, CompiledMatMuls] = {}
        self.models: dict[str, Any] = {}  # by label: each built plan's model, in memory
        self._all_int8: Any = carried.model if carried is not None else None
        self._baseline: Rival | None = None

    # ------------------------------------------------------------------ the plans

    def whole_plans(self) -> Sequence[Plan]:
        group = dynamic_group_size(self.float_model)
        return [
            FloatLayers(),
            FloatFeedForwardOutputs(float_part_hints()[0]),
            *(DynamicInt8(group, hint) for hint in dynamic_int8_hints(group)),
        ]

    def label(self, plan: Plan) -> str:
        return plan.label

    def float_share(self, plan: Plan) -> float | None:
        """A ladder plan's float layers' share of the layers (alike, so alike in work)."""
        if not isinstance(plan, FloatLayers):
            return None
        return len(plan.layers) / len(self.layer_nodes)

    def ladder_base(self) -> Plan:
        return FloatLayers()

    def ladders(self, base: Built[OpenVINOSession, Plan]) -> Iterator[Sequence[Plan]]:
        harm = layer_harm(base.report, self.job.spec)  # how static int8 hurts each layer
        for hint in float_part_hints():  # in fp32, at most half of the layers
            yield list(plan_ladder(harm, float_in_bf16=hint == "bf16"))

    # ------------------------------------------------------------------ building

    def quantize(self, kept: list[str]) -> Any:
        """NNCF's post-training quantization, the nodes in ``kept`` left in float.

        Its bias correction is off: on both reference pipelines the quantized model's
        outputs were the same without it (to the last bit), and it runs a subgraph of the
        model per MatMul, seconds of a base model's search (``docs/openvino.md``).

        Its statistics are collected on the items' rows cut to their real pieces
        (:meth:`~spacy_accelerate.architectures.inputs.EncoderInputs.rows`): the padding's
        outputs are never used, yet would widen the ranges and cost time."""
        items = spread(self.calibration.items, QUANTIZATION_ITEMS)
        rows = [row for item in items for row in item.rows()]
        names = [port.any_name for port in self.float_model.inputs]
        progress.note(f"NNCF post-training quantization on {len(rows)} calibration rows")
        advanced = self.nncf.AdvancedQuantizationParameters(disable_bias_correction=True)
        with quietly():
            return self.nncf.quantize(
                self.float_model,
                self.nncf.Dataset([row.feeds(names) for row in rows]),
                model_type=self.nncf.ModelType.TRANSFORMER,
                subset_size=len(rows),
                ignored_scope=self.nncf.IgnoredScope(names=kept, validate=False),
                advanced_parameters=advanced,
            )

    def all_int8(self) -> Any:
        if self._all_int8 is None:
            self._all_int8 = self.quantize([])
        return self._all_int8

    def carry(self) -> StaticInt8Model | None:
        return None if self._all_int8 is None else StaticInt8Model(self._all_int8)

    def model_of(self, plan: Plan) -> Any:
        """The plan's model; what it records in its IR is how a warm start compiles it."""
        if isinstance(plan, DynamicInt8):
            progress.note("NNCF weight compression (int8 weights)")
            with quietly():
                compressed = self.nncf.compress_weights(
                    self.float_model.clone(), mode=self.nncf.CompressWeightsMode.INT8_ASYM
                )
            compressed.set_rt_info(plan.group_size, DYNAMIC_QUANTIZATION_RT_INFO)
            compressed.set_rt_info(plan.hint, FLOAT_LAYERS_RT_INFO)
            return compressed
        if isinstance(plan, FloatLayers) and not plan.layers:
            return self.all_int8()
        if isinstance(plan, FloatFeedForwardOutputs):
            kept = list(self.feed_forward_outputs)
        else:
            kept = [node.name for layer in plan.layers for node in self.layer_nodes[layer]]
        # Seconds instead of another quantization; NNCF where the graph is unusual.
        quantized = with_float_layers(self.all_int8(), self.float_model, kept)
        if quantized is None:
            logger.info("OpenVINO int8 plan %r: quantized again by NNCF", plan.label)
            quantized = self.quantize(kept)
        quantized.set_rt_info(plan.hint, FLOAT_LAYERS_RT_INFO)
        return quantized

    def build(self, plan: Plan) -> Built[OpenVINOSession, Plan]:
        """The plan's model compiled from memory: only the served one is written
        (:meth:`serve`), so a candidate that loses costs no disk."""
        model = self.models[plan.label] = self.model_of(plan)
        session = self.open_session(model)
        compiled = self.compiled[plan.label] = compiled_matmuls(session.compiled)
        measure = functools.partial(
            check_parity,
            self.job.module,
            self.job.detected,
            session,
            gate=Gate(),
            batches=parity_items(self.calibration),
            references=self.references,
        )
        return Built(plan, plan.label, session, measure, compiled.describe())

    def not_as_named(self, built: Built[OpenVINOSession, Plan]) -> str | None:
        return _as_named(built.plan, self.compiled[built.label])

    def baseline(self) -> Rival:
        """The float model compiled as a served bf16 (or fp32) model is."""
        if self._baseline is None:
            floats = speed_baseline()
            model = self.float_model.clone()
            model.set_rt_info("bf16" if floats == "bf16" else "f32", FLOAT_LAYERS_RT_INFO)
            self._baseline = Rival(f"openvino {floats}", self.open_session(model))
        return self._baseline

    # ------------------------------------------------------------------ files

    def serve(self, built: Built[OpenVINOSession, Plan]) -> None:
        """The served plan's model written as the entry's IR, the one a warm start reads."""
        target = self.folder / IR_FILE
        self.ov.save_model(self.models[built.label], str(target), compress_to_fp16=False)

    def discard(self) -> None:
        """The candidates' models let go: none of them was written to disk."""
        self.models.clear()


def present_layer_nodes(
    graph: onnx.ModelProto, float_model: Any, spec: EncoderSpec
) -> dict[int, list[onnx.NodeProto]]:
    """Each layer's nodes that OpenVINO's model still has (it fuses some away, such as the
    attention scores' MatMul): a plan names only those. A layer with no MatMul left would
    be "kept in float" while NNCF quantizes it, so that is an error."""
    by_layer = nodes_by_layer(graph, spec)
    present = {op.get_friendly_name() for op in float_model.get_ops()}
    layer_nodes = {
        layer: [node for node in nodes if node.name in present] for layer, nodes in by_layer.items()
    }
    if not all(any(node.op_type == "MatMul" for node in nodes) for nodes in layer_nodes.values()):
        fallback = PROVIDERS[Provider.OPENVINO].fallback or Provider.OPENVINO
        raise ConversionError(
            "OpenVINO's model has none of the export's MatMul nodes of some layers, so no layer "
            "can be kept in float. Please report this with your openvino and nncf versions; use ",
            Advice("precision", "bf16"),
            " or ",
            Advice("provider", fallback.value),
            " meanwhile.",
        )
    return layer_nodes


def feed_forward_outputs(
    graph: onnx.ModelProto, layer_nodes: dict[int, list[onnx.NodeProto]]
) -> tuple[str, ...]:
    """Each layer's feed-forward output MatMul: the last MatMul with a constant weight
    among its nodes (nodes are in the graph's topological order). Found by the graph's
    structure, not by node names, so every family's export is read the same way."""
    weights = {init.name for init in graph.graph.initializer}
    found = []
    for nodes in layer_nodes.values():
        weighted = [n for n in nodes if n.op_type == "MatMul" and n.input[1] in weights]
        if weighted:
            found.append(weighted[-1].name)
    return tuple(found)


@progress.step("OpenVINO int8: quantizing with NNCF, racing and judging plans")
def quantize_within_gate(
    job: BuildJob, open_session: Callable[[Any], OpenVINOSession]
) -> BuiltModel:
    """Quantize the exported model (``job.export``, only read) into ``IR_FILE`` beside
    ``job.path`` with the fastest plan that passes the gate and the judge (the pipeline's
    agreement) and outruns OpenVINO's float model (or the rivals of ``job.limits``), each
    plan's parity measured against PyTorch's outputs on :func:`parity_items`. Candidates
    are compiled from memory (``open_session``) and only the served one is written (on a
    refusal the cache removes the build folder)."""
    quantizer = OpenVINOQuantizer(job, open_session, job.limits.carried(StaticInt8Model))
    items = quantizer.calibration.items
    search = Int8Search(quantizer, gate=job.gate, judge=job.judge, items=items, limits=job.limits)
    built = search.run()
    return replace(built, parity=replace(built.parity, gate=job.gate))


def _as_named(plan: Plan, compiled: CompiledMatMuls) -> str | None:
    """Why the compiled plan does not do what its name says, or None. A dynamic int8 plan
    must quantize activations at run time: where the CPU plugin would not (no VNNI, or
    bf16 input), it is int8 weights with float arithmetic and not served as "dynamic"."""
    if isinstance(plan, DynamicInt8) and not compiled.dynamic_int8:
        return f"its activations are not quantized at run time here ({compiled.describe()})"
    return None
