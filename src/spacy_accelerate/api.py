"""The public entry points: ``optimize()``, ``restore()`` and ``is_optimized()``."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from spacy.language import Language
from spacy.util import registry

from spacy_accelerate.architectures import DetectedEncoder, detect_architecture
from spacy_accelerate.backends.base import ServeRequest
from spacy_accelerate.backends.registry import (
    check_provider,
    fallback_chain,
    precision_candidates,
    serve_first,
)
from spacy_accelerate.cache.provenance import PipelineSource
from spacy_accelerate.cache.store import ModelCache
from spacy_accelerate.errors import Advice, CacheMissError, spelled
from spacy_accelerate.options.config import (
    DEFAULT_OVERLAP,
    MissingCache,
    OptimizeConfig,
    Precision,
    Provider,
    Workload,
)
from spacy_accelerate.options.gpu import GpuOptions
from spacy_accelerate.options.request import OptimizeOptions, OptimizeRequest, validate
from spacy_accelerate.pipeline import (
    CALLBACK_NAME,
    CALLBACK_NAME_V1,
    AfterCreation,
    ApiCalls,
    ShimLocation,
    accelerated_components,
    declared_special_ids,
    exclusive,
    find_shim,
    find_span_settings,
    find_transformer_components,
    guard,
    is_optimized,
    remember,
    restore,
    revert,
    serve_in,
    served_transformers,
    unpatch_all,
)
from spacy_accelerate.planning import (
    CalibrationSources,
    Candidate,
    Choice,
    agreement_judge,
    choose,
    plan_overlap,
    record_probe,
)
from spacy_accelerate.provision.bundle import (
    BUNDLE_DIR,
    Bundle,
    Unservable,
    read_bundle,
    remove_bundle,
    serve_bundled,
    write_bundle,
)
from spacy_accelerate.provision.exports import SharedExport
from spacy_accelerate.provision.get_or_export import ExportedModel, get_or_export
from spacy_accelerate.provision.references import References
from spacy_accelerate.provision.requirements import require_library, runtime_extras
from spacy_accelerate.runtime.buckets import BucketPlan
from spacy_accelerate.runtime.providers import ResolvedProvider
from spacy_accelerate.serving.proxy import make_proxy
from spacy_accelerate.verify.speed import NO_LIMITS, Limits
from spacy_accelerate.verify.verification import Verification

logger = logging.getLogger("spacy_accelerate")

__all__ = [
    "accelerated_components",
    "apply_config",
    "is_optimized",
    "make_optimize_callback",
    "optimize",
    "restore",
    "unpatch_all",
]


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
    min_agreement: float | Mapping[str, float] | None = None,
    lock_timeout: float | None = None,
    missing_cache: str | MissingCache = "rebuild",
    bundle: bool = True,
    overlap: bool | None = DEFAULT_OVERLAP,
    workload: str | Workload = "batches",
) -> Language:
    """Serve every transformer of ``nlp`` by ``provider`` (ONNX Runtime's providers or
    OpenVINO) in ``precision``; mutate and return ``nlp``.

    All or nothing: if any step fails for any component, every component is left exactly
    as it was (PyTorch, or an earlier acceleration) and the error says why. Calling it on
    an optimized pipeline re-optimizes it. The pipeline is inference-only until
    :func:`restore`, and ``nlp.to_disk`` saves it so that ``spacy.load`` serves it again
    (:mod:`spacy_accelerate.pipeline.persist`).

    fp32 is held to PyTorch within ``tolerance``; a lossy precision (``int8``, ``bf16``,
    ``fp16``) is judged by the whole pipeline's agreement with PyTorch fp32 on
    ``calibration_texts`` (``min_cosine``, ``min_agreement``), and ``auto`` serves the
    fastest plan here that passes. Every option, its default and which requests read it:
    ``docs/api.md`` (the defaults live in :mod:`spacy_accelerate.options.config`). An
    option that no plan of the request would read raises
    :class:`~spacy_accelerate.errors.InvalidOptionError` naming it
    (:mod:`spacy_accelerate.options.applicability`).

    Once served, one INFO line per accelerated component on the ``spacy_accelerate``
    logger says what serves it (provider, precision, plan, cache hit or export, key).
    """
    given = locals()
    options = OptimizeOptions(**{f.name: given[f.name] for f in fields(OptimizeOptions)})
    config = validate(options)  # 4. build the config (checked first: it fails fastest)
    return apply_config(nlp, config, threads=threads)


def apply_config(
    nlp: Language,
    config: OptimizeConfig,
    *,
    threads: int | None,
    reloading: bool = False,
    request: OptimizeRequest | None = None,
    folder: Path | None = None,
) -> Language:
    """:func:`optimize` with its options already validated; ``reloading``: a saved or
    pickled pipeline being loaded, which exports only where ``config.missing_cache`` lets
    it (otherwise :class:`~spacy_accelerate.errors.CacheMissError`), and records
    ``request`` (what was loaded) rather than ``config`` (what it resolved to here);
    ``folder``: the pipeline folder it was loaded from (where its PyTorch weights are read
    back from: :mod:`~spacy_accelerate.pipeline.parking`)."""
    accelerator = Accelerator(nlp, config, reloading=reloading)
    shims = [target.location for target in accelerator.targets]
    choice = None
    try:
        if config.precision is Precision.AUTO:  # steps 5-9 for each candidate, fastest kept
            first = accelerator.targets[0]
            source = accelerator.sources.texts_of(first.location, first.detected.spec, config)
            candidates = [Candidate(p, q) for p, q in precision_candidates(config)]
            choice = choose(nlp, config, candidates, shims, source, accelerator.cache, accelerator)
        else:
            # With fallback=True, steps 5-9 run again on the next provider when one fails.
            serve_first(fallback_chain(config), accelerator)
    finally:
        accelerator.close()
    request = request or OptimizeRequest.from_config(config, threads=threads)
    _after_serving(nlp, request, config, folder, choice)
    return nlp


def _after_serving(
    nlp: Language,
    request: OptimizeRequest,
    config: OptimizeConfig,
    folder: Path | None,
    choice: Choice | None = None,
) -> None:
    """Steps 10-12, once every transformer is served, by ``optimize()`` or by a load (from
    its bundle or not): the same for every path, on the transformers found once;
    ``choice``: why ``auto`` serves them, where it searched."""
    served = served_transformers(nlp)
    for each in served:  # 10. say what serves each (auto's choice kept for the record)
        if choice is not None:
            each.proxy.served.serve(
                (each.proxy.session, replace(each.proxy.exported, auto_choice=choice.explain()))
            )
        _log_served(each.component.name, each.proxy.exported)
    plan = request.plan or plan_overlap(  # 11. the overlap plan: as recorded, or decided
        nlp,
        [each.proxy for each in served],
        config.overlap,
        threads_given=request.threads is not None,
        workload=config.workload,
    )
    recorded = replace(request, overlap_plan=plan.record())
    remember(nlp, served, recorded, _CALLS, folder)  # 12. remember


@dataclass(frozen=True)
class Target:
    """One transformer component to accelerate: where its module sits, what it is, what
    every model of it is checked on, and what the builds of one call share (PyTorch's
    outputs, the exported graph)."""

    component: Any
    location: ShimLocation
    detected: DetectedEncoder
    verification: Verification
    references: References
    export: SharedExport

    @classmethod
    def of(cls, nlp: Language, component: Any) -> Target:
        location = find_shim(component)  # 2. find the shim
        detected = detect_architecture(location.read_pytorch_module())  # 3. detect
        guard(location)  # from here on, swaps wait for the batches in flight
        # What every model is checked on: random and control ids, and the pipeline's own
        # inputs on built-in text (recorded once, on PyTorch, before anything is swapped).
        verification = Verification(
            window=find_span_settings(component).window,
            special_ids=declared_special_ids(component.pipe),
            probe=record_probe(nlp, location, detected.spec),
        )
        held = functools.partial(exclusive, location)
        references = References(location.read_pytorch_module(), detected, held)
        return cls(component, location, detected, verification, references, SharedExport(detected))


class Accelerator:
    """Serves one concrete request on every transformer of a pipeline (steps 5-9), all or
    nothing; called once per candidate of a search (``auto``'s, a fallback chain), which
    records the calibration texts, computes PyTorch's outputs and exports each encoder
    only once."""

    def __init__(self, nlp: Language, config: OptimizeConfig, *, reloading: bool) -> None:
        self.nlp = nlp
        components = find_transformer_components(nlp)  # 1. validate
        self.targets = [Target.of(nlp, component) for component in components]
        self.cache = ModelCache(config.cache_dir, lock_timeout=config.lock_timeout)
        self.build_allowed = not reloading or config.missing_cache is MissingCache.REBUILD
        self.sources = CalibrationSources(nlp)

    def __call__(self, attempt: OptimizeConfig, limits: Mapping[str, Limits] | None = None) -> None:
        resolved = check_provider(attempt)  # 5. check the provider
        attempt = attempt.served_by(resolved.provider)  # ``auto`` decided
        previous = [target.location.module for target in self.targets]
        try:
            for target in self.targets:
                self.serve(
                    target,
                    attempt,
                    resolved,
                    (limits or {}).get(target.location.component, NO_LIMITS),
                )
        except BaseException:
            for target, module in zip(self.targets, previous, strict=True):
                revert(target.location, module)
            raise

    def serve(
        self, target: Target, attempt: OptimizeConfig, resolved: ResolvedProvider, limits: Limits
    ) -> None:
        """Steps 6-9 for one transformer."""
        location, detected = target.location, target.detected
        spans = find_span_settings(target.component)
        module = location.read_pytorch_module()
        buckets = BucketPlan.for_pipeline(
            attempt.gpu, detected.spec, spans.window, spans.batch_size
        )
        calibration = self.sources.of(location, detected.spec, attempt)
        judge = agreement_judge(calibration, module, attempt) if calibration is not None else None
        request = ServeRequest(
            module,
            detected,
            attempt,
            resolved,
            target.verification,
            buckets,
            calibration=calibration,
            judge=judge,
            limits=limits,
            build_allowed=self.build_allowed,
            source=PipelineSource.of(self.nlp.meta, location.component),
            references=target.references.of,  # computed holding the module (Target.of)
            export=target.export,
        )
        session, exported = get_or_export(request, self.cache)  # 6. get or export the model
        proxy = make_proxy(module, session, detected.spec, exported)  # 7. create the proxy
        serve_in(location, proxy, spans, attempt.warmup)  # 8. patch, 9. warm up

    def close(self) -> None:
        """Remove the scratch exports."""
        for target in self.targets:
            target.export.close()


def _log_served(component: str, exported: ExportedModel) -> None:
    """The one line that says what serves ``component`` (the provider and precision
    ``auto`` chose, the plan, a cache hit or an export, the key) and, for a lossy plan,
    how faithful it is."""
    agreement = exported.record.agreement
    logger.info(
        "spacy-accelerate: %s runs %s%s",
        component,
        exported.summary,
        f"; agreement with PyTorch fp32 on the calibration texts: {agreement.describe()}"
        if agreement is not None
        else "",
    )


def reapply(nlp: Language, request: OptimizeRequest, folder: Path | None = None) -> None:
    """Accelerate a loaded pipeline as recorded (the load hooks' step): from the bundle
    saved in ``folder`` (the folder it was loaded from) where there is one that can be
    served here, else as :func:`optimize` would. Where ``missing_cache="pytorch"`` and its
    model is not cached here, it is left on PyTorch as :func:`restore` leaves it."""
    try:
        # The caller's folder only (persist.callers_request), as given, not resolved here:
        # without one the pipeline keeps following the environment where it loads next.
        config = request.to_config(request.cache_dir)
        if folder is not None and _served_from_bundle(nlp, request, config, folder):
            _after_serving(nlp, request, config, folder)
            return
        apply_config(
            nlp, config, threads=request.threads, reloading=True, request=request, folder=folder
        )
    except CacheMissError as missing:
        restore(nlp)
        logger.warning(
            "spacy-accelerate: %s This pipeline runs on PyTorch; call "
            "spacy_accelerate.optimize(nlp) to accelerate it.",
            missing,
        )


def _served_from_bundle(
    nlp: Language, request: OptimizeRequest, config: OptimizeConfig, folder: Path
) -> bool:
    """Serve every transformer of ``nlp`` from the bundle saved in ``folder``, all or
    nothing; False where there is none, where ``request`` asks for other models than it
    holds, or (one line logged, saying why and what happens instead) where it cannot be
    served here. A tampered bundle raises BundleError."""
    bundle = read_bundle(folder)
    if bundle is None:
        return False
    changed = bundle.differences(request.model_options())
    if changed:
        logger.info(
            "spacy-accelerate: loaded with other options than it was saved with (%s), so "
            "the models saved with it (%s) are not used.",
            ", ".join(changed),
            folder / BUNDLE_DIR,
        )
        return False
    try:
        for component in find_transformer_components(nlp):
            _serve_bundled(bundle, component, config)
    except Unservable as why:
        unpatch_all(nlp)
        _log_unservable(folder, why, config.missing_cache)
        return False
    return True


def _log_unservable(folder: Path, why: Unservable, missing_cache: MissingCache) -> None:
    where = (
        "it runs on PyTorch unless its model is in the cache here"
        if missing_cache is MissingCache.PYTORCH
        else "it is accelerated from its own weights instead"
    )
    instead = spelled([where, " (", Advice("missing_cache", missing_cache.value), ")"])
    logger.warning(
        "spacy-accelerate: the accelerated models saved with this pipeline (%s) cannot "
        "be served here: %s; %s.",
        folder / BUNDLE_DIR,
        why,
        instead,
    )


def _serve_bundled(bundle: Bundle, component: Any, config: OptimizeConfig) -> None:
    """One transformer served from ``bundle`` (patched, warmed up)."""
    location = find_shim(component)
    detected = detect_architecture(location.read_pytorch_module())
    guard(location)
    spans = find_span_settings(component)
    attempt, resolved = bundle.servable(location.component, config)  # Unservable: not here
    buckets = BucketPlan.for_pipeline(attempt.gpu, detected.spec, spans.window, spans.batch_size)
    module = location.read_pytorch_module()
    verification = Verification(window=spans.window)
    request = ServeRequest(module, detected, attempt, resolved, verification, buckets)
    session, exported = serve_bundled(bundle, location.component, request)
    serve_in(location, make_proxy(module, session, detected.spec, exported), spans, config.warmup)


def save_served(nlp: Language, request: OptimizeRequest, folder: Path) -> None:
    """Complete ``nlp.to_disk(folder)``: ``meta.json`` requires this library with the
    extras of the runtimes that serve ``nlp``, and those models are saved beside it with
    the options of ``request`` that chose them and ``auto``'s choice
    (:mod:`spacy_accelerate.provision.bundle`); with ``bundle=False``, an earlier bundle
    goes instead."""
    served = {name: proxy.exported for name, proxy in accelerated_components(nlp).items()}
    extras = runtime_extras(exported.provider for exported in served.values() if exported.provider)
    require_library(nlp.meta, folder, extras)
    if not request.bundle:
        remove_bundle(folder)
        return
    if not served:
        return
    first = next(iter(served.values()))
    auto = request.precision == Precision.AUTO.value
    chosen = f"{first.provider} {first.precision}" if auto else None
    write_bundle(folder, served, request.model_options(), chosen)


#: What the load and save hooks call back here
#: (:class:`~spacy_accelerate.pipeline.persist.ApiCalls`).
_CALLS = ApiCalls(reapply=reapply, saver=save_served, restore=restore)


@registry.callbacks(CALLBACK_NAME)
def make_optimize_callback(
    provider: str = "auto",
    precision: str = "fp32",
    enabled: bool = True,
    warmup: bool = True,
    verify: bool = True,
    tolerance: float | None = None,
    min_cosine: float | None = None,
    threads: int | None = None,
    device_id: int | None = None,
    fallback: bool = False,
    gpu: dict[str, Any] | None = None,
    min_agreement: float | dict[str, float] | None = None,
    lock_timeout: float | None = None,
    missing_cache: str = MissingCache.REBUILD.value,
    bundle: bool = True,
    overlap: bool | None = DEFAULT_OVERLAP,
    workload: str = Workload.BATCHES.value,
    overlap_plan: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    saved_cache_dir: str | None = None,
    calibration_texts: list[str] | None = None,
    calibration_sha256: str | None = None,
    calibration_count: int | None = None,
    previous: Callable[[Language], Language] | None = None,
) -> Callable[[Language], Language]:
    """spaCy's ``after_pipeline_creation`` callback that accelerates the loaded pipeline.
    ``cache_dir`` and ``calibration_texts`` are load-time overrides (never saved)."""
    given = locals()
    recorded = {f.name: given[f.name] for f in fields(OptimizeRequest)}
    # The config hands over its own mapping and sequence types: plain ones are kept.
    recorded["gpu"] = dict(gpu) if gpu is not None else None
    if isinstance(min_agreement, Mapping):
        recorded["min_agreement"] = dict(min_agreement)
    texts = calibration_texts
    recorded["calibration_texts"] = list(texts) if texts is not None else None
    request = OptimizeRequest(**recorded)
    return AfterCreation(request=request, enabled=enabled, previous=previous, calls=_CALLS)


@registry.callbacks(CALLBACK_NAME_V1)
def make_optimize_callback_v1(
    provider: str = "auto",
    precision: str = "fp32",
    enabled: bool = True,
    cache_dir: str | None = None,
    warmup: bool = True,
    verify: bool = True,
    tolerance: float | None = None,
    min_cosine: float | None = None,
    threads: int | None = None,
    device_id: int | None = None,
    fallback: bool = False,
    gpu: dict[str, Any] | None = None,
    calibration_texts: list[str] | None = None,
    min_agreement: float | None = None,
    previous: Callable[[Language], Language] | None = None,
) -> Callable[[Language], Language]:
    """The callback of pipelines saved by the first release: its ``cache_dir`` is where
    the cache was (used only if it still works), its texts are used as saved."""
    return make_optimize_callback(
        provider=provider,
        precision=precision,
        enabled=enabled,
        warmup=warmup,
        verify=verify,
        tolerance=tolerance,
        min_cosine=min_cosine,
        threads=threads,
        device_id=device_id,
        fallback=fallback,
        gpu=gpu,
        min_agreement=min_agreement,
        saved_cache_dir=cache_dir,
        calibration_texts=calibration_texts,
        previous=previous,
    )
