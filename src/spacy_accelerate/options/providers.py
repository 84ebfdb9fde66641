"""The provider table: every provider this release serves, one row each.

A row says which backend serves the provider (an import path the provider registry
loads when the provider is first used, so that reading the table stays cheap for
``--help``), the precisions it serves, where ``fallback=True`` goes next, whether it
needs a GPU, and its rank for ``provider="auto"``. The options, their validation, the
provider registry, ``doctor`` and the command line all read this table; nothing else
lists providers.

A row is the one registration of a backend: a new backend is its folder under
``backends/`` plus :meth:`ProviderTable.register` of its rows (here for the built-in
ones; a plugin or a test registers its own the same way). How the machine changes the
order (OpenVINO before ONNX Runtime on Intel CPUs at int8 and bf16) is the backend's
rule (``Backend.auto_rank``), not the table's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from spacy_accelerate.errors import Advice, InvalidOptionError
from spacy_accelerate.options.precision import Precision


class Provider(str):
    """A provider's name: ``auto`` or a row of :data:`PROVIDERS`.

    An open set of names rather than an enum, so that a backend registered after import
    (a plugin, a test) is a provider like the built-in ones. Equal names are one object,
    so providers compare with ``is`` as enum members did."""

    __slots__ = ()
    _interned: ClassVar[dict[str, Provider]] = {}
    AUTO: ClassVar[Provider]
    CPU: ClassVar[Provider]
    CUDA: ClassVar[Provider]
    TENSORRT: ClassVar[Provider]
    OPENVINO: ClassVar[Provider]

    def __new__(cls, name: str) -> Provider:
        text = str.__str__(name)
        interned = cls._interned.get(text)
        if interned is None:  # setdefault: two threads naming it first get one object
            interned = cls._interned.setdefault(text, super().__new__(cls, text))
        return interned

    @property
    def value(self) -> str:
        """The name as the user writes it (as an enum member's value)."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Provider({self.value!r})"

    def __reduce__(self) -> tuple[type[Provider], tuple[str]]:
        return (Provider, (self.value,))


Provider.AUTO = Provider("auto")


@dataclass(frozen=True)
class ProviderSpec:
    """One provider: who serves it and the facts the options and ``auto`` read."""

    provider: Provider
    #: The backend serving it, as ``"package.module:Class"`` (a subclass of
    #: :class:`spacy_accelerate.backends.base.Backend`, instantiated once).
    backend: str
    #: What it serves, in the order benchmarks list them.
    precisions: tuple[Precision, ...]
    #: The next provider ``fallback=True`` tries (None: the last resort, the CPU).
    fallback: Provider | None
    #: Lower runs first under ``provider="auto"`` (its backend may move it on some CPUs).
    auto_rank: int
    #: What it runs on, in a few words (``doctor``'s provider lines).
    summary: str
    #: Whether it runs on an NVIDIA GPU (torch CUDA tensors, IO binding, buckets).
    gpu: bool = False
    #: Why it cannot capture CUDA graphs (None: it can, or it has no GPU).
    cuda_graph_problem: str | None = None
    #: Whether its int8 is calibrated on real text and judged by the mean token cosine
    #: over the calibration pieces (a floor under each), not by every token.
    calibrated_int8: bool = False

    def serves(self, precision: Precision) -> bool:
        return precision in self.precisions

    @property
    def captures_graphs(self) -> bool:
        """Whether it runs on a GPU and can capture CUDA graphs there."""
        return self.gpu and self.cuda_graph_problem is None


class ProviderTable:
    """The registered providers, in registration order."""

    def __init__(self) -> None:
        self._rows: dict[Provider, ProviderSpec] = {}

    def register(self, spec: ProviderSpec) -> ProviderSpec:
        """Add ``spec`` (or replace the row of its provider)."""
        if spec.provider is Provider.AUTO:
            raise ValueError("'auto' is not a provider a backend can serve")
        if not spec.precisions:
            raise ValueError(f"provider {spec.provider.value!r} serves no precision")
        if spec.fallback is not None and spec.fallback not in self._rows:
            raise ValueError(
                f"provider {spec.provider.value!r} falls back to {spec.fallback.value!r}, "
                "which is not registered: register the provider it falls back to first"
            )
        if spec.fallback is None and self._rows and self.last_resort() != spec.provider:
            raise ValueError(f"provider {spec.provider.value!r} needs a fallback")
        if spec.fallback is not None and spec.provider in self.fallback_chain(spec.fallback):
            raise ValueError(f"provider {spec.provider.value!r} would fall back to itself")
        self._rows[spec.provider] = spec
        return spec

    def remove(self, provider: str) -> None:
        """Take ``provider``'s row out (a test's throwaway backend)."""
        if any(row.fallback == provider for row in self._rows.values()):
            raise ValueError(f"other providers fall back to {provider!r}")
        del self._rows[Provider(provider)]

    def __contains__(self, provider: object) -> bool:
        return provider in self._rows

    def __iter__(self) -> Iterator[ProviderSpec]:
        return iter(tuple(self._rows.values()))

    def __getitem__(self, provider: Provider) -> ProviderSpec:
        return self._rows[provider]

    def names(self) -> tuple[Provider, ...]:
        return tuple(self._rows)

    def last_resort(self) -> Provider:
        """The provider every fallback ends on: the one row with no fallback."""
        last = [row.provider for row in self._rows.values() if row.fallback is None]
        if not last:
            raise LookupError("no provider is registered")
        return last[0]

    def fallback_chain(self, provider: Provider) -> tuple[Provider, ...]:
        """``provider``, then each provider ``fallback=True`` tries after it, in order."""
        chain = [provider]
        while (following := self._rows[chain[-1]].fallback) is not None:
            chain.append(following)
        return tuple(chain)

    def served(self) -> tuple[tuple[Provider, Precision], ...]:
        """Every provider/precision pair served, in table order."""
        return tuple((row.provider, precision) for row in self for precision in row.precisions)

    def serves(self, provider: Provider, precision: Precision) -> bool:
        return provider in self._rows and self._rows[provider].serves(precision)

    def precisions_of(self, provider: Provider) -> tuple[Precision, ...]:
        return self._rows[provider].precisions if provider in self._rows else ()

    def get(self, provider: Provider) -> ProviderSpec | None:
        """``provider``'s row, or None (``auto``, or a name no package registered here)."""
        return self._rows.get(provider)

    def on_gpu(self, provider: Provider) -> bool:
        row = self._rows.get(provider)
        return row is not None and row.gpu

    def parse(self, value: str | Provider) -> Provider:
        """A user's provider name as a :class:`Provider`, or the valid names."""
        if isinstance(value, str):
            name = Provider(value.strip().lower())
            if name is Provider.AUTO or name in self._rows:
                return name
        valid = ", ".join(repr(name.value) for name in (Provider.AUTO, *self._rows))
        raise InvalidOptionError(
            "Unknown ", Advice("provider"), f" {value!r}. Valid values: {valid}."
        )

    def choices(self) -> str:
        """The names a user may give, for help texts: ``auto, cpu, ... or openvino``."""
        names = [name.value for name in (Provider.AUTO, *self._rows)]
        return ", ".join(names[:-1]) + " or " + names[-1]


#: The providers of this release; the built-in rows follow.
PROVIDERS = ProviderTable()

_ORT = "spacy_accelerate.backends.onnxruntime.backend:OnnxRuntimeBackend"
_OPENVINO = "spacy_accelerate.backends.openvino.backend:OpenVINOBackend"
_FP32, _FP16, _BF16, _INT8 = Precision.FP32, Precision.FP16, Precision.BF16, Precision.INT8

Provider.CPU = PROVIDERS.register(
    ProviderSpec(Provider("cpu"), _ORT, (_FP32, _INT8), None, 30, "ONNX Runtime on the CPU")
).provider
Provider.CUDA = PROVIDERS.register(
    ProviderSpec(
        Provider("cuda"),
        _ORT,
        (_FP32, _FP16),
        Provider.CPU,
        20,
        "ONNX Runtime on an NVIDIA GPU",
        gpu=True,
    )
).provider
Provider.TENSORRT = PROVIDERS.register(
    ProviderSpec(
        Provider("tensorrt"),
        _ORT,
        (_FP32, _FP16),
        Provider.CUDA,
        10,
        "ONNX Runtime's TensorRT on an NVIDIA GPU",
        gpu=True,
        cuda_graph_problem="ONNX Runtime's TensorRT provider keeps a single CUDA graph per "
        "session, which cannot serve several bucket shapes",
    )
).provider
Provider.OPENVINO = PROVIDERS.register(
    ProviderSpec(
        Provider("openvino"),
        _OPENVINO,
        (_FP32, _BF16, _INT8),
        Provider.CPU,
        40,
        "OpenVINO on the CPU",
        calibrated_int8=True,
    )
).provider
