"""The exceptions spacy-accelerate raises.

Every error derives from :class:`SpacyAccelerateError`, so callers can catch
the library's failures in one place, and each message ends with what to do
next. Where a built-in exception type describes the failure just as well
(``ValueError`` for a bad option, ``TypeError`` for an unsupported module)
the error derives from it too, so existing ``except`` clauses keep working.
"""

from __future__ import annotations


class SpacyAccelerateError(Exception):
    """Base class of every error raised by spacy-accelerate."""


class NoTransformerError(SpacyAccelerateError, ValueError):
    """The pipeline has no transformer component to accelerate."""


class UnsupportedArchitectureError(SpacyAccelerateError, TypeError):
    """The transformer's encoder is of a kind spacy-accelerate cannot convert."""


class InvalidOptionError(SpacyAccelerateError, ValueError):
    """An option such as the provider or the precision has an invalid value."""


class ProviderUnavailableError(SpacyAccelerateError, RuntimeError):
    """The requested execution provider is not installed or not usable here."""


class ConversionError(SpacyAccelerateError, RuntimeError):
    """Converting or exporting the encoder failed, or the result did not match it."""


class CacheError(SpacyAccelerateError, OSError):
    """The model cache cannot be read or written."""


class CacheMissError(CacheError):
    """A saved or pickled pipeline's model is not cached where it loads, and it was saved
    with ``missing_cache="pytorch"``: it runs on PyTorch instead of exporting there."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"No cached model {key[:12]} here, and this pipeline was saved with "
            "missing_cache='pytorch', so it is not exported at load time."
        )
        self.key = key


class InferenceOnlyError(SpacyAccelerateError, RuntimeError):
    """A training call reached an accelerated (inference-only) transformer."""


class AccuracyError(SpacyAccelerateError, RuntimeError):
    """A reduced-precision model lost more accuracy than the gate allows, so it is not served."""


class AgreementError(AccuracyError):
    """The reduced-precision pipeline annotated the calibration documents differently from
    PyTorch more often than allowed."""

    def __init__(self, message: str, *, finding: str) -> None:
        super().__init__(message)
        #: What was measured, in one clause (used when several plans are reported).
        self.finding = finding


class EngineBuildError(ProviderUnavailableError):
    """A provider is installed but could not build or run the model here (no usable GPU, a
    TensorRT engine that failed to build, a CUDA graph that could not be captured)."""


class PrecisionUnavailableError(ProviderUnavailableError):
    """A provider is installed but this machine cannot compute in the precision asked for
    (bf16 on a CPU without bf16 units). A provider error, so that ``fallback=True`` serves
    the next provider instead of failing where the pipeline is loaded on another CPU."""


class NoFasterPlanError(PrecisionUnavailableError):
    """No int8 plan both kept the model within its accuracy gate and ran faster than the
    float model this CPU serves well (bf16 where it has bf16 units, fp32 elsewhere), so
    int8 is not worth serving here; the message names the precision to use instead."""


class OutpacedError(NoFasterPlanError):
    """Under ``precision="auto"``: no plan of a lossy precision could beat the fastest plan
    that had already passed, so that precision was not searched further (and nothing was
    stored: asked for by name, it is searched in full). ``resume``: where an int8 search
    that left its ladders for later, with an all-int8 plan that could still win, takes up
    again (a :class:`~spacy_accelerate.verify.speed.Resumed`)."""

    def __init__(self, message: str, *, resume: object = None) -> None:
        super().__init__(message)
        self.resume = resume

    @property
    def deferred(self) -> bool:
        """Whether an int8 search left its ladders for later."""
        return self.resume is not None


class InvalidInputError(SpacyAccelerateError, ValueError):
    """The pipeline handed the transformer something the model cannot take."""


class BundleError(SpacyAccelerateError, ValueError):
    """A saved pipeline's bundle of accelerated models was changed after it was saved (a
    file altered, truncated, added or removed, a name or a link that leads out of it)."""
