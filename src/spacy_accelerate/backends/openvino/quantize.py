"""OpenVINO int8: NNCF post-training quantization, calibrated on real spans, under accuracy control.

NNCF quantizes the IR with statistics of the calibration items (its
transformer preset: SmoothQuant, bias correction, int8 activations and
per-channel int8 weights). The candidate must pass two gates on the
calibration documents: the token cosine of the hidden states to PyTorch's
(:meth:`~spacy_accelerate.options.config.OptimizeConfig.gate`) and the agreement of
every annotation the pipeline sets with PyTorch fp32's (the ``judge``, see
:mod:`spacy_accelerate.verify.agreement`).

Plans are tried in this order, and the first that passes is served:

1. static int8, every MatMul (the all-int8 model), the fastest;
2. dynamic int8 (:class:`DynamicInt8`): int8 weights, activations quantized
   per token at run time, the rest in bf16 where the CPU has it, then (where
   that fails) the same in fp32; more accurate, at 79-84% of static int8's
   speed. A float-layer plan with one to three layers in bf16 can be faster,
   but where static int8 fails, those tend to fail too (trf-base needed eight
   of twelve), while dynamic int8 is one model to judge (two where the bf16
   one is refused);
3. float layers: the transformer layers whose static quantization adds the
   most error go back to float, most harmful first. The most float layers the
   ladder allows is tried first (all layers but one where they run in bf16,
   half of them in fp32; if that fails, fewer would too), then the fewest
   that pass are found by bisection (the plans are nested). Where the CPU has
   bf16 and no bf16 plan passes, the fp32 ladder is searched the same way:
   bf16's own error can be what fails the gate.

A refusal costs three models judged (five where the CPU has bf16). Each
float-layer plan is the all-int8 model with its layers' MatMuls put back in
float (:mod:`~spacy_accelerate.backends.openvino.float_layers`), not another quantization. A layer's
harm is read off the all-int8 model's own parity report, for free: how much
the mean cosine drops from the hidden state before the layer to the one after
it. The
plan is logged and recorded in the manifest, so how much of the model is
int8, and how, is never hidden. (NNCF's own accuracy-aware search reverts one
quantizer at a time with a full evaluation after each; on MiniLM it took
minutes and did not converge in our trials, while this quantizes once and
judges at most eight models for 12 layers: static, dynamic in bf16 and in
fp32, then at most five plans of the bf16 ladder, or its last plan and at
most four of the fp32 ladder.)

What each plan was judged with (the float part's precision, dynamic int8's
group size) is recorded in its IR
(:func:`~spacy_accelerate.backends.openvino.session.compile_settings`),
so each plan is compiled again, on a warm start, exactly as it was judged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from spacy_accelerate import progress
from spacy_accelerate.architectures import DetectedEncoder
from spacy_accelerate.architectures.spec import EncoderSpec
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
    float_part_hints,
    import_openvino,
    speed_baseline,
)
from spacy_accelerate.backends.openvino.speed import race
from spacy_accelerate.cpu_features import cpu_features
from spacy_accelerate.errors import (
    AgreementError,
    ConversionError,
    NoFasterPlanError,
)
from spacy_accelerate.options.gate import Gate
from spacy_accelerate.runtime.providers import import_runtime
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.verify.calibration import Calibration, Judge
from spacy_accelerate.verify.parity import ParityReport, check_parity
from spacy_accelerate.verify.plan_search import (
    Judged,
    PlanSearch,
    bisect_ladder,
    float_layer_ladder,
    layer_harm,
)

logger = logging.getLogger("spacy_accelerate")


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

    Why: trf-base encoder, one 16 x 128 batch: all-int8 0.51 s, half of the layers
    in bf16 0.70 s, in fp32 1.15 s; the bf16 model 0.90 s, fp32 1.78 s. Each float
    layer adds its share of the difference, so with bf16 float layers even eleven
    of twelve (about 0.87 s by that count; not measured) stay ahead of the bf16
    model, while fp32 float layers past half would cost most of what int8 gains.
    On trf-base, whose random heads flip tags at the smallest change, the default
    gate needed eight of twelve layers in bf16."""
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

    Why it comes right after static int8: scales made for each token follow the
    activations more closely than NNCF's static ones, at 79-84% of their speed.
    trf-base encoder on real spans, speeds relative to fp32
    (``benchmarks/openvino_dynamic_int8.py``,
    ``benchmarks/results/openvino_dynamic_int8-trf-base.json``): static int8 3.26x;
    dynamic int8 in groups of 128 2.75x with the rest in bf16, 2.59x in fp32 (2.08x
    with OpenVINO's default groups of 32 and fp32); bf16 1.90x. Smallest token
    cosine to fp32: 0.99687 static, 0.99989 dynamic. On trf-base's 4,913 tags of the
    previous calibration sample, static int8 changed 38-39, dynamic int8 23 with bf16
    and 20 with fp32 (development runs, before the Wilson rule). Larger
    groups were faster (256: 2.88x with bf16) but changed 38 tags with bf16 and
    24 with fp32, 768 changed 30 with fp32: 128 keeps a margin.
    """

    group_size: int = DYNAMIC_INT8_GROUP_SIZE
    hint: str = "f32"

    @property
    def label(self) -> str:
        return (
            f"dynamic int8 (activations per token, groups of {self.group_size}; "
            f"the rest {_named(self.hint)})"
        )


def _named(hint: str) -> str:
    """How a plan's label names the OpenVINO hint its float part runs in."""
    return "bf16" if hint == "bf16" else "fp32"


Plan = FloatLayers | DynamicInt8


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


@progress.step("OpenVINO int8: quantizing with NNCF and judging plans")
def quantize_within_gate(
    onnx_path: Path,
    module: torch.nn.Module,
    detected: DetectedEncoder,
    *,
    gate: Gate,
    calibration: Calibration,
    references: list[list[np.ndarray]],
    open_session: Callable[[Path], OpenVINOSession],
    judge: Judge | None = None,
) -> tuple[Session, ParityReport]:
    """Quantize the exported model at ``onnx_path`` into ``IR_FILE`` beside it with the
    plan with the fewest float layers that passes ``gate`` and ``judge`` (the pipeline's
    agreement), judged against ``references`` (PyTorch's outputs on the calibration
    items); then the ONNX file and every other candidate are removed (on a refusal
    the cache removes the whole build folder)."""
    ov, nncf = import_openvino(), import_nncf()
    float_model = ov.convert_model(str(onnx_path))
    names = [port.any_name for port in float_model.inputs]
    dataset = nncf.Dataset([item.feeds(names) for item in calibration.items])
    by_layer = nodes_by_layer(onnx.load(str(onnx_path), load_external_data=False), detected.spec)
    # OpenVINO fuses some nodes away (the attention scores' MatMul); a plan names those it
    # has. A layer with no MatMul left would be "kept in float" while NNCF quantizes it.
    present = {op.get_friendly_name() for op in float_model.get_ops()}
    layer_nodes = {
        layer: [node for node in nodes if node.name in present] for layer, nodes in by_layer.items()
    }
    if not all(any(node.op_type == "MatMul" for node in nodes) for nodes in layer_nodes.values()):
        raise ConversionError(
            "OpenVINO's model has none of the export's MatMul nodes of some layers, so no layer "
            "can be kept in float. Please report this with your openvino and nncf versions; use "
            "precision='bf16' or provider='cpu' meanwhile."
        )
    items = calibration.items
    folder = onnx_path.parent
    search: PlanSearch[OpenVINOSession] = PlanSearch()
    built: dict[str, _Built] = {}  # by plan label: what a judged plan left, and its report

    def quantize(kept: list[str]) -> Any:
        progress.note(f"NNCF post-training quantization on {len(items)} calibration items")
        with quietly():
            return nncf.quantize(
                float_model,
                dataset,
                model_type=nncf.ModelType.TRANSFORMER,
                subset_size=len(items),
                ignored_scope=nncf.IgnoredScope(names=kept, validate=False),
            )

    all_int8 = quantize([])

    @functools.cache
    def compressed_weights() -> Any:
        """Made once for the dynamic plans (one per hint), and only where static int8
        failed: NNCF's weight compression takes seconds on trf-base."""
        progress.note("NNCF weight compression (int8 weights)")
        with quietly():
            return nncf.compress_weights(
                float_model.clone(), mode=nncf.CompressWeightsMode.INT8_ASYM
            )

    def with_plan(plan: Plan) -> Any:
        """The plan's model; what it records in its IR is how a warm start compiles it."""
        if isinstance(plan, DynamicInt8):
            compressed = compressed_weights().clone()
            compressed.set_rt_info(plan.group_size, DYNAMIC_QUANTIZATION_RT_INFO)
            compressed.set_rt_info(plan.hint, FLOAT_LAYERS_RT_INFO)
            return compressed
        if not plan.layers:
            return all_int8
        kept = [node.name for layer in plan.layers for node in layer_nodes[layer]]
        # Seconds instead of another quantization; NNCF where the graph is unusual.
        quantized = with_float_layers(all_int8, float_model, kept)
        if quantized is None:
            logger.info("OpenVINO int8 plan %r: quantized again by NNCF", plan.label)
            quantized = quantize(kept)
        quantized.set_rt_info(plan.hint, FLOAT_LAYERS_RT_INFO)
        return quantized

    @functools.cache
    def baseline() -> OpenVINOSession:
        """The float model every plan must beat
        (:func:`~spacy_accelerate.backends.openvino.session.speed_baseline`),
        compiled as a served bf16 (or fp32) model is."""
        model = float_model.clone()
        model.set_rt_info("bf16" if speed_baseline() == "bf16" else "f32", FLOAT_LAYERS_RT_INFO)
        path = folder / f"plan-baseline-{IR_FILE}"
        ov.save_model(model, str(path), compress_to_fp16=False)
        return open_session(path)

    def attempt(plan: Plan) -> Judged[OpenVINOSession]:
        search.trying(plan.label)
        quantized = with_plan(plan)
        path = folder / f"plan-{_file_stem(plan)}-{IR_FILE}"
        ov.save_model(quantized, str(path), compress_to_fp16=False)
        session = open_session(path)
        compiled_as = compiled_matmuls(session.compiled)
        # Measured without a gate: the verdict also needs the agreement, and a refused
        # all-int8 model's report still ranks the layers.
        report = check_parity(
            module,
            detected,
            session,
            gate=Gate(),
            batches=items,
            references=references,
        )
        problem, slower = _as_named(plan, compiled_as), False
        if problem is None:  # timed before the agreement gate, the expensive one
            progress.note(f"racing {_named_plan(plan)} against {speed_baseline()}")
            timing = race(session, baseline(), items, speed_baseline())
            problem, slower = (None, False) if timing.faster else (timing.finding(), True)
        disagreed = False
        if problem is None:
            problem, report, disagreed = _verdict(report, gate, session, judge)
        logger.info(
            "OpenVINO int8 plan %r (%s): %s",
            plan.label,
            compiled_as.describe(),
            problem or "passed",
        )
        built[plan.label] = _Built(path, slower, report)
        report = replace(report, compiled_as=compiled_as.describe())
        return search.judged(plan.label, session, report, problem, by_agreement=disagreed)

    chosen = static = attempt(FloatLayers())
    harm = layer_harm(built[static.label].report, detected.spec)  # how static int8 hurts each layer
    static_slower = built[static.label].slower
    if not chosen.passed:
        group = dynamic_group_size(float_model)
        dynamic = [DynamicInt8(group, hint) for hint in dynamic_int8_hints(group)]
        chosen = search.first_passing(dynamic, attempt) or chosen  # where activations are quantized
        compressed_weights.cache_clear()  # the float-layer plans do not read it
    if not chosen.passed and static_slower:
        search.note(
            "float layers: not tried (each plan is the all-int8 model with layers back in "
            f"float, and that was not faster than {speed_baseline()})"
        )
    elif not chosen.passed:
        for hint in float_part_hints():  # in fp32, at most half of the layers, as without bf16
            ladder = list(plan_ladder(harm, float_in_bf16=hint == "bf16"))
            chosen = bisect_ladder(ladder, attempt) or chosen
            if chosen.passed:
                break
    chosen_path = built[chosen.label].path
    for candidate_file in folder.glob(f"plan-*-{Path(IR_FILE).stem}.*"):
        if chosen.passed and candidate_file.name.startswith(chosen_path.stem + "."):
            candidate_file.rename(folder / (Path(IR_FILE).stem + candidate_file.suffix))
        else:
            candidate_file.unlink()
    if not chosen.passed and static_slower:
        floats = speed_baseline()
        raise NoFasterPlanError(
            f"No int8 plan both keeps this model within the gate and runs faster than "
            f"{floats} on this CPU ({cpu_features().describe()}), so no int8 model was "
            f"served and the pipeline is unchanged. Use precision='{floats}' here. Plans "
            f"tried: {search.tried()}"
        )
    if not chosen.passed:
        raise search.no_plan(
            "Use precision='bf16' or 'fp32', calibrate on texts like yours "
            "(calibration_texts=...), or lower min_cosine / min_agreement if less accuracy "
            "is enough for you."
        )
    onnx_path.unlink()
    logger.info(
        "OpenVINO int8 plan %r served (calibration mean cosine %.5f)",
        chosen.label,
        built[chosen.label].report.worst_mean_cosine,
    )
    session, report = search.served(chosen)
    return session, replace(report, gate=gate)


def _named_plan(plan: Plan) -> str:
    """How a progress note names a plan in a few words."""
    if isinstance(plan, DynamicInt8):
        return f"dynamic int8 ({_named(plan.hint)})"
    return plan.label if not plan.layers else f"{len(plan.layers)} float layers"


def _file_stem(plan: Plan) -> str:
    """A candidate's file name: every plan judged in one build has its own."""
    if isinstance(plan, DynamicInt8):
        return f"dynamic-{plan.group_size}-{plan.hint}"
    return f"{len(plan.layers)}-{plan.hint}" if plan.layers else "int8"


@dataclass(frozen=True)
class _Built:
    """What a judged plan left on disk, whether it lost the speed race, and its parity
    report (measured without a gate: a refused all-int8 model's still ranks the layers)."""

    path: Path
    slower: bool
    report: ParityReport


def _as_named(plan: Plan, compiled: CompiledMatMuls) -> str | None:
    """Why the compiled plan does not do what its name says, or None. A dynamic int8 plan
    must quantize activations at run time: where the CPU plugin would not (no VNNI, or
    bf16 input), it is int8 weights with float arithmetic and not served as "dynamic"."""
    if isinstance(plan, DynamicInt8) and not compiled.dynamic_int8:
        return f"its activations are not quantized at run time here ({compiled.describe()})"
    return None


def _verdict(
    report: ParityReport, gate: Gate, session: Session, judge: Judge | None
) -> tuple[str | None, ParityReport, bool]:
    """Why the candidate is refused (None when it passes both gates), its report with the
    pipeline's agreement where it was judged, and whether the agreement refused it."""
    if not replace(report, gate=gate).passed:
        return (
            f"{gate.describe()} not met (mean cosine {report.worst_mean_cosine:.5f}, "
            f"smallest {report.worst_cosine:.5f})",
            report,
            False,
        )
    if judge is not None:
        try:
            return None, replace(report, agreement=judge(session)), False
        except AgreementError as error:
            return error.finding, report, True
    return None, report, False
