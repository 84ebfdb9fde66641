"""Step 6: get the exported model from the cache, or convert, export and store it.

A miss converts the curated encoder to Hugging Face, exports it to ONNX,
fuses or quantizes it (for OpenVINO: converts it to IR, and for int8
calibrates and quantizes it under accuracy control) and proves parity
*before* the cache entry is committed, so a model that fails the gate is
never stored. A hit is verified against its manifest by
the cache and, unless ``verify=False``, against the live PyTorch module.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .architectures import DetectedEncoder
from .buckets import DEFAULT_MAX_BATCH, BucketPlan
from .cache import CacheEntry, ModelCache
from .config import OptimizeConfig, Precision, Provider
from .errors import AccuracyError, CacheError
from .export import MODEL_FILE, GraphPlan, export_onnx, graph_plan, optimize_graph
from .fingerprint import cache_key, key_inputs
from .gate import Gate, recorded_report_meets
from .openvino_quantize import quantize_within_gate as quantize_for_openvino
from .openvino_runtime import IR_FILE, convert_to_ir, openvino_key
from .parity import ParityReport, check_parity
from .provider_options import SessionLayout
from .providers import ResolvedProvider
from .quantize import quantize_int8
from .runtime import EncoderSession
from .session_layout import open_session, session_layout
from .spot_check import SPOT_CHECK_FILE, load_spot_check, save_spot_check, spot_check_gate

if TYPE_CHECKING:  # calibration imports the proxy, which imports this module
    from .calibration import CalibrationSource

logger = logging.getLogger("spacy_accelerate")

#: The parity report stored beside the model (checksummed like every file).
PARITY_FILE = "parity.json"


@dataclass(frozen=True)
class ExportedModel:
    """Where the served model came from."""

    key: str
    path: Path
    cache_hit: bool
    seconds: float
    parity: ParityReport | None
    #: The int8 quantization plan served: chosen when the entry was built and read
    #: back from its manifest on a hit, verified again or not.
    plan: str | None = None
    #: The other int8 plans tried when the entry was built, and why each was refused.
    refused: tuple[str, ...] = ()


def _recorded(entry: CacheEntry) -> dict[str, Any]:
    """The parity report the entry was stored with; empty when it cannot be read."""
    try:
        report = json.loads(entry.file(PARITY_FILE).read_text())
    except (ValueError, OSError):
        return {}
    return report if isinstance(report, dict) else {}


def _recorded_report_meets(entry: CacheEntry, gate: Gate) -> bool:
    """Whether the parity the entry was stored with proves ``gate``; False if not on record."""
    report = _recorded(entry)
    return bool(report) and recorded_report_meets(report, gate)


def _quantize_within_gate(
    path: Path,
    module: torch.nn.Module,
    detected: DetectedEncoder,
    config: OptimizeConfig,
    provider: ResolvedProvider,
    *,
    window: int,
    gate: Gate,
    layout: SessionLayout,
) -> tuple[EncoderSession, ParityReport]:
    """Quantize the fp32 model at ``path`` with the first plan whose model passes ``gate``."""
    spec = detected.spec
    float_model = path.with_name(f"float-{path.name}")
    os.replace(path, float_model)
    if config.int8.fuse_first:
        optimize_graph(float_model, spec, GraphPlan(fuse=True))
    refused: list[str] = []
    for plan in config.int8.plans:
        kept = quantize_int8(float_model, path, spec, config.int8, plan)
        session = EncoderSession(path, provider, config, layout)
        try:
            report = check_parity(module, detected, session, window=window, gate=gate)
        except AccuracyError as error:
            refused.append(f"{plan.value} kept float ({kept} MatMuls): {error}")
            continue
        float_model.unlink()
        logger.info("int8 plan %r passed the gate (%d MatMuls kept float)", plan.value, kept)
        return session, replace(report, plan=plan.value, refused=tuple(refused))
    float_model.unlink()
    raise AccuracyError(
        "No int8 plan keeps this model within the gate, so no int8 model was served and the "
        "pipeline is unchanged. Use precision='fp32', or lower min_cosine if less accuracy is "
        "enough for you. Plans tried: " + " | ".join(refused)
    )


#: Judges a candidate session by what it does inside the pipeline (raises AccuracyError).
Judge = Callable[[Any, "ExportedModel"], None]


def _provisional(judge: Judge | None, key: str, path: Path) -> Callable[[Any], None] | None:
    """``judge`` for a session whose entry is not (yet) final."""
    if judge is None:
        return None
    provisional = ExportedModel(key=key, path=path, cache_hit=False, seconds=0.0, parity=None)
    return lambda session: judge(session, provisional)


def _export_options(
    config: OptimizeConfig, calibration: CalibrationSource | None = None
) -> dict[str, Any]:
    """The key's export options; OpenVINO's IR also depends on OpenVINO's release and on
    what this CPU can do, and a calibrated int8 model on its calibration texts and on the
    bounds its plan was chosen under."""
    options = config.export_options()
    if config.provider is Provider.OPENVINO:
        options["openvino"] = openvino_key(config.precision)
    if calibration is not None:
        options["calibration_sha256"] = calibration.digest
        options["judged_by_sha256"] = calibration.judged_by
        options["accuracy_control"] = {
            "min_mean_cosine": config.gate().min_mean_cosine,
            "min_agreement": config.agreement_bound,
        }
    return options


def _model_file(provider: Provider) -> str:
    """The file a cache entry serves for ``provider``."""
    return IR_FILE if provider is Provider.OPENVINO else MODEL_FILE


def _to_served_format(path: Path, provider: Provider) -> Path:
    """The exported ONNX file in the format ``provider`` loads: OpenVINO's IR is stored
    instead of the ONNX file (converting costs seconds on every load)."""
    if provider is not Provider.OPENVINO:
        return path
    ir = convert_to_ir(path, path.parent)
    path.unlink()
    return ir


def get_or_export(
    module: torch.nn.Module,
    detected: DetectedEncoder,
    config: OptimizeConfig,
    provider: ResolvedProvider,
    cache: ModelCache,
    *,
    window: int,
    buckets: BucketPlan | None = None,
    calibration: CalibrationSource | None = None,
    judge: Judge | None = None,
) -> tuple[EncoderSession, ExportedModel]:
    """Return a session over a verified ONNX model of ``module`` and its provenance.

    ``buckets`` are the GPU shapes (by default, derived from ``window`` alone). A
    calibrated model is built on all its ``calibration`` and ``judge``d in the pipeline;
    a cached one was, under the same texts and bounds (they are in the key), so a warm
    start only spot-checks its token cosine on the first calibration items, stored in
    the entry (no pipeline run).
    """
    start = time.perf_counter()
    spec = detected.spec
    if buckets is None:
        buckets = BucketPlan.for_pipeline(config.gpu, spec, window, DEFAULT_MAX_BATCH)
    inputs = key_inputs(module, spec, _export_options(config, calibration))
    key = cache_key(inputs)
    layout = session_layout(config, spec, buckets, cache, key)
    built: list[tuple[EncoderSession, ParityReport]] = []

    gate = config.gate()

    def build(folder: Path) -> dict[str, Any]:
        path = folder / MODEL_FILE
        hf_model = detected.architecture.to_hugging_face(detected.encoder, spec)
        export_onnx(hf_model, spec, path, opset=config.opset)
        del hf_model
        # ONNX Runtime holds the whole model in memory, so the session stays
        # valid after the folder is renamed into the cache: it is served as is.
        if config.precision is Precision.INT8 and config.provider is Provider.OPENVINO:
            if calibration is None:
                raise ValueError("OpenVINO's int8 needs calibration inputs")
            session, report = quantize_for_openvino(
                path,
                module,
                detected,
                window=window,
                gate=gate,
                calibration=calibration.full,
                # Candidates keep no compiled blobs: all but one are thrown away.
                open_session=lambda model: open_session(model, provider, config, layout, None),
                judge=_provisional(judge, key, folder),
            )
        elif config.precision is Precision.INT8:
            session, report = _quantize_within_gate(
                path, module, detected, config, provider, window=window, gate=gate, layout=layout
            )
        else:
            optimize_graph(path, spec, graph_plan(config.provider, config.precision))
            path = _to_served_format(path, config.provider)
            session = open_session(path, provider, config, layout, cache)
            report = check_parity(module, detected, session, window=window, gate=gate)
        recorded = report.as_dict()
        if calibration is not None:
            spot = save_spot_check(calibration.full.items, folder)
            measured = check_parity(
                module, detected, session, window=window, gate=Gate(), batches=spot
            )
            recorded["spot_check_mean_cosine"] = measured.worst_mean_cosine
        (folder / PARITY_FILE).write_text(json.dumps(recorded, indent=2))
        built.append((session, report))
        return {"plan": report.plan, "refused": list(report.refused)} if report.plan else {}

    result = cache.get_or_build(key, inputs, build)
    built_with = result.entry.manifest.get("built") or {}
    plan, refused = built_with.get("plan"), tuple(built_with.get("refused") or ())
    if built:
        session, parity = built[0]
    else:
        model = result.entry.file(_model_file(config.provider))
        session, parity = open_session(model, provider, config, layout, cache), None
    if parity is None and (config.verify or not _recorded_report_meets(result.entry, gate)):
        # A hit is checked again unless told not to; and always when it was
        # stored under a looser gate than this call asks for.
        batches, checked = None, gate
        if calibration is not None:
            batches = load_spot_check(result.entry.file(SPOT_CHECK_FILE))
            checked = spot_check_gate(gate, _recorded(result.entry).get("spot_check_mean_cosine"))
        parity = check_parity(
            module, detected, session, window=window, gate=checked, batches=batches
        )
        # A hit serves the plan it was built with.
        parity = replace(parity, plan=plan, refused=refused)
    exported = ExportedModel(
        key=key,
        path=result.entry.path,
        cache_hit=result.hit,
        seconds=time.perf_counter() - start,
        parity=parity,
        plan=plan,
        refused=refused,
    )
    logger.info(
        "%s %s %s encoder (key %s) in %.2f s; parity %s",
        "loaded cached" if exported.cache_hit else "exported",
        config.precision.value,
        spec.family,
        key[:12],
        exported.seconds,
        f"max abs diff {parity.worst:.2e}, min token cosine {parity.worst_cosine:.5f}"
        if parity
        else "not checked",
    )
    return session, exported


def reopen_session(
    exported: ExportedModel,
    provider: ResolvedProvider,
    config: OptimizeConfig,
    layout: SessionLayout,
) -> EncoderSession:
    """A new session over a model optimize() already verified (after pickling, say).

    The entry is checked against its manifest again; if it has gone, the
    pipeline must be optimized anew rather than run on something unverified.
    """
    cache = ModelCache(exported.path.parent)
    entry = cache.lookup(exported.key)
    if entry is None:
        raise CacheError(
            f"The cached model {exported.key[:12]} under {exported.path.parent} is missing or "
            "damaged. Call spacy_accelerate.optimize(nlp) on this pipeline again to rebuild it."
        )
    return open_session(entry.file(_model_file(config.provider)), provider, config, layout, cache)
