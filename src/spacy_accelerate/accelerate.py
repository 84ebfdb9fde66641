"""The public entry points: ``optimize()``, ``restore()`` and ``is_optimized()``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from spacy.language import Language

from .architectures import detect_architecture
from .buckets import BucketPlan
from .cache import ModelCache
from .calibration import agreement_judge, calibration_for
from .config import OptimizeConfig, Precision, Provider, build_config
from .exported import get_or_export
from .fallback import fallback_chain, serve_first
from .gpu_options import GpuOptions
from .guard import install_training_guards, remove_training_guards
from .patch import is_patched, patch, reads_all_layers, revert, unpatch
from .persist import OptimizeRequest, forget, install_load_hooks, record, remove_load_hooks
from .providers import check_provider
from .proxy import AcceleratedModule, make_proxy
from .shim import find_shim, find_span_settings
from .validate import find_transformer_components, transformer_components
from .warmup import warm_up


def optimize(
    nlp: Language,
    provider: str | Provider = "auto",
    precision: str | Precision = "fp32",
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    warmup: bool = True,
    verify: bool = True,
    tolerance: float | None = None,
    min_cosine: float | None = None,
    threads: int | None = None,
    device_id: int | None = None,
    fallback: bool = False,
    gpu: GpuOptions | Mapping[str, Any] | None = None,
    calibration_texts: Sequence[str] | None = None,
    min_agreement: float | None = None,
) -> Language:
    """Run every transformer of ``nlp`` on ONNX Runtime; mutate and return ``nlp``.

    All or nothing: if any step fails for any component, every component is
    left exactly as it was before the call (PyTorch, or an earlier
    acceleration) and the error says why. Calling it on an optimized pipeline
    re-optimizes it with the new options. Once accelerated, the pipeline is
    inference-only until :func:`restore`, and ``nlp.to_disk`` saves it so that
    ``spacy.load`` accelerates it again (see :mod:`spacy_accelerate.persist`).

    ``tolerance`` (fp32: largest absolute difference to PyTorch, default 1e-4
    on a CPU, 1e-3 on a GPU) and ``min_cosine`` (fp16 0.999, int8 0.99) are
    the accuracy gate. ``device_id`` and ``gpu`` (buckets, CUDA graphs,
    TensorRT's builder: :class:`~spacy_accelerate.GpuOptions`) shape the GPU
    providers. OpenVINO's int8 is calibrated on ``calibration_texts`` (default: a
    built-in English sample) and served only if, on them, the mean token cosine is
    at least ``min_cosine`` (0.995) and the pipeline's tags and entities stay as
    PyTorch's on at least ``min_agreement`` (0.995) of the tokens. ``fallback=True``
    walks TensorRT -> CUDA -> CPU when a provider cannot run here, with a warning,
    instead of raising.
    """

    components = find_transformer_components(nlp)  # 1. validate
    shims = [find_shim(component) for component in components]  # 2. find the shim
    encoders = [detect_architecture(s.pytorch_module) for s in shims]  # 3. detect
    config = build_config(  # 4. build the config
        provider,
        precision,
        cache_dir=cache_dir,
        warmup=warmup,
        verify=verify,
        tolerance=tolerance,
        min_cosine=min_cosine,
        threads=threads,
        device_id=device_id,
        fallback=fallback,
        gpu=gpu,
        calibration_texts=calibration_texts,
        min_agreement=min_agreement,
    )
    cache = ModelCache(config.cache_dir)

    def accelerate(attempt: OptimizeConfig) -> None:
        resolved = check_provider(attempt)  # 5. check the provider
        attempt = attempt.served_by(resolved.provider)  # ``auto`` decided
        previous = [location.module for location in shims]
        try:
            for component, location, detected in zip(components, shims, encoders, strict=True):
                spans = find_span_settings(component)
                module = location.pytorch_module
                buckets = BucketPlan.for_pipeline(
                    attempt.gpu, detected.spec, spans.window, spans.batch_size
                )
                calibration = calibration_for(nlp, location, detected.spec, attempt)
                judge = (
                    agreement_judge(calibration, module, attempt.agreement_bound)
                    if calibration is not None
                    else None
                )
                session, exported = get_or_export(  # 6. get or export the ONNX model
                    module,
                    detected,
                    attempt,
                    resolved,
                    cache,
                    window=spans.window,
                    buckets=buckets,
                    calibration=calibration,
                    judge=judge,
                )
                proxy = make_proxy(module, session, detected.spec, exported)  # 7. create the proxy
                patch(location, proxy)  # 8. patch
                if attempt.warmup:
                    warm_up(proxy, spans, reads_all_layers(location))  # 9. warm up
        except BaseException:
            for location, module in zip(shims, previous, strict=True):
                revert(location, module)
            raise

    # With fallback=True, steps 5-9 run again on the next provider when one cannot serve.
    serve_first(fallback_chain(config), accelerate)
    _remember(nlp, OptimizeRequest.from_config(config, threads=threads))
    return nlp


def _remember(nlp: Language, request: OptimizeRequest) -> None:
    """Make the acceleration part of the pipeline: guarded against training, recorded in
    its config for ``to_disk``, and re-applied when new weights are loaded."""
    install_training_guards(nlp)
    record(nlp, request)
    install_load_hooks(nlp, request)


def accelerated_components(nlp: Language) -> dict[str, AcceleratedModule]:
    """The accelerated transformer modules of ``nlp``, by component name."""
    found: dict[str, AcceleratedModule] = {}
    for component in transformer_components(nlp):
        module = find_shim(component).module
        if isinstance(module, AcceleratedModule):
            found[component.name] = module
    return found


def unpatch_all(nlp: Language) -> None:
    """Put every PyTorch transformer back, keeping the record of the acceleration."""
    for component in transformer_components(nlp):
        unpatch(find_shim(component))


def restore(nlp: Language) -> Language:
    """Undo :func:`optimize`: the PyTorch transformers, training and a plain saved config
    come back. A no-op on a plain pipeline."""
    unpatch_all(nlp)
    remove_training_guards(nlp)
    remove_load_hooks(nlp)
    forget(nlp)
    return nlp


def is_optimized(nlp: Language) -> bool:
    """Whether every transformer component of ``nlp`` runs accelerated."""
    locations = [find_shim(component) for component in transformer_components(nlp)]
    return bool(locations) and all(is_patched(location) for location in locations)
