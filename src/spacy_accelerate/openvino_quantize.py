"""OpenVINO int8: NNCF post-training quantization, calibrated on real spans, under accuracy control.

NNCF quantizes the IR with statistics of the calibration items (its
transformer preset: SmoothQuant, bias correction, int8 activations and
per-channel int8 weights). The candidate must pass two gates on the
calibration documents: the token cosine of the hidden states to PyTorch's
(:meth:`~spacy_accelerate.config.OptimizeConfig.gate`) and the agreement of
the pipeline's own tags and entities with PyTorch's (the ``judge``).

When the all-int8 model fails, the transformer layers whose quantization
adds the most error go back to float, most harmful first: half of them is
tried first (if that fails, fewer would too: refused after two
quantizations), then one layer, two, four, ... and the first that passes is
served; each plan is quantized again by NNCF with those layers' MatMuls in
its ignored scope. A layer's harm is read off the all-int8 model's own
parity report, for free: how much the mean cosine drops from the hidden
state before the layer to the one after it. Beyond half the layers int8 is
no longer worth serving, and the request is refused. (NNCF's own
accuracy-aware search reverts one quantizer at a time with a full
evaluation after each; on MiniLM it took minutes and did not converge in our
trials, while this ladder costs at most log2(layers) + 2 quantizations.)

The layers left in float run in fp32 (an int8 model compiled with the bf16
hint gave bit-identical outputs in our trials: the CPU plugin did not apply it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import torch

from .architectures import DetectedEncoder
from .architectures.spec import EncoderSpec
from .config import Provider
from .errors import AccuracyError, AgreementError, ConversionError
from .gate import Gate
from .openvino_runtime import IR_FILE, import_openvino
from .parity import ParityReport, check_parity, reference_outputs
from .providers import import_runtime

if TYPE_CHECKING:  # calibration imports the proxy, which imports this module
    from .calibration import Calibration

logger = logging.getLogger("spacy_accelerate")


def import_nncf() -> Any:
    """NNCF makes OpenVINO's int8 (it comes with the same extra)."""
    return import_runtime("nncf", "NNCF (OpenVINO's int8 needs it)", Provider.OPENVINO)


def matmuls_by_layer(graph: onnx.ModelProto, spec: EncoderSpec) -> dict[int, list[str]]:
    """The MatMul nodes of each transformer layer (1-based), found by what the graph's
    outputs depend on: layer k's nodes feed ``hidden_state_k`` but not ``hidden_state_{k-1}``.
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
    layers: dict[int, list[str]] = {}
    for layer in range(1, len(ancestors)):
        fresh = ancestors[layer] - ancestors[layer - 1]
        layers[layer] = [
            node.name for node in graph.graph.node if node.op_type == "MatMul" and id(node) in fresh
        ]
    return layers


def layer_harm(report: ParityReport, spec: EncoderSpec) -> list[float]:
    """Per layer (1-based order): how much the mean cosine of the pieces spaCy reads
    drops across it in ``report``'s model (the hidden states are the first outputs)."""
    hidden = report.mean_cosine[: len(spec.hidden_state_names)]
    return [hidden[k - 1] - hidden[k] for k in range(1, len(hidden))]


@dataclass(frozen=True)
class FloatLayers:
    """A quantization plan: the transformer layers (1-based) left in float."""

    layers: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        if not self.layers:
            return "all layers int8"
        return "layers " + ", ".join(map(str, self.layers)) + " float"


def plan_ladder(harm: Sequence[float]) -> Iterator[FloatLayers]:
    """The plans after all-int8 failed: the most harmful layer, then 2, 4, ... and at
    most half of the layers, in float."""
    ranked = sorted(range(1, len(harm) + 1), key=lambda layer: harm[layer - 1], reverse=True)
    most = len(ranked) // 2
    if most == 0:  # one layer: in float, nothing would be int8
        return
    count = 1
    while True:
        yield FloatLayers(tuple(sorted(ranked[: min(count, most)])))
        if count >= most:
            return
        count *= 2


def quantize_within_gate(
    onnx_path: Path,
    module: torch.nn.Module,
    detected: DetectedEncoder,
    *,
    window: int,
    gate: Gate,
    calibration: Calibration,
    open_session: Callable[[Path], Any],
    judge: Callable[[Any], None] | None = None,
) -> tuple[Any, ParityReport]:
    """Quantize the exported model at ``onnx_path`` into ``IR_FILE`` beside it with the
    plan with the fewest float layers that passes ``gate`` and ``judge`` (the pipeline's
    agreement); then the ONNX file and every other candidate are removed (on a refusal
    the cache removes the whole build folder)."""
    ov, nncf = import_openvino(), import_nncf()
    float_model = ov.convert_model(str(onnx_path))
    names = [port.any_name for port in float_model.inputs]
    dataset = nncf.Dataset([item.feeds(names) for item in calibration.items])
    by_layer = matmuls_by_layer(onnx.load(str(onnx_path), load_external_data=False), detected.spec)
    # OpenVINO fuses some MatMuls away (the attention scores'); a plan names those it has.
    # A layer with none left would be "kept in float" while NNCF quantizes all of it.
    present = {op.get_friendly_name() for op in float_model.get_ops()}
    by_layer = {layer: [n for n in names if n in present] for layer, names in by_layer.items()}
    if not all(by_layer.values()):
        raise ConversionError(
            "OpenVINO's model has none of the export's MatMul nodes of some layers, so no layer "
            "can be kept in float. Please report this with your openvino and nncf versions; use "
            "precision='bf16' or provider='cpu' meanwhile."
        )
    items = calibration.items
    references = [reference_outputs(module, detected, item) for item in items]
    folder = onnx_path.parent
    refused: list[str] = []

    def attempt(plan: FloatLayers) -> _Candidate:
        kept = [name for layer in plan.layers for name in by_layer[layer]]
        quantized = nncf.quantize(
            float_model,
            dataset,
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(items),
            ignored_scope=nncf.IgnoredScope(names=kept, validate=False),
        )
        path = folder / f"plan-{len(plan.layers)}-{IR_FILE}"
        ov.save_model(quantized, str(path), compress_to_fp16=False)
        session = open_session(path)
        # Measured without a gate: the verdict also needs the agreement, and a refused
        # all-int8 model's report still ranks the layers.
        report = check_parity(
            module,
            detected,
            session,
            window=window,
            gate=Gate(),
            batches=items,
            references=references,
        )
        problem = _verdict(report, gate, session, judge)
        logger.info("OpenVINO int8 plan %r: %s", plan.label, problem or "passed")
        if problem is not None:
            refused.append(f"{plan.label}: {problem}")
        return _Candidate(plan, path, session, report, problem is None)

    chosen = first = attempt(FloatLayers())
    if not first.passed:
        # Half of the layers in float first: if even that fails, fewer will not pass
        # either, and the refusal costs two quantizations instead of the whole ladder.
        ladder = list(plan_ladder(layer_harm(first.report, detected.spec)))
        if ladder:
            chosen = attempt(ladder[-1])
        if chosen.passed:
            for plan in ladder[:-1]:
                candidate = attempt(plan)
                if candidate.passed:
                    chosen = candidate
                    break
    for candidate_file in folder.glob(f"plan-*-{Path(IR_FILE).stem}.*"):
        if chosen.passed and candidate_file.name.startswith(chosen.path.stem + "."):
            candidate_file.rename(folder / (Path(IR_FILE).stem + candidate_file.suffix))
        else:
            candidate_file.unlink()
    if not chosen.passed:
        raise AccuracyError(
            "No int8 plan with at most half of the layers in float keeps this model within "
            "the gate, so no int8 model was served and the pipeline is unchanged. Use "
            "precision='bf16' or 'fp32', calibrate on texts like yours (calibration_texts=...), "
            "or lower min_cosine / min_agreement if less accuracy is enough for you. Plans "
            "tried: " + " | ".join(refused)
        )
    onnx_path.unlink()
    logger.info(
        "OpenVINO int8 plan %r served (calibration mean cosine %.5f)",
        chosen.plan.label,
        chosen.report.worst_mean_cosine,
    )
    return chosen.session, replace(chosen.report, gate=gate, plan=chosen.plan.label)


@dataclass(frozen=True)
class _Candidate:
    plan: FloatLayers
    path: Path
    session: Any
    report: ParityReport
    passed: bool


def _verdict(
    report: ParityReport, gate: Gate, session: Any, judge: Callable[[Any], None] | None
) -> str | None:
    """Why the candidate is refused, or None when it passes both gates."""
    if not replace(report, gate=gate).passed:
        return (
            f"{gate.describe()} not met (mean cosine {report.worst_mean_cosine:.5f}, "
            f"smallest {report.worst_cosine:.5f})"
        )
    if judge is not None:
        try:
            judge(session)
        except AgreementError as error:
            return error.finding
    return None
