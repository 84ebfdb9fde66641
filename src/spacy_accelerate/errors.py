"""The exceptions spacy-accelerate raises, and the advice in their messages.

Every error derives from :class:`SpacyAccelerateError`, so callers can catch
the library's failures in one place, and each message ends with what to do
next. Where a built-in exception type describes the failure just as well
(``ValueError`` for a bad option, ``TypeError`` for an unsupported module)
the error derives from it too, so existing ``except`` clauses keep working.

A message is made of parts: text, and :class:`Advice`, an option of ``optimize()`` the
message names or advises, kept as data. Each interface spells the advice in its own
terms (:class:`Terms`): ``str(error)`` in Python's (``precision='bf16'``), the command
line in its flags (``--precision bf16``), from the same parts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: An :class:`Advice` that names an option without a value.
UNSET: Any = _Unset()


@dataclass(frozen=True)
class OneOf:
    """Several values a message offers for one option (``Advice("precision",
    OneOf(("int8", "auto")))``), which each interface joins in its own way."""

    values: tuple[Any, ...]

    def joined(self, spell: Callable[[Any], str]) -> str:
        """The values spelled by ``spell``: ``a``, ``a or b``, ``a, b or c``."""
        listed = [spell(value) for value in self.values]
        return listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + " or " + listed[-1]


@dataclass(frozen=True)
class Advice:
    """An option of ``optimize()`` a message names (``value`` UNSET), advises a value of
    (``Advice("precision", "bf16")``; :class:`OneOf` several; ``...``: a value the user
    supplies), or one item of (``item``: ``min_agreement['dep']``), by its keyword name."""

    option: str
    value: Any = UNSET
    item: str | None = None


class Terms(Protocol):
    """How one interface spells the options a message advises."""

    def spell(self, advice: Advice) -> str: ...


class PythonTerms:
    """``optimize()``'s keyword arguments: ``precision='bf16'``, ``fallback=True``,
    ``calibration_texts=...``, ``min_agreement['dep']``; a named option is its name."""

    def spell(self, advice: Advice) -> str:
        if advice.item is not None:
            return f"{advice.option}[{advice.item!r}]"
        if advice.value is UNSET:
            return advice.option
        if advice.value is Ellipsis:
            return f"{advice.option}=..."
        if isinstance(advice.value, OneOf):
            return f"{advice.option}={advice.value.joined(repr)}"
        return f"{advice.option}={advice.value!r}"


PYTHON = PythonTerms()

#: What a message is made of; an error among the parts is spelled in the same terms.
Part: TypeAlias = "str | Advice | SpacyAccelerateError | Said"
Said: TypeAlias = tuple[Part, ...]


def spelled(parts: Iterable[Part], terms: Terms = PYTHON) -> str:
    """``parts`` as one message in ``terms``."""
    out = []
    for part in parts:
        if isinstance(part, Advice):
            out.append(terms.spell(part))
        elif isinstance(part, SpacyAccelerateError):
            out.append(part.spelled(terms))
        elif isinstance(part, tuple):
            out.append(spelled(part, terms))
        else:
            out.append(str(part))
    return "".join(out)


def joined(items: Iterable[Said], separator: str = " ") -> Said:
    """Several messages as one, ``separator`` between them."""
    out: list[Part] = []
    for index, item in enumerate(items):
        out.extend([separator, *item] if index else item)
    return tuple(out)


class SpacyAccelerateError(Exception):
    """Base class of every error raised by spacy-accelerate: its message's ``parts``,
    spelled in Python's terms by ``str()`` and in another interface's by :meth:`spelled`."""

    def __init__(self, *parts: Part) -> None:
        self.parts: Said = parts
        super().__init__(spelled(parts))

    def spelled(self, terms: Terms) -> str:
        """The message in ``terms`` (the command line's flags, say)."""
        return spelled(self.parts, terms)

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent between processes (n_process, Ray) with its parts and attributes, whatever
        # its own __init__ takes.
        return (_rebuilt, (type(self), self.parts, self.__dict__))


def _rebuilt(
    kind: type[SpacyAccelerateError], parts: Said, state: dict[str, Any]
) -> SpacyAccelerateError:
    error = kind.__new__(kind)
    Exception.__init__(error, spelled(parts))
    error.__dict__.update(state)
    return error


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
            f"No cached model {key[:12]} here, and this pipeline was saved with ",
            Advice("missing_cache", "pytorch"),
            ", so it is not exported at load time.",
        )
        self.key = key


class InferenceOnlyError(SpacyAccelerateError, RuntimeError):
    """A training call reached an accelerated (inference-only) transformer."""


class WeightsUnavailableError(SpacyAccelerateError, RuntimeError):
    """The PyTorch weights of an accelerated transformer, let go from memory while it is
    served, cannot be read back (:mod:`spacy_accelerate.serving.parked_weights`)."""


class AccuracyError(SpacyAccelerateError, RuntimeError):
    """A reduced-precision model lost more accuracy than the gate allows, so it is not served."""


class AgreementError(AccuracyError):
    """The reduced-precision pipeline annotated the calibration documents differently from
    PyTorch more often than allowed."""

    def __init__(self, *parts: Part, finding: Said) -> None:
        super().__init__(*parts)
        #: What was measured, in one clause, as parts (used when several plans are reported).
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

    def __init__(self, *parts: Part, resume: object = None) -> None:
        super().__init__(*parts)
        self.resume = resume

    @property
    def deferred(self) -> bool:
        """Whether an int8 search left its ladders for later."""
        return self.resume is not None


class QueueFullError(SpacyAccelerateError, RuntimeError):
    """Too many concurrent calls are waiting for the accelerated transformer already: the
    process is over its capacity (:mod:`spacy_accelerate.runtime.shared_calls`)."""


class InvalidInputError(SpacyAccelerateError, ValueError):
    """The pipeline handed the transformer something the model cannot take."""


class BundleError(SpacyAccelerateError, ValueError):
    """A saved pipeline's bundle of accelerated models was changed after it was saved (a
    file altered, truncated, added or removed, a name or a link that leads out of it)."""
