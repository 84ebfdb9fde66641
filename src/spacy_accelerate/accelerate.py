"""The public entry points: ``optimize()``, ``restore()`` and ``is_optimized()``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from spacy.language import Language

from .architectures import detect_architecture
from .buckets import BucketPlan
from .cache import ModelCache
from .calibration import agreement_judge, calibration_for, record_probe
from .config import MissingCache, OptimizeConfig, Precision, Provider, build_config
from .exported import get_or_export
from .fallback import fallback_chain, serve_first
from .gpu_options import GpuOptions
from .guard import install_training_guards, remove_training_guards
from .patch import exclusive, guard, is_patched, patch, reads_all_layers, revert, unpatch
from .persist import OptimizeRequest, forget, install_load_hooks, record, remove_load_hooks
from .providers import check_provider
from .proxy import AcceleratedModule, make_proxy
from .shim import find_shim, find_span_settings
from .validate import find_transformer_components, transformer_components
from .verification import Verification, declared_special_ids
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
    lock_timeout: float | None = None,
    missing_cache: str | MissingCache = "rebuild",
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
    PyTorch's on at least ``min_agreement`` (0.995) of the tokens; only their sha256 and
    count are saved with the pipeline. ``fallback=True`` walks TensorRT -> CUDA -> CPU
    when a provider cannot run here, with a warning, instead of raising.
    ``lock_timeout`` (seconds, default an hour) bounds the wait for another process
    building the same model. ``missing_cache`` says what the pipeline does when it is
    saved or pickled and loaded where its cache entry is missing: ``"rebuild"`` exports it
    again, ``"pytorch"`` runs on PyTorch with a warning (this call always builds).
    """
    config = build_config(  # 4. build the config (checked first: it fails fastest)
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
        lock_timeout=lock_timeout,
        missing_cache=missing_cache,
    )
    return apply_config(nlp, config, threads=threads)


def apply_config(
    nlp: Language,
    config: OptimizeConfig,
    *,
    threads: int | None,
    reloading: bool = False,
    request: OptimizeRequest | None = None,
) -> Language:
    """:func:`optimize` with its options already validated; ``reloading``: a saved or
    pickled pipeline being loaded, which exports only where ``config.missing_cache`` lets
    it (otherwise :class:`~.exported.CacheMissError`), and records ``request`` (what was
    loaded) rather than ``config`` (what it resolved to here)."""
    components = find_transformer_components(nlp)  # 1. validate
    shims = [find_shim(component) for component in components]  # 2. find the shim
    encoders = [detect_architecture(s.pytorch_module) for s in shims]  # 3. detect
    for location in shims:  # from here on, swaps wait for the batches in flight
        guard(location)
    cache = ModelCache(config.cache_dir, lock_timeout=config.lock_timeout)
    build_allowed = not reloading or config.missing_cache is MissingCache.REBUILD
    # What every model is checked on: random and control ids, and the pipeline's own
    # inputs on built-in text (recorded once, on PyTorch, before anything is swapped).
    checks = [
        Verification(
            window=find_span_settings(component).window,
            special_ids=declared_special_ids(component.pipe),
            probe=record_probe(nlp, location, detected.spec),
        )
        for component, location, detected in zip(components, shims, encoders, strict=True)
    ]

    def accelerate(attempt: OptimizeConfig) -> None:
        resolved = check_provider(attempt)  # 5. check the provider
        attempt = attempt.served_by(resolved.provider)  # ``auto`` decided
        previous = [location.module for location in shims]
        try:
            for component, location, detected, verification in zip(
                components, shims, encoders, checks, strict=True
            ):
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
                    verification=verification,
                    build_allowed=build_allowed,
                    exclusive=lambda location=location: exclusive(location),
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
    _remember(nlp, request or OptimizeRequest.from_config(config, threads=threads))
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
    come back. A no-op on a plain pipeline. The guard that makes swaps safe while other
    threads annotate stays on the transformer's layer (it changes no result), so a
    restored pipeline needs spacy-accelerate installed to be unpickled."""
    unpatch_all(nlp)
    remove_training_guards(nlp)
    remove_load_hooks(nlp)
    forget(nlp)
    return nlp


def is_optimized(nlp: Language) -> bool:
    """Whether every transformer component of ``nlp`` runs accelerated."""
    locations = [find_shim(component) for component in transformer_components(nlp)]
    return bool(locations) and all(is_patched(location) for location in locations)
