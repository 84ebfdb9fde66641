"""The public entry points: ``optimize()``, ``restore()`` and ``is_optimized()``."""

from __future__ import annotations

import os

from spacy.language import Language

from .architectures import detect_architecture
from .cache import ModelCache
from .config import DEFAULT_TOLERANCE, Precision, Provider, build_config
from .exported import get_or_export
from .patch import is_patched, patch, unpatch
from .providers import check_provider
from .proxy import AcceleratedEncoder
from .shim import find_shim, find_span_settings
from .validate import TransformerComponent, find_transformer_components
from .warmup import warm_up


def optimize(
    nlp: Language,
    provider: str | Provider = "auto",
    precision: str | Precision = "fp32",
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    warmup: bool = True,
    verify: bool = True,
    tolerance: float = DEFAULT_TOLERANCE,
    threads: int | None = None,
) -> Language:
    """Run every transformer of ``nlp`` on ONNX Runtime; mutate and return ``nlp``.

    All or nothing: if any component cannot be accelerated, every component is
    left (or put back) on PyTorch and the error says why. A pipeline that was
    already optimized is first restored, so calling this again with other
    options re-optimizes it.
    """
    components = find_transformer_components(nlp)  # 1. validate
    restore(nlp)
    shims = [find_shim(component) for component in components]  # 2. find the shim
    encoders = [detect_architecture(location.module) for location in shims]  # 3. detect
    config = build_config(  # 4. build the config
        provider,
        precision,
        cache_dir=cache_dir,
        warmup=warmup,
        verify=verify,
        tolerance=tolerance,
        threads=threads,
    )
    resolved = check_provider(config)  # 5. check the provider
    cache = ModelCache(config.cache_dir)
    try:
        for component, location, detected in zip(components, shims, encoders, strict=True):
            spans = find_span_settings(component)
            session, exported = get_or_export(  # 6. get or export the ONNX model
                location.module, detected, config, resolved, cache, window=spans.window
            )
            proxy = AcceleratedEncoder(  # 7. create the proxy
                session, detected.spec, location.module, location.layer, exported
            )
            patch(location.shim, proxy)  # 8. patch
            if config.warmup:
                warm_up(proxy, spans)  # 9. warm up
    except BaseException:
        restore(nlp)
        raise
    return nlp


def _accelerated(nlp: Language) -> dict[str, AcceleratedEncoder]:
    found: dict[str, AcceleratedEncoder] = {}
    for component in _transformer_components(nlp):
        location = find_shim(component)
        if is_patched(location.shim):
            found[component.name] = location.module
    return found


def _transformer_components(nlp: Language) -> list[TransformerComponent]:
    from spacy_curated_transformers.pipeline.transformer import CuratedTransformer

    return [
        TransformerComponent(name=name, pipe=pipe)
        for name, pipe in nlp.components
        if isinstance(pipe, CuratedTransformer)
    ]


def accelerated_components(nlp: Language) -> dict[str, AcceleratedEncoder]:
    """The accelerated transformer modules of ``nlp``, by component name."""
    return _accelerated(nlp)


def restore(nlp: Language) -> Language:
    """Put every original PyTorch transformer back; a no-op on a plain pipeline."""
    for component in _transformer_components(nlp):
        unpatch(find_shim(component).shim)
    return nlp


def is_optimized(nlp: Language) -> bool:
    """Whether every transformer component of ``nlp`` runs accelerated."""
    components = _transformer_components(nlp)
    return bool(components) and len(_accelerated(nlp)) == len(components)
