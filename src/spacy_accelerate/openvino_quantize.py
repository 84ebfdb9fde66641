"""OpenVINO int8: NNCF post-training quantization, calibrated on real spans, with a gate.

NNCF quantizes the IR with statistics of the calibration items (SmoothQuant
and bias correction, its transformer preset). Checkpoints with outlier
activations lose too much when every projection is int8, so, as for ONNX
Runtime's int8, plans are tried in turn, keeping more of the feed-forward
block in float each time (found by weight shape, see
:mod:`spacy_accelerate.quantize`), until the model keeps every token's last
hidden state within ``min_cosine`` of PyTorch's on the calibration spans
(real text: random piece ids are out of the distribution it was calibrated
on). The plan that passed is recorded.
(NNCF's own accuracy-aware search reverts one operation at a time and took
minutes on MiniLM in our trials; the ladder costs one quantization per plan.)
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
import torch

from .architectures import DetectedEncoder
from .config import OptimizeConfig
from .errors import AccuracyError, ProviderUnavailableError
from .gate import Gate
from .openvino_runtime import INSTALL_HINT, IR_FILE, import_openvino
from .parity import ParityReport, check_parity
from .provider_options import SessionLayout
from .providers import ResolvedProvider
from .quantize import kept_matmuls

if TYPE_CHECKING:  # calibration imports the proxy, which imports this module
    from .calibration import Calibration

logger = logging.getLogger("spacy_accelerate")


def import_nncf() -> Any:
    try:
        return importlib.import_module("nncf")
    except ImportError as error:
        raise ProviderUnavailableError(
            f"NNCF is not installed ({error}); OpenVINO's int8 needs it. Install it with: "
            f"{INSTALL_HINT}"
        ) from error


def quantize_within_gate(
    onnx_path: Path,
    module: torch.nn.Module,
    detected: DetectedEncoder,
    config: OptimizeConfig,
    provider: ResolvedProvider,
    *,
    window: int,
    gate: Gate,
    layout: SessionLayout,
    calibration: Calibration,
    open_session: Any,
    judge: Callable[[Any], None] | None = None,
) -> tuple[Any, ParityReport]:
    """Quantize the exported model at ``onnx_path`` into ``IR_FILE`` beside it with the
    first plan that passes ``gate`` and ``judge`` (the pipeline's agreement); the ONNX
    file is removed."""
    ov, nncf = import_openvino(), import_nncf()
    spec = detected.spec
    float_model = ov.convert_model(str(onnx_path))
    names = [port.any_name for port in float_model.inputs]
    dataset = nncf.Dataset([item.feeds(names) for item in calibration.items])
    graph = onnx.load(str(onnx_path), load_external_data=False)
    target = onnx_path.with_name(IR_FILE)
    refused: list[str] = []
    for plan in config.int8.plans:
        kept = kept_matmuls(graph, spec, plan)
        quantized = nncf.quantize(
            float_model,
            dataset,
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(calibration.items),
            ignored_scope=nncf.IgnoredScope(names=kept, validate=False),
        )
        ov.save_model(quantized, str(target), compress_to_fp16=False)
        session = open_session(target)
        try:
            report = check_parity(
                module, detected, session, window=window, gate=gate, batches=calibration.items
            )
            if judge is not None:  # the pipeline's own annotations, with this candidate
                judge(session)
        except AccuracyError as error:
            refused.append(f"{plan.value} kept float ({len(kept)} MatMuls): {error}")
            continue
        onnx_path.unlink()
        logger.info(
            "OpenVINO int8 plan %r passed (calibration cosine %.5f)",
            plan.value,
            report.worst_cosine,
        )
        return session, replace(report, plan=plan.value)
    raise AccuracyError(
        "No int8 plan keeps this model within the gate, so no int8 model was served and the "
        "pipeline is unchanged. Use precision='bf16' or 'fp32', calibrate on texts like "
        "yours (calibration_texts=...), or lower min_cosine if less accuracy is enough for "
        "you. Plans tried: " + " | ".join(refused)
    )
