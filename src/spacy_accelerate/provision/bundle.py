"""A saved pipeline's bundle: the verified models it was served by, saved beside spaCy's
files so that every machine that loads it serves them without exporting or searching.

``nlp.to_disk(path)`` of an accelerated pipeline writes ``path/spacy_accelerate/``: a copy
of each served cache entry (``<key>/``: the model files, ``parity.json``, a lossy plan's
spot check, and its ``manifest.json`` with every file's SHA256 and the build's
:class:`~spacy_accelerate.verify.record.BuildRecord`), and ``bundle.json``: which entry
serves which transformer component, as which provider and precision (``auto``'s choice
made), the runtime release that wrote it, and the size and SHA256 of every other file.

A bundle is input from someone else. It is read only if every file in the folder is
listed, a regular file (no link) of its listed size and SHA256, under a plain relative
name (:func:`~spacy_accelerate.cache.manifest.check_listed_files`); only JSON and plain
numpy arrays are read from it, and the runtimes read the model files. Anything else
refuses it with a :class:`~spacy_accelerate.errors.BundleError` naming the file. A sound
bundle whose model cannot run here (:class:`Unservable`: its provider or runtime release
missing, a bf16 plan on a CPU without bf16, a spot check that fails) is not served; the
pipeline then follows ``missing_cache``. Nothing is ever written into it when it loads,
nor into the cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from spacy_accelerate._version import __version__
from spacy_accelerate.architectures import DetectedEncoder
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.backends.base import ServeRequest
from spacy_accelerate.backends.registry import (
    backend_for,
    check_provider,
    open_session,
    session_layout,
)
from spacy_accelerate.cache.manifest import (
    MANIFEST_NAME,
    CacheEntry,
    CorruptEntry,
    check_listed_files,
    file_records,
    sha256_file,
    verify_entry,
)
from spacy_accelerate.cache.manifest import (
    OWNER_MARK as MARK,
)
from spacy_accelerate.cache.root import KEY_PATTERN
from spacy_accelerate.cache.untrusted import read_json_object
from spacy_accelerate.errors import (
    AccuracyError,
    Advice,
    BundleError,
    ConversionError,
    ProviderUnavailableError,
)
from spacy_accelerate.options.config import OptimizeConfig, Precision, Provider
from spacy_accelerate.options.request import OptimizeRequest
from spacy_accelerate.provision.get_or_export import PARITY_FILE, ExportedModel, Origin
from spacy_accelerate.runtime.providers import ResolvedProvider
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.verify.parity import check_parity
from spacy_accelerate.verify.record import BuildRecord
from spacy_accelerate.verify.spot_check import (
    SPOT_CHECK_FILE,
    check_items,
    load_spot_check,
    recorded_mean,
    spot_check_gate,
)
from spacy_accelerate.verify.verification import Verification

#: The bundle's folder in a saved pipeline, and the file that lists it.
BUNDLE_DIR = "spacy_accelerate"
BUNDLE_FILE = "bundle.json"
#: The layout of ``bundle.json`` this release writes and reads (later ones are refused).
BUNDLE_FORMAT = 1
#: A runtime's release as the runtimes name them (``1.32.0``,
#: ``2026.4.1-22982-e213a147257-releases/2026/4``).
RELEASE_PATTERN = re.compile(r"[\w.+/-]{1,100}")


class Unservable(Exception):
    """A sound bundle whose model cannot be served here; the message says why."""


@dataclass(frozen=True)
class BundledModel:
    """One transformer component's model in the bundle."""

    key: str
    provider: Provider
    precision: Precision
    #: The span window its checks ran with (the rows of its spot check).
    window: int
    #: The release of the runtime that wrote it (None where it was not installed).
    runtime_version: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "provider": self.provider.value,
            "precision": self.precision.value,
            "window": self.window,
            "runtime_version": self.runtime_version,
        }

    @classmethod
    def from_dict(cls, recorded: Any) -> BundledModel:
        try:
            key, window = recorded["key"], recorded["window"]
            if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
                raise ValueError(f"key {key!r} is not a SHA256")
            if type(window) is not int or window <= 0:
                raise ValueError(f"window {window!r} is not a positive whole number")
            version = recorded.get("runtime_version")
            if version is not None and not (
                isinstance(version, str) and RELEASE_PATTERN.fullmatch(version)
            ):
                raise ValueError(f"runtime_version {version!r} is not a release")
            return cls(
                key=key,
                provider=Provider(recorded["provider"]),
                precision=Precision(recorded["precision"]),
                window=window,
                runtime_version=version,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CorruptEntry(f"{BUNDLE_FILE} describes a model it cannot ({error})") from None


@dataclass(frozen=True)
class BundledEntry:
    """One bundled entry, every file of it this library parses read when the bundle was:
    its manifest (verified against the listing), its build record, and what its spot
    check runs on (a lossy plan's calibration items and their mean cosine when it was
    built; for fp32, nothing: random and control ids)."""

    entry: CacheEntry
    record: BuildRecord
    items: list[EncoderInputs] | None = None
    mean_cosine: float | None = None

    @classmethod
    def read(cls, folder: Path, key: str, listed: Mapping[str, Any]) -> BundledEntry:
        """Entry ``key`` of the bundle in ``folder`` (its files hashed once, against
        ``listed``), read as input from elsewhere, or :class:`CorruptEntry` naming it."""
        try:
            entry = verify_entry(folder / key, key, hashed=_within(listed, key))
            record = BuildRecord.from_dict(entry.manifest.get("built"))
            parity = read_json_object(entry.file(PARITY_FILE))
            if SPOT_CHECK_FILE not in entry.manifest["files"]:
                return cls(entry, record)
            mean = recorded_mean(parity, PARITY_FILE)
            return cls(entry, record, load_spot_check(entry.file(SPOT_CHECK_FILE)), mean)
        except CorruptEntry as error:
            raise CorruptEntry(f"in {key}/, {error}") from None


@dataclass(frozen=True)
class Bundle:
    """A verified bundle: its folder, and the model of each transformer component."""

    folder: Path
    models: Mapping[str, BundledModel]
    #: The options that chose these models
    #: (:meth:`~spacy_accelerate.options.request.OptimizeRequest.model_options`): loaded
    #: with others, the pipeline builds what it is asked for instead.
    options: Mapping[str, Any]
    #: Each component's entry, read (and verified) when the bundle was read.
    entries: Mapping[str, BundledEntry]
    #: ``precision="auto"``'s choice where the pipeline was optimized with it.
    chosen: str | None = None

    def servable(
        self, component: str, config: OptimizeConfig
    ) -> tuple[OptimizeConfig, ResolvedProvider]:
        """The attempt that serves ``component`` from this bundle: ``config`` serving its
        model's provider and precision, and that provider resolved, where it can run here;
        else :class:`Unservable` saying why."""
        if component not in self.models:
            raise Unservable(f"it holds no model for the component {component!r}")
        attempt = servable_config(self.models[component], config)
        return attempt, check_provider(attempt)

    def differences(self, options: Mapping[str, Any]) -> list[str]:
        """The options (of a loading pipeline) whose values differ from the saved ones,
        each as ``name=value (saved: value)``."""
        given = json.loads(json.dumps(options))  # as saved: lists, not tuples
        # An option added since the bundle was written (``workload``) was its default then.
        defaults = {
            f.name: f.default for f in fields(OptimizeRequest) if f.name not in self.options
        }
        saved = {**json.loads(json.dumps(defaults, default=str)), **self.options}
        return [
            f"{name}={given.get(name)!r} (saved: {saved.get(name)!r})"
            for name in sorted(set(given) | set(self.options))
            if given.get(name) != saved.get(name)
        ]


def _refused(folder: Path, why: object) -> BundleError:
    return BundleError(
        f"The accelerated models saved with this pipeline ({folder}) were changed after "
        f"they were saved: {why}. Save the pipeline again with nlp.to_disk() from a process "
        f"that optimized it, or delete {folder} to load the pipeline from its own weights "
        "(it is then accelerated again as its config records)."
    )


def _within(listed: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The records of ``listed`` (bundle.json's) for the files of entry ``key``, by their
    names inside the entry."""
    prefix = f"{key}/"
    return {name[len(prefix) :]: info for name, info in listed.items() if name.startswith(prefix)}


def read_bundle(pipeline_dir: Path) -> Bundle | None:
    """The bundle saved in ``pipeline_dir``, verified; None where there is none. A
    :class:`~spacy_accelerate.errors.BundleError` where it was tampered with, an
    :class:`Unservable` where it was written in a layout this release does not read."""
    folder = pipeline_dir / BUNDLE_DIR
    if not os.path.lexists(folder):
        return None
    try:
        if folder.is_symlink() or not folder.is_dir():
            raise CorruptEntry(f"{BUNDLE_DIR} is not a folder")
        recorded = read_json_object(folder / BUNDLE_FILE)
        version = recorded.get("format_version")
        if isinstance(version, int) and version > BUNDLE_FORMAT:
            raise Unservable(
                f"it was saved by spacy-accelerate {recorded.get('spacy_accelerate')} in "
                f"bundle format {version}; this release reads format {BUNDLE_FORMAT}"
            )
        if version != BUNDLE_FORMAT:
            raise CorruptEntry(f"{BUNDLE_FILE} has no known format_version ({version!r})")
        listed = file_records(recorded.get("files"), BUNDLE_FILE)
        check_listed_files(folder, listed, BUNDLE_FILE)
        models = recorded.get("models")
        if not isinstance(models, dict) or not models:
            raise CorruptEntry(f"{BUNDLE_FILE} lists no model")
        options = recorded.get("options")
        if not isinstance(options, dict):
            raise CorruptEntry(f"{BUNDLE_FILE} does not say which options chose its models")
        bundled = {str(name): BundledModel.from_dict(model) for name, model in models.items()}
        bundle = Bundle(
            folder=folder,
            models=bundled,
            options=options,
            entries={
                name: BundledEntry.read(folder, model.key, listed)
                for name, model in bundled.items()
            },
            chosen=recorded.get("chosen") if isinstance(recorded.get("chosen"), str) else None,
        )
    except FileNotFoundError as error:
        raise _refused(folder, f"{Path(error.filename).name} is missing") from None
    except (CorruptEntry, OSError, ValueError) as error:
        raise _refused(folder, error) from None
    return bundle


def write_bundle(
    pipeline_dir: Path,
    served: Mapping[str, ExportedModel],
    options: Mapping[str, Any],
    chosen: str | None = None,
) -> Path:
    """Save each component's served entry (``served``, by component) into
    ``pipeline_dir``'s bundle, with the ``options`` that chose them, replacing any bundle
    there; return its folder. Written into a folder beside it, then renamed into place."""
    folder = pipeline_dir / BUNDLE_DIR
    staging = pipeline_dir / f".{BUNDLE_DIR}-{os.getpid()}-{time.monotonic_ns()}"
    staging.mkdir()
    try:
        files: dict[str, dict[str, Any]] = {}
        for exported in {model.key: model for model in served.values()}.values():
            files.update(_copy_entry(exported, staging))
        models = {name: _bundled(exported).as_dict() for name, exported in served.items()}
        listing = {
            "format_version": BUNDLE_FORMAT,
            "spacy_accelerate": __version__,
            "models": models,
            "options": dict(options),
            "chosen": chosen,
            "files": files,
        }
        (staging / BUNDLE_FILE).write_text(json.dumps(listing, indent=2, sort_keys=True))
        remove_bundle(pipeline_dir)
        os.rename(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def remove_bundle(pipeline_dir: Path) -> None:
    """Remove the bundle of a pipeline saved in ``pipeline_dir``, if there is one."""
    folder = pipeline_dir / BUNDLE_DIR
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.is_dir():
        shutil.rmtree(folder)


def _copy_entry(exported: ExportedModel, staging: Path) -> dict[str, dict[str, Any]]:
    """The served entry copied into ``staging/<key>/``, checked against its manifest
    first (it may have been evicted or changed since it was served); the bundle's
    records of what it copied."""
    try:
        entry = verify_entry(exported.path, exported.key)
    except CorruptEntry as error:
        raise BundleError(
            f"The model served for key {exported.key[:12]} is no longer intact at "
            f"{exported.path} ({error}), so it cannot be saved with the pipeline. Call "
            "spacy_accelerate.optimize(nlp) again, then save; or save with ",
            Advice("bundle", False),
            ".",
        ) from None
    target = staging / entry.key
    # The cache's owner mark stays behind: a bundle belongs to no cache, and wheels
    # leave out dot files.
    files = {name: record for name, record in entry.manifest["files"].items() if name != MARK}
    records: dict[str, dict[str, Any]] = {}
    for name, listed in files.items():
        copied = target / name
        copied.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry.path / name, copied)
        records[f"{entry.key}/{name}"] = {"size": copied.stat().st_size, **listed}
    manifest = target / MANIFEST_NAME
    manifest.write_text(json.dumps({**entry.manifest, "files": files}, indent=2, sort_keys=True))
    records[f"{entry.key}/{MANIFEST_NAME}"] = {
        "size": manifest.stat().st_size,
        "sha256": sha256_file(manifest),
    }
    return records


def _bundled(exported: ExportedModel) -> BundledModel:
    if exported.provider is None or exported.precision is None or exported.verification is None:
        raise ValueError(f"the served model {exported.key[:12]} does not say what serves it")
    provider = Provider(exported.provider)
    return BundledModel(
        key=exported.key,
        provider=provider,
        precision=Precision(exported.precision),
        window=exported.verification.window,
        runtime_version=backend_for(provider).runtime_version(),
    )


def _release(version: str | None) -> tuple[int, ...]:
    """A runtime release's (major, minor): ``2026.4.1-20000-abc`` -> (2026, 4)."""
    numbers = re.findall(r"\d+", version or "")[:2]
    return tuple(int(number) for number in numbers)


def servable_config(model: BundledModel, config: OptimizeConfig) -> OptimizeConfig:
    """``config`` serving ``model``'s provider and precision, where they can run here;
    else :class:`Unservable` saying why (the provider, the CPU's bf16, the runtime)."""
    attempt = replace(config, provider=model.provider, precision=model.precision)
    try:
        check_provider(attempt)
    except ProviderUnavailableError as error:
        raise Unservable(str(error)) from None
    backend = backend_for(model.provider)
    here = backend.runtime_version()
    if _release(here) < _release(model.runtime_version):
        raise Unservable(
            f"its model was written by {backend.runtime_name(model.provider)} "
            f"{model.runtime_version}, later than the {here} installed here"
        )
    return attempt


def serve_bundled(
    bundle: Bundle, component: str, request: ServeRequest
) -> tuple[Session, ExportedModel]:
    """A session over ``component``'s bundled model, served as ``request`` asks (its
    attempt and provider :meth:`Bundle.servable`'s), its spot check passed against
    ``request.module`` (PyTorch) on what the bundle stored: a lossy plan's calibration
    items, fp32's random and control ids of the window it was saved with. No export, no
    judging, nothing written. :class:`Unservable` where its runtime cannot open it here or
    its spot check fails."""
    start = time.perf_counter()
    model, bundled = bundle.models[component], bundle.entries[component]
    config, detected = request.config, request.detected
    if (config.provider, config.precision) != (model.provider, model.precision):
        served = f"{model.provider.value} {model.precision.value}"
        raise ValueError(f"{component!r} is bundled as {served}: see Bundle.servable")
    checks = _spot_check(bundle, component, config, detected)
    layout = session_layout(config, detected.spec, request.buckets, None, model.key)
    backend = backend_for(model.provider)
    try:
        model_file = bundled.entry.file(backend.model_file(config))
        session = open_session(model_file, request.provider, config, layout, None)
        parity = check_parity(request.module, detected, session, **checks)
    except (AccuracyError, ConversionError) as error:
        raise Unservable(f"its spot check against PyTorch fails here: {error}") from None
    except Exception as error:  # the runtime cannot open it here
        raise Unservable(
            f"{backend.runtime_name(model.provider)} cannot open it: {error}"
        ) from None
    exported = ExportedModel(
        key=model.key,
        path=bundled.entry.path,
        origin=Origin.BUNDLED,
        seconds=time.perf_counter() - start,
        parity=parity,
        record=bundled.record,
        verification=Verification(window=model.window),
        provider=model.provider.value,
        precision=model.precision.value,
    )
    return session, exported


def _spot_check(
    bundle: Bundle, component: str, config: OptimizeConfig, detected: DetectedEncoder
) -> dict[str, Any]:
    """The rows and gate of a bundled model's spot check, as a warm cache hit's; a
    :class:`~spacy_accelerate.errors.BundleError` where its stored items are not ones this
    encoder can take."""
    gate = config.gate()
    stored = bundle.entries[component]
    if stored.items is None:
        window = bundle.models[component].window
        return {"gate": gate, "batches": Verification(window=window).batches(detected.spec)}
    try:
        check_items(stored.items, detected.spec)
    except CorruptEntry as error:
        raise _refused(bundle.folder, f"in {bundle.models[component].key}/, {error}") from None
    return {"gate": spot_check_gate(gate, stored.mean_cosine), "batches": stored.items}
