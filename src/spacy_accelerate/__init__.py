"""spacy-accelerate: run spaCy transformer pipelines on ONNX Runtime or OpenVINO, same
annotations.

>>> import spacy, spacy_accelerate
>>> nlp = spacy_accelerate.optimize(spacy.load("en_core_web_trf"), provider="cpu")
"""

from typing import TYPE_CHECKING, Any

from spacy_accelerate._version import __version__

if TYPE_CHECKING:
    from spacy_accelerate.api import accelerated_components, is_optimized, optimize, restore
    from spacy_accelerate.cache.root import default_cache_dir
    from spacy_accelerate.errors import (
        AccuracyError,
        AgreementError,
        CacheError,
        ConversionError,
        EngineBuildError,
        InferenceOnlyError,
        InvalidInputError,
        InvalidOptionError,
        NoTransformerError,
        PrecisionUnavailableError,
        ProviderUnavailableError,
        QueueFullError,
        SpacyAccelerateError,
        UnsupportedArchitectureError,
        WeightsUnavailableError,
    )
    from spacy_accelerate.options.config import OptimizeConfig, Precision, Provider
    from spacy_accelerate.options.gpu import GpuOptions, TensorRTOptions
    from spacy_accelerate.provision.listing import CachedModel, cache_size, clear_cache, list_cached

#: The module each public name comes from. Names are imported on first use (PEP 562):
#: ``import spacy_accelerate`` and the command line's ``--help`` stay fast because they do
#: not import spaCy and torch until something needs them.
_SOURCES: dict[str, str] = {
    **dict.fromkeys(
        ("accelerated_components", "is_optimized", "optimize", "restore"), "spacy_accelerate.api"
    ),
    **dict.fromkeys(
        ("CachedModel", "cache_size", "clear_cache", "list_cached"),
        "spacy_accelerate.provision.listing",
    ),
    "default_cache_dir": "spacy_accelerate.cache.root",
    **dict.fromkeys(
        (
            "AccuracyError",
            "AgreementError",
            "CacheError",
            "ConversionError",
            "EngineBuildError",
            "InferenceOnlyError",
            "InvalidInputError",
            "InvalidOptionError",
            "NoTransformerError",
            "PrecisionUnavailableError",
            "ProviderUnavailableError",
            "QueueFullError",
            "SpacyAccelerateError",
            "UnsupportedArchitectureError",
            "WeightsUnavailableError",
        ),
        "spacy_accelerate.errors",
    ),
    **dict.fromkeys(("OptimizeConfig", "Precision", "Provider"), "spacy_accelerate.options.config"),
    **dict.fromkeys(("GpuOptions", "TensorRTOptions"), "spacy_accelerate.options.gpu"),
}

__all__ = [
    "__version__",
    "AccuracyError",
    "AgreementError",
    "CacheError",
    "CachedModel",
    "EngineBuildError",
    "GpuOptions",
    "TensorRTOptions",
    "ConversionError",
    "InferenceOnlyError",
    "InvalidInputError",
    "InvalidOptionError",
    "PrecisionUnavailableError",
    "NoTransformerError",
    "OptimizeConfig",
    "Precision",
    "Provider",
    "ProviderUnavailableError",
    "QueueFullError",
    "SpacyAccelerateError",
    "UnsupportedArchitectureError",
    "WeightsUnavailableError",
    "accelerated_components",
    "cache_size",
    "clear_cache",
    "default_cache_dir",
    "is_optimized",
    "list_cached",
    "optimize",
    "restore",
]


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use, and keep it here."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
