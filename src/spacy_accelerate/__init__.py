"""spacy-accelerate: run spaCy transformer pipelines on ONNX Runtime, same annotations.

>>> import spacy, spacy_accelerate
>>> nlp = spacy_accelerate.optimize(spacy.load("en_core_web_trf"), provider="cpu")
"""

from spacy_accelerate._version import __version__
from spacy_accelerate.api import accelerated_components, is_optimized, optimize, restore
from spacy_accelerate.cache.listing import CachedModel, cache_size, clear_cache, list_cached
from spacy_accelerate.cache.store import default_cache_dir
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
    SpacyAccelerateError,
    UnsupportedArchitectureError,
)
from spacy_accelerate.options.config import OptimizeConfig, Precision, Provider
from spacy_accelerate.options.gpu import GpuOptions, TensorRTOptions

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
    "SpacyAccelerateError",
    "UnsupportedArchitectureError",
    "accelerated_components",
    "cache_size",
    "clear_cache",
    "default_cache_dir",
    "is_optimized",
    "list_cached",
    "optimize",
    "restore",
]
