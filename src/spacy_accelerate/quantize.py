"""int8 for CPUs: ONNX Runtime's dynamic quantization of the exported encoder.

Weights of every MatMul become int8 (per tensor or per output channel);
activations are quantized on the fly. Embedding lookups, layer norms and
softmax stay float, which is where the accuracy lives. Whether the
transformer fusions run before quantizing is a choice of the recipe: on the
AVX-512/AMX CPUs this project measured, the unfused graph quantized faster
(see ``benchmarks/int8_recipes.py``), so that is the default.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("spacy_accelerate")


@dataclass(frozen=True)
class Int8Recipe:
    """How the int8 model is made; part of the cache key."""

    #: One scale per output channel of each weight instead of one per tensor.
    per_channel: bool = False
    #: Apply ONNX Runtime's transformer fusions (fused attention) before quantizing.
    fuse_first: bool = False


DEFAULT_INT8_RECIPE = Int8Recipe()

#: Operators whose weights are quantized: the projections of attention and the
#: feed-forward layers (``Attention`` appears only in a fused graph).
QUANTIZED_OPS = ("MatMul", "Attention")


def quantize_int8(path: Path, recipe: Int8Recipe) -> None:
    """Replace the fp32 model at ``path`` with its dynamically quantized int8 version.

    The model first goes through ONNX Runtime's quantization pre-processing
    (ONNX shape inference and graph clean-up; its symbolic shape inference
    cannot follow the dynamic mask arithmetic), the step its quantizer
    expects before it runs.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = path.with_name(f"{path.stem}.prepared{path.suffix}")
    quantized = path.with_name(f"{path.stem}.int8{path.suffix}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quant_pre_process(str(path), str(prepared), skip_symbolic_shape=True)
        quantize_dynamic(
            model_input=str(prepared),
            model_output=str(quantized),
            op_types_to_quantize=list(QUANTIZED_OPS),
            per_channel=recipe.per_channel,
            reduce_range=False,
            weight_type=QuantType.QInt8,
            extra_options={"MatMulConstBOnly": True},
        )
    os.replace(quantized, path)
    prepared.unlink()
    logger.debug("quantized %s to int8 (%s)", path.name, recipe)
