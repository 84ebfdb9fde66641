"""A quantization plan's model made from the all-int8 one: chosen layers put back in float.

Accuracy control tries plans that keep some layers in float. NNCF would
quantize the whole model again for each, and a quantization is most of a
cold build (measured: ``docs/openvino.md``). Its statistics, SmoothQuant
scales and fast bias correction are all computed per node from the float
model, so one layer's quantization does not depend on which other layers
are quantized: the plan is the all-int8 model with the layers' MatMuls
given back their float inputs, weights and biases, and their other
quantizers (the attention's query and key) bypassed. The result equals
NNCF's own quantization with those layers in its ignored scope (within
1e-5 on the test models) and takes a small fraction of a quantization's
time.

Each plan is still measured by both gates before it can be served. Where the
graph around a MatMul is not the one NNCF makes (another NNCF or OpenVINO
release), nothing is guessed: the caller quantizes with NNCF instead.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from spacy_accelerate.backends.openvino.session import import_openvino

logger = logging.getLogger("spacy_accelerate")

#: NNCF's SmoothQuant scaling node ends with this name.
SMOOTH_QUANT_SUFFIX = "nncf_smooth_quant"


def with_float_layers(quantized: Any, float_model: Any, nodes: Collection[str]) -> Any | None:
    """A copy of the NNCF-quantized ``quantized`` in which the nodes named ``nodes`` (some
    layers') compute in float, as in ``float_model`` (both ``ov.Model``): each quantized
    MatMul reads the float activation, weight and bias again, and each other quantizer
    whose readers are all among ``nodes`` (the attention's query and key) is bypassed.
    None where a MatMul's surroundings are not what NNCF makes."""
    opset = import_openvino().opset13
    model = quantized.clone()
    served = {op.get_friendly_name(): op for op in model.get_ops()}
    original = {op.get_friendly_name(): op for op in float_model.get_ops()}
    for name in nodes:
        node, reference = served.get(name), original.get(name)
        if node is None or reference is None:
            return None
        if node.get_type_name() != "MatMul" or _sources(node) == _sources(reference):
            continue  # not a MatMul, or one NNCF left float
        if not _revert_matmul(node, reference, original, opset):
            return None
    kept = set(nodes)
    for node in model.get_ops():
        readers = list(node.output(0).get_target_inputs()) if node.get_output_size() else []
        if (
            node.get_type_name() == "FakeQuantize"
            and readers
            and all(reader.get_node().get_friendly_name() in kept for reader in readers)
        ):
            for reader in readers:
                reader.replace_source_output(node.input_value(0))
    # What the plan claims: no kept node reads a quantizer or SmoothQuant's scaling.
    for node in model.get_ops():
        if node.get_friendly_name() in kept and any(
            value.get_node().get_type_name() == "FakeQuantize"
            or value.get_node().get_friendly_name().endswith(SMOOTH_QUANT_SUFFIX)
            for value in node.input_values()
        ):
            logger.debug("%s still reads a quantized input", node.get_friendly_name())
            return None
    model.validate_nodes_and_infer_types()
    return model


def _revert_matmul(matmul: Any, reference: Any, original: dict[str, Any], opset: Any) -> bool:
    """Give ``matmul`` the float inputs and bias of ``reference``; False where its inputs
    are not NNCF's pattern (quantized activation, constant float weight in the original)."""
    activation = _before_quantization(matmul.input_value(0))
    expected = _source(reference.input_value(0))
    weight = reference.input_value(1).get_node()
    if _source(activation) != expected or not _is_constant(weight):
        logger.debug(
            "MatMul %s: input %s (float model: %s), weight %s: not NNCF's pattern",
            matmul.get_friendly_name(),
            _source(activation),
            expected,
            weight.get_type_name(),
        )
        return False
    matmul.input(0).replace_source_output(activation)
    matmul.input(1).replace_source_output(_copy(opset, weight))
    for target in matmul.output(0).get_target_inputs():
        bias_add = target.get_node()
        float_add = original.get(bias_add.get_friendly_name())
        if bias_add.get_type_name() != "Add" or float_add is None:
            continue
        for port in range(2):  # bias correction changed the constant: the original back
            bias = float_add.input_value(port).get_node()
            if _is_constant(bias):
                bias_add.input(port).replace_source_output(_copy(opset, bias))
    return True


def _before_quantization(value: Any) -> Any:
    """The float output behind a MatMul's quantized input: past the FakeQuantize and
    SmoothQuant's scaling."""
    node = value.get_node()
    if node.get_type_name() == "FakeQuantize":
        value = node.input_value(0)
        node = value.get_node()
    if node.get_type_name() == "Multiply" and node.get_friendly_name().endswith(
        SMOOTH_QUANT_SUFFIX
    ):
        value = node.input_value(0)
    return value


def _source(value: Any) -> tuple[str, int]:
    return value.get_node().get_friendly_name(), value.get_index()


def _sources(node: Any) -> list[tuple[str, int]]:
    return [_source(value) for value in node.input_values()]


def _is_constant(node: Any) -> bool:
    return node.get_type_name() == "Constant"


def _copy(opset: Any, constant: Any) -> Any:
    return opset.constant(constant.get_data(), constant.get_output_element_type(0)).output(0)
