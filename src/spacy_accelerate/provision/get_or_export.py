"""Step 6: get the exported model from the cache, or convert, export and store it.

A miss converts the curated encoder to Hugging Face, exports it to ONNX,
fuses or quantizes it (for OpenVINO: converts it to IR, and for int8
calibrates and quantizes it under accuracy control) and proves parity
*before* the cache entry is committed, so a model that fails the gate is
never stored. A hit is verified against its manifest by
the cache and, unless ``verify=False``, against the live PyTorch module.

Everything that decides a verdict is in the key (the gate of a plan search, the rows it
is checked on, the CPU's int8 kernels), so a request gets the verdict a cold cache would
give it. A hit that still fails its re-check here (an entry tampered with, or a runtime
that computes differently than the one it was proven on) is rebuilt under its key, never
served, and never an error that only clearing the cache would end.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from spacy_accelerate import progress
from spacy_accelerate.architectures import detect_architecture
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.backends.base import BuildJob, Exports, ServeRequest
from spacy_accelerate.backends.registry import backend_for, open_session, session_layout
from spacy_accelerate.cache.location import saved_cache_dir, search_order
from spacy_accelerate.cache.provenance import record_use
from spacy_accelerate.cache.store import CacheEntry, CacheResult, ModelCache
from spacy_accelerate.cache.untrusted import CorruptEntry, read_json_object
from spacy_accelerate.errors import (
    AccuracyError,
    CacheError,
    CacheMissError,
    ConversionError,
    NoFasterPlanError,
    OutpacedError,
)
from spacy_accelerate.export.fingerprint import cache_key, key_inputs
from spacy_accelerate.export.onnx import MODEL_FILE
from spacy_accelerate.options.config import MissingCache, OptimizeConfig
from spacy_accelerate.options.gate import Gate, recorded_report_meets
from spacy_accelerate.provision.exports import SharedExport
from spacy_accelerate.provision.references import References
from spacy_accelerate.provision.refusals import raise_recorded_refusal, store_refusal
from spacy_accelerate.provision.storage import stored_as_cache_errors
from spacy_accelerate.runtime.providers import ResolvedProvider
from spacy_accelerate.runtime.session import Session, SessionLayout
from spacy_accelerate.verify.agreement import AUTOCAST_MARGIN
from spacy_accelerate.verify.calibration import CalibrationInputs
from spacy_accelerate.verify.parity import ParityReport, check_parity
from spacy_accelerate.verify.record import BuildRecord
from spacy_accelerate.verify.spot_check import (
    SPOT_CHECK_FILE,
    check_items,
    load_spot_check,
    recorded_mean,
    save_spot_check,
    spot_check_gate,
)
from spacy_accelerate.verify.verification import Verification

logger = logging.getLogger("spacy_accelerate")

#: The parity report stored beside the model (checksummed like every file).
PARITY_FILE = "parity.json"

#: How a lossy plan's agreement is judged (in the key: a changed rule judges anew).
AGREEMENT_RULE = (
    "every annotation, 95% Wilson lower bound >= min_agreement; "
    f"bf16 within {AUTOCAST_MARGIN} of PyTorch's bf16 autocast"
)


class Origin(str, Enum):
    """Where a served model came from: built by this call, a cache hit, or the bundle of
    the saved pipeline it was loaded from (:mod:`~spacy_accelerate.provision.bundle`)."""

    EXPORTED = "exported"
    CACHE_HIT = "cache hit"
    BUNDLED = "bundled"


@dataclass(frozen=True)
class ExportedModel:
    """Where the served model came from."""

    key: str
    path: Path
    origin: Origin
    seconds: float
    parity: ParityReport | None
    #: How the served model was built (its int8 plan, the plans refused, the agreement),
    #: as recorded when it was built and read back from its manifest on a hit.
    record: BuildRecord = BuildRecord()
    #: The rows the model was checked on (part of its key): a pipeline unpickled where
    #: the entry is gone builds it again with them.
    verification: Verification | None = None
    #: The provider and precision that serve it (``auto`` decided).
    provider: str | None = None
    precision: str | None = None
    #: Why ``precision="auto"`` serves it, where it chose it in this process: the plans
    #: timed (on the workload it was told), the one that won, those refused.
    auto_choice: str | None = None

    @property
    def cache_hit(self) -> bool:
        return self.origin is Origin.CACHE_HIT

    @property
    def summary(self) -> str:
        """What was served, in one short line: ``cpu int8 (every MatMul int8), cache hit,
        key 1a2b3c4d5e6f``, ``openvino bf16, exported, key ...`` or ``..., bundled, ...``."""
        served = " ".join(part for part in (self.provider, self.precision) if part) or "model"
        plan = f" ({self.record.plan})" if self.record.plan else ""
        return f"{served}{plan}, {self.origin.value}, key {self.key[:12]}"


def _recorded(entry: CacheEntry) -> dict[str, Any]:
    """The parity report the entry was stored with; empty when it cannot be read."""
    try:
        return read_json_object(entry.file(PARITY_FILE))
    except (CorruptEntry, OSError):  # CacheError is an OSError
        return {}


def _recorded_report_meets(entry: CacheEntry, gate: Gate) -> bool:
    """Whether the parity the entry was stored with proves ``gate``; False if not on record."""
    report = _recorded(entry)
    return bool(report) and recorded_report_meets(report, gate)


def _export_options(
    config: OptimizeConfig,
    spec: EncoderSpec,
    verification: Verification,
    calibration: CalibrationInputs | None = None,
) -> dict[str, Any]:
    """The key's export options: what shapes the served file, and what decides whether it
    is served (the rows it is checked on and, where a plan is searched, the gate and what
    the CPU's int8 kernels compute). OpenVINO's IR also depends on OpenVINO's release and
    on what this CPU can do, and a lossy plan on its calibration texts, the pipeline's
    other components and the bounds it was judged under."""
    options = config.export_options()
    options["verified_on_sha256"] = verification.digest(spec)
    options.update(backend_for(config.provider).key_options(config))
    if calibration is not None:
        options["calibration_sha256"] = calibration.digest
        options["judged_by_sha256"] = calibration.judged_by
        gate = config.gate()  # the cosine filter's verdicts are stored too (refusals)
        options["accuracy_control"] = {
            "min_cosine": gate.min_cosine,
            "min_mean_cosine": gate.min_mean_cosine,
            "min_agreement": config.min_agreement.resolved(),
            "rule": AGREEMENT_RULE,
        }
    return options


def _model_file(config: OptimizeConfig) -> str:
    """The file a cache entry serves for ``config``."""
    return backend_for(config.provider).model_file(config)


def _required_files(config: OptimizeConfig) -> tuple[str, ...]:
    """The files an entry must hold to be served for ``config``: a manifest without them
    (tampered with, or written by a build that was changed since) is rebuilt."""
    files = (_model_file(config), PARITY_FILE)
    return (*files, SPOT_CHECK_FILE) if config.calibrated else files


class _EntryGone(Exception):
    """Internal: the entry was removed (``clear_cache`` in another process, say) between
    its verification and its opening."""


def get_or_export(request: ServeRequest, cache: ModelCache) -> tuple[Session, ExportedModel]:
    """Return a session over a verified model of ``request.module`` (ONNX or OpenVINO IR)
    and its provenance, kept in ``cache``.

    The model is checked on ``request.verification``'s rows. A calibrated model is built
    on all its ``calibration`` and ``judge``d in the pipeline; a cached one was, under the
    same texts and bounds (they are in the key), so a warm start only spot-checks its
    token cosine on the first calibration items, stored in the entry (no pipeline run).
    Where ``build_allowed`` is false, a missing entry raises :class:`CacheMissError`. The
    entry served is marked as used now (see :mod:`~spacy_accelerate.cache.provenance`);
    one built here records ``source``. ``limits`` bound a lossy build inside
    ``precision="auto"``'s search (:class:`OutpacedError`, stored nowhere). See
    :class:`~spacy_accelerate.backends.base.ServeRequest`.
    """
    start = time.perf_counter()
    with _exports(request) as export:
        session, exported = _Fetch(request, cache, export).run(start)
    _log_fetched(exported, request)
    return session, exported


@contextmanager
def _exports(request: ServeRequest) -> Iterator[Exports]:
    """The exports ``request`` shares with the other builds of its search, or this call's
    own, removed when it is done (the served entry holds copies and links of its files)."""
    if request.export is not None:
        yield request.export
        return
    own = SharedExport(request.detected)
    try:
        yield own
    finally:
        own.close()


def _log_fetched(exported: ExportedModel, request: ServeRequest) -> None:
    """Say at DEBUG how :func:`get_or_export` got the model: from the cache or exported,
    in how long, and its parity to PyTorch."""
    parity = exported.parity
    logger.debug(
        "%s %s %s encoder (key %s) in %.2f s; parity %s",
        "loaded cached" if exported.cache_hit else "exported",
        request.config.precision.value,
        request.spec.family,
        exported.key[:12],
        exported.seconds,
        f"max abs diff {parity.worst:.2e}, min token cosine {parity.worst_cosine:.5f}"
        if parity
        else "not checked",
    )


class _Fetch:
    """One :func:`get_or_export` call: the key of the request, how a miss is built
    (:meth:`build`) and how an entry is served (:meth:`serve`), and the retries between
    them (:meth:`run`)."""

    def __init__(self, request: ServeRequest, cache: ModelCache, export: Exports) -> None:
        config, spec, verification = request.config, request.spec, request.verification
        self.request, self.config, self.cache, self.export = request, config, cache, export
        #: PyTorch's outputs: the request's, shared with its search, or this call's own.
        self.references = request.references or References(request.module, request.detected).of
        self.batches = verification.batches(spec)
        options = _export_options(config, spec, verification, request.calibration)
        self.inputs = key_inputs(request.module, spec, options)
        self.key = cache_key(self.inputs)
        self.layout = session_layout(config, spec, request.buckets, cache, self.key)
        self.required = _required_files(config)
        self.gate = config.gate()
        #: The session and report of the model this call built (served on a miss).
        self.built: list[tuple[Session, ParityReport]] = []
        self.storing = stored_as_cache_errors(self.build_with_source, cache.root)

    def build_with_source(self, folder: Path) -> dict[str, Any]:
        """:meth:`build`'s record, naming the pipeline and component it came from, as the
        manifest stores it."""
        return replace(self.build(folder), source=self.request.source).as_dict()

    def build(self, folder: Path) -> BuildRecord:
        """Export, build and check the model in ``folder``; the record of how it was built
        (or a calibrated build's refusal, kept instead of a model)."""
        request, config = self.request, self.config
        if not request.build_allowed:
            raise CacheMissError(self.key)
        # The session holds the whole model in memory, so it stays valid after the
        # folder is renamed into the cache: it is served as is.
        job = BuildJob(
            request=request,
            path=folder / MODEL_FILE,
            export=self.export.at(config.opset, MODEL_FILE),
            layout=self.layout,
            cache=self.cache,
            batches=self.batches,
            references=self.references,
        )
        try:
            building = f"building the {config.provider.value} {config.precision.value} model"
            with progress.step(f"{building} and checking it against PyTorch"):
                built = backend_for(config.provider).build(job)
        except OutpacedError:
            raise  # decided by the limits of this search alone: nothing to keep
        except (NoFasterPlanError, AccuracyError) as refusal:
            if not config.calibrated:
                raise
            return store_refusal(folder, refusal)
        recorded = built.parity.as_dict()
        record = built.record
        if request.calibration is not None:
            spot = save_spot_check(request.calibration.full.items, folder)
            measured = check_parity(
                request.module,
                request.detected,
                built.session,
                gate=Gate(),
                batches=spot,
                references=self.references(spot),
            )
            recorded["spot_check_mean_cosine"] = measured.worst_mean_cosine
            record = replace(record, calibration_sha256=request.calibration.digest)
        (folder / PARITY_FILE).write_text(json.dumps(recorded, indent=2))
        self.built.append((built.session, built.parity))
        return record

    def serve(self, result: CacheResult) -> tuple[Session, ParityReport | None]:
        """The session over ``result``'s entry; a hit opened and re-checked as asked."""
        raise_recorded_refusal(result.entry)
        if not result.hit:
            return self.built[-1]
        entry, config, cache = result.entry, self.config, self.cache
        try:
            model = entry.file(_model_file(config))
            session = open_session(model, self.request.provider, config, self.layout, cache)
        except Exception as error:
            if cache.lookup(self.key, self.required) != entry:
                raise _EntryGone from error
            raise
        if not (config.verify or not _recorded_report_meets(entry, self.gate)):
            return session, None
        # A hit is checked again unless told not to; and always when it was stored under
        # a looser gate than this call asks for.
        checked_batches, checked = self.batches, self.gate
        if self.request.calibration is not None:
            try:
                checked_batches = load_spot_check(entry.file(SPOT_CHECK_FILE))
                check_items(checked_batches, self.request.spec)
                recorded = recorded_mean(_recorded(entry), PARITY_FILE)
            except OSError as error:
                raise _EntryGone from error
            except CorruptEntry as error:
                raise CacheError(
                    f"The cached model {entry.path} cannot be checked: {error}. Remove the "
                    "entry (spacy-accelerate cache clear) so that it is rebuilt."
                ) from None
            checked = spot_check_gate(self.gate, recorded)
        with progress.step("checking the cached model against PyTorch"):
            parity = check_parity(
                self.request.module,
                self.request.detected,
                session,
                gate=checked,
                batches=checked_batches,
                references=self.references(checked_batches),
            )
        return session, parity

    def run(self, start: float) -> tuple[Session, ExportedModel]:
        """The entry got or built, then served: an entry removed meanwhile is got again
        once, a hit that does not compute what it was proven to is rebuilt once."""
        cache, key, inputs, required = self.cache, self.key, self.inputs, self.required
        # A calibrated build may store a refusal instead of a model (see refusals).
        lookup_required = () if self.config.calibrated else required
        result = cache.get_or_build(key, inputs, self.storing, lookup_required)
        raise_recorded_refusal(result.entry)
        if not set(required) <= set(result.entry.manifest["files"]):  # a model's files missing
            result = cache.rebuild(result.entry, inputs, self.storing, required)
        for attempt in (1, 2):
            try:
                session, parity = self.serve(result)
                break
            except _EntryGone:
                if attempt == 2:
                    raise CacheError(
                        f"The cached model {key[:12]} under {cache.root} was removed twice "
                        "while it was being opened (is another process clearing the cache in "
                        "a loop?). Try again once it has finished."
                    ) from None
                logger.info(
                    "spacy-accelerate: cache entry %s went away; getting it again", key[:12]
                )
                result = cache.get_or_build(key, inputs, self.storing, lookup_required)
            except (AccuracyError, ConversionError) as refusal:
                if not result.hit or attempt == 2:
                    raise
                logger.warning(
                    "spacy-accelerate: the cached model %s does not compute here what it was "
                    "proven to (%s); it is rebuilt.",
                    result.entry.path,
                    refusal,
                )
                result = cache.rebuild(result.entry, inputs, self.storing, required)
        record_use(result.entry)
        return session, ExportedModel(
            key=key,
            path=result.entry.path,
            origin=Origin.CACHE_HIT if result.hit else Origin.EXPORTED,
            seconds=time.perf_counter() - start,
            parity=parity,
            record=BuildRecord.from_dict(result.entry.manifest.get("built")),
            verification=self.request.verification,
            provider=self.config.provider.value,
            precision=self.config.precision.value,
        )


def reopen(
    exported: ExportedModel,
    spec: EncoderSpec,
    module: Callable[[], torch.nn.Module],
    provider: ResolvedProvider,
    config: OptimizeConfig,
    layout: SessionLayout,
) -> tuple[Session, ExportedModel] | None:
    """A session over a model ``optimize()`` already verified, for a pipeline unpickled
    (in a worker process, say). Its entry is looked up, and checked against its manifest,
    in each folder of :func:`~spacy_accelerate.cache.location.search_order`. Where none
    has it, the model is built again from the weights of ``module()`` (the PyTorch module
    of ``spec``, read back only then: :mod:`~spacy_accelerate.serving.parked_weights`),
    or None is returned where
    ``config.missing_cache`` says PyTorch (or where it cannot be built without the
    pipeline: a lossy plan, judged on the whole pipeline)."""
    required = _required_files(config)
    for root in search_order(exported.path.parent):
        cache = ModelCache(root, lock_timeout=config.lock_timeout)
        entry = cache.lookup(exported.key, required)
        if entry is None:
            continue
        # A bundled model (in a saved pipeline's folder) is read, never written to.
        keeps = None if exported.origin is Origin.BUNDLED else cache
        here = session_layout(config, spec, layout.buckets, keeps, entry.key)
        try:
            session = open_session(entry.file(_model_file(config)), provider, config, here, keeps)
        except Exception:
            if cache.lookup(exported.key, required) == entry:
                raise
            continue  # removed meanwhile (another process cleared the cache)
        if keeps is not None:
            record_use(entry)
        return session, replace(exported, path=entry.path)
    if config.missing_cache is MissingCache.PYTORCH or config.calibrated:
        return None
    verification = exported.verification or Verification(window=DEFAULT_WINDOW)
    # Built where its entry was (a pickle is this process's or the caller's own), except
    # a bundled model's: nothing is ever written into a saved pipeline's folder.
    recorded = None if exported.origin is Origin.BUNDLED else str(exported.path.parent)
    cache = ModelCache(saved_cache_dir(None, recorded), lock_timeout=config.lock_timeout)
    weights = module()
    detected = detect_architecture(weights)
    request = ServeRequest(weights, detected, config, provider, verification, layout.buckets)
    return get_or_export(request, cache)


#: The span window assumed for a model pickled before its checks were recorded.
DEFAULT_WINDOW = 128
