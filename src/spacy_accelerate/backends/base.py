"""The one interface every backend implements, and what a build hands it.

A backend owns everything specific to one runtime: its sessions, its provider options,
its quantization (a plan search, :mod:`spacy_accelerate.verify.plan_search`), the file
a cache entry serves for it, what of its runtime goes into the cache key, and the
folders of derived artefacts (engines, compiled blobs) it keeps beside an entry. The
build (:mod:`spacy_accelerate.provision.get_or_export`) and the provider registry
(:mod:`spacy_accelerate.backends.registry`) use backends only through :class:`Backend`.
What one transformer's serving asks for travels as one :class:`ServeRequest`, from
``optimize()`` to the backend's build (:attr:`BuildJob.request`).

To add a backend: a folder under ``backends/`` with a subclass of :class:`Backend`, and
a row in the provider table for each provider it serves
(:mod:`spacy_accelerate.options.providers`); ``docs/development.md`` lists the files.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import torch

from spacy_accelerate.architectures import DetectedEncoder
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.cache.derived import DerivedFolders
from spacy_accelerate.cache.provenance import PipelineSource
from spacy_accelerate.cache.store import ModelCache
from spacy_accelerate.cpu_features import CpuFeatures
from spacy_accelerate.errors import OutpacedError
from spacy_accelerate.options.config import OptimizeConfig, Precision, Provider
from spacy_accelerate.options.gate import Gate
from spacy_accelerate.options.providers import ProviderSpec
from spacy_accelerate.runtime.buckets import DEFAULT_MAX_BATCH, BucketPlan
from spacy_accelerate.runtime.providers import ResolvedProvider
from spacy_accelerate.runtime.session import Session, SessionLayout
from spacy_accelerate.verify.calibration import Calibration, CalibrationInputs, Judge
from spacy_accelerate.verify.parity import ParityReport, check_parity
from spacy_accelerate.verify.record import BuildRecord, BuiltModel
from spacy_accelerate.verify.speed import NO_LIMITS, Limits, races
from spacy_accelerate.verify.verification import Verification

#: PyTorch's outputs for the rows a model is checked on (computed once per batch).
References = Callable[[Sequence[EncoderInputs]], list[list[Any]]]

T = TypeVar("T")


class ExportedGraph(Protocol):
    """The exported ONNX model that every build of one ``optimize()`` call starts from,
    in a scratch folder of its own: read there, never written (a backend that rewrites
    the graph works on a copy in its build folder)."""

    @property
    def path(self) -> Path: ...

    def copy_to(self, path: Path) -> None:
        """The exported files in ``path``'s folder, the graph named as ``path``."""

    def derived(self, name: str, make: Callable[[Path], T]) -> T:
        """``make(path)``, made once for all the builds of the call (an OpenVINO model
        converted from it): a caller must leave it unchanged, copying what it changes."""

    def written(self, name: str, folder: Path, write: Callable[[Path], None]) -> None:
        """The files ``write(folder)`` writes into the build ``folder``, written once for
        all the builds of the call (OpenVINO's IR, the same for fp32 and bf16) and
        hard-linked into the later builds' folders where the filesystem allows."""


class Exports(Protocol):
    """One encoder's exported graphs, one per opset, made once and read by every build of
    one ``optimize()`` call (:class:`~spacy_accelerate.provision.exports.SharedExport`)."""

    def at(self, opset: int, name: str) -> ExportedGraph:
        """The graph exported at ``opset`` (named ``name``), exported on first use."""


@dataclass(frozen=True)
class ServeRequest:
    """One transformer to serve in one attempt: its PyTorch module, what the model is
    checked and judged on, and what bounds and records the build.

    Why one object: these values travel together from ``optimize()``
    (:class:`~spacy_accelerate.api.Accelerator`, a saved pipeline's bundle) through
    :func:`~spacy_accelerate.provision.get_or_export.get_or_export` into the backend's
    build (:attr:`BuildJob.request`); built once, none of them is repacked on the way.
    """

    module: torch.nn.Module
    detected: DetectedEncoder
    #: The attempt: its provider and precision decided (``auto`` resolved).
    config: OptimizeConfig
    provider: ResolvedProvider
    #: The rows every model is checked on (the span window among them): part of the key.
    verification: Verification
    #: The GPU shapes the session binds.
    buckets: BucketPlan
    #: A lossy plan's calibration (its digest is in the key; the pipeline runs over its
    #: texts only when a model is built) and the judge of a candidate in the pipeline.
    calibration: CalibrationInputs | None = None
    judge: Judge | None = None
    #: Under ``precision="auto"``: the plans a lossy build must outrun (a build they
    #: outpace raises :class:`OutpacedError`, stored nowhere).
    limits: Limits = NO_LIMITS
    #: False where a saved pipeline is told not to export where it loads: a missing entry
    #: then raises :class:`~spacy_accelerate.errors.CacheMissError`.
    build_allowed: bool = True
    #: The pipeline and component the model comes from, recorded in the manifest of an
    #: entry built for it (not in its key).
    source: PipelineSource | None = None
    #: PyTorch's outputs and the exported graph, shared with the other builds of one
    #: search (None: the call's own: PyTorch's outputs computed without holding the
    #: module, the export removed when :func:`get_or_export` returns).
    references: References | None = None
    export: Exports | None = None

    @classmethod
    def plain(
        cls,
        module: torch.nn.Module,
        detected: DetectedEncoder,
        config: OptimizeConfig,
        provider: ResolvedProvider,
        window: int,
    ) -> ServeRequest:
        """A request outside a pipeline: checked on random and control ids of ``window``
        pieces, its GPU shapes derived from ``window`` alone, nothing shared."""
        buckets = BucketPlan.for_pipeline(config.gpu, detected.spec, window, DEFAULT_MAX_BATCH)
        return cls(module, detected, config, provider, Verification(window=window), buckets)

    @property
    def spec(self) -> EncoderSpec:
        return self.detected.spec


@dataclass(frozen=True)
class BuildJob:
    """One model to build for ``request`` from the exported graph (``export``) into
    ``path`` (in the entry's temporary folder, named as the entry's model file when it is
    ONNX): the request whole, and what its build derived from it (where the session keeps
    its artefacts, the rows it is checked on and PyTorch's outputs for any rows)."""

    request: ServeRequest
    path: Path
    export: ExportedGraph
    layout: SessionLayout
    cache: ModelCache
    #: The rows every candidate is checked on, and PyTorch's outputs for any rows.
    batches: list[EncoderInputs]
    references: References

    @property
    def module(self) -> torch.nn.Module:
        return self.request.module

    @property
    def detected(self) -> DetectedEncoder:
        return self.request.detected

    @property
    def spec(self) -> EncoderSpec:
        return self.request.detected.spec

    @property
    def config(self) -> OptimizeConfig:
        return self.request.config

    @property
    def provider(self) -> ResolvedProvider:
        return self.request.provider

    @property
    def gate(self) -> Gate:
        """What every candidate's parity to PyTorch must meet (see :meth:`check`)."""
        return self.request.config.gate()

    @property
    def calibration(self) -> Calibration | None:
        """A lossy build's calibration texts' inputs (None: fp32), recorded on first use."""
        calibration = self.request.calibration
        return calibration.full if calibration is not None else None

    @property
    def judge(self) -> Judge | None:
        """The judge of a candidate inside the pipeline (its agreement, or an
        AgreementError)."""
        return self.request.judge

    @property
    def limits(self) -> Limits:
        """Under ``precision="auto"``: the plans a lossy plan must outrun (raced before it
        is judged; a plan that loses raises :class:`OutpacedError`) and whether an int8
        search may search its ladders now."""
        return self.request.limits

    def check(self, session: Session, gate: Gate | None = None) -> ParityReport:
        """``session`` held to ``gate`` (the build's by default) on the build's rows (an
        AccuracyError if not)."""
        return check_parity(
            self.module,
            self.detected,
            session,
            gate=self.gate if gate is None else gate,
            batches=self.batches,
            references=self.references(self.batches),
        )

    def measure(self, session: Session) -> ParityReport:
        """``session``'s parity on the build's rows, held to no gate (a plan search
        applies the gate itself)."""
        return self.check(session, Gate())

    def judged(self, session: Session) -> BuiltModel:
        """``session`` held to the gate (the token cosine first: it is cheap), then, for
        a lossy plan, raced against the rivals of :attr:`limits` and held to the pipeline's
        agreement on the calibration texts (an AccuracyError if either fails)."""
        report = self.check(session)
        if self.judge is None:
            return BuiltModel(session, report)
        if self.limits.rivals:
            items = self.calibration.items if self.calibration is not None else self.batches
            lost = races(session, self.limits.rivals, items)[-1]
            if not lost.faster:
                raise OutpacedError(f"{self.config.precision.value}: {lost.finding()}")
        return BuiltModel(session, report, BuildRecord(agreement=self.judge(session)))


class Backend(ABC):
    """One runtime serving one or more providers (the rows of the provider table that name
    it: :data:`~spacy_accelerate.options.providers.PROVIDERS`)."""

    #: The folders of derived artefacts it keeps beside the cache entries (the registry
    #: registers them with the cache, which removes them with their entries).
    derived_folders: ClassVar[tuple[DerivedFolders, ...]] = ()

    @abstractmethod
    def install_hint(self, provider: Provider) -> str:
        """What to install for ``provider``, as a command."""

    @abstractmethod
    def pip_extra(self, provider: Provider) -> str:
        """The extra of spacy-accelerate that installs ``provider``'s runtime: a saved
        pipeline served by it requires ``spacy-accelerate[<extra>]``."""

    @abstractmethod
    def runtime_name(self, provider: Provider) -> str:
        """How an error names the runtime ``provider`` needs."""

    @abstractmethod
    def present(self) -> set[Provider]:
        """Which of its providers are installed here (a GPU may still be missing)."""

    def auto_rank(self, row: ProviderSpec, precision: Precision, cpu: CpuFeatures) -> float:
        """Where ``row``'s provider stands in ``provider="auto"``'s order for ``precision``
        on ``cpu`` (lower first): the table's rank, unless the backend knows better on
        some CPUs."""
        return row.auto_rank

    def check(self, config: OptimizeConfig) -> None:  # noqa: B027 - most need no check
        """Refuse, before any export, a request this machine cannot serve."""

    def describe(self) -> str:
        """One line for ``doctor``: the runtime, its release, and what it says it can run
        here (its execution providers, its CPU plugin's capabilities)."""
        return f"{type(self).__name__}: {self.runtime_version() or 'not installed'}"

    @abstractmethod
    def model_file(self, config: OptimizeConfig) -> str:
        """The file a cache entry serves for ``config``."""

    def key_options(self, config: OptimizeConfig) -> dict[str, Any]:
        """What else the served file (or its verdict) depends on: runtime releases, the
        CPU's kernels, the plan search's rules. Part of the cache key."""
        return {}

    @abstractmethod
    def layout(
        self,
        config: OptimizeConfig,
        spec: EncoderSpec,
        buckets: BucketPlan,
        cache: ModelCache | None,
        key: str,
    ) -> SessionLayout:
        """Where a session over entry ``key`` keeps its derived artefacts (none without a
        ``cache``: a model served from a saved pipeline's bundle writes nothing)."""

    @abstractmethod
    def runtime_version(self) -> str | None:
        """The release of the runtime installed here (None: not installed): a saved
        pipeline's bundle written by a later release is not read by an earlier one."""

    @abstractmethod
    def open_session(
        self,
        model: Path,
        provider: ResolvedProvider,
        config: OptimizeConfig,
        layout: SessionLayout,
        cache: ModelCache | None,
    ) -> Session:
        """A session over ``model`` (no derived artefacts are kept without ``cache``)."""

    @abstractmethod
    def build(self, job: BuildJob) -> BuiltModel:
        """The served model of ``job`` in its folder: its session, parity report and
        record; an AccuracyError (or, calibrated, a NoFasterPlanError) when no plan may be
        served."""
