"""A saved accelerated pipeline carries its verified models (its bundle): loaded anywhere
they can run, it serves them with no export and nothing written to the cache; a bundle
changed after it was saved is refused, naming the file; one that cannot run here says so
and the pipeline follows ``missing_cache``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
import torch
from annotations import annotations, run
from cpus import AVX2_EPYC
from spacy.language import Language

import spacy_accelerate
from spacy_accelerate import cpu_features as cpu_features_module
from spacy_accelerate.backends import registry
from spacy_accelerate.backends.onnxruntime.backend import OnnxRuntimeBackend
from spacy_accelerate.errors import BundleError
from spacy_accelerate.options.config import Precision, Provider
from spacy_accelerate.options.request import OptimizeRequest
from spacy_accelerate.provision import exports as shared_export
from spacy_accelerate.provision.bundle import (
    BUNDLE_DIR,
    BUNDLE_FILE,
    BundledModel,
    Unservable,
    servable_config,
)
from spacy_accelerate.provision.get_or_export import Origin


def _fail_export(*args: object, **kwargs: object) -> None:
    raise AssertionError("a bundled pipeline must not export")


@pytest.fixture()
def texts(ewt_texts: list[str]) -> list[str]:
    return ewt_texts[:16]


@pytest.fixture()
def saved(
    sample_path: Callable[[str], Path], cache_dir: Path, tmp_path: Path, texts: list[str]
) -> tuple[Path, list]:
    """An accelerated (cpu fp32) pipeline saved with its bundle, the cache it was built
    in removed, and the annotations of the process that saved it."""
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, provider="cpu", cache_dir=cache_dir)
    expected = _annotate(nlp, texts)
    nlp.to_disk(tmp_path / "saved")
    shutil.rmtree(cache_dir)
    return tmp_path / "saved", expected


@pytest.fixture()
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the loading process looks for its cache: an empty folder."""
    folder = tmp_path / "elsewhere-cache"
    folder.mkdir()
    monkeypatch.setenv("SPACY_ACCELERATE_CACHE", str(folder))
    return folder


def _annotate(nlp: Language, texts: list[str]) -> list:
    return [annotations(doc) for doc in run(nlp, texts, 8)]


def _written(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_saved_pipeline_serves_its_bundle_with_no_export_and_no_cache_write(
    saved: tuple[Path, list],
    empty_cache: Path,
    texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    folder, expected = saved
    listing = json.loads((folder / BUNDLE_DIR / BUNDLE_FILE).read_text())
    assert set(listing["models"]) == {"transformer"}
    monkeypatch.setattr(shared_export, "export_onnx", _fail_export)
    before = {p: p.stat().st_mtime_ns for p in (folder / BUNDLE_DIR).rglob("*")}
    with caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        loaded = spacy.load(folder)
    proxy = spacy_accelerate.accelerated_components(loaded)["transformer"]
    assert proxy.exported.origin is Origin.BUNDLED and "bundled" in proxy.exported.summary
    assert any("transformer runs cpu fp32, bundled" in r.getMessage() for r in caplog.records)
    assert _annotate(loaded, texts) == expected
    assert _written(empty_cache) == []  # nothing into the cache, no lock
    assert {p: p.stat().st_mtime_ns for p in (folder / BUNDLE_DIR).rglob("*")} == before
    # A copy in another process (pickled) serves the same bundle, still writing nothing.
    again = pickle.loads(pickle.dumps(loaded))
    copy = spacy_accelerate.accelerated_components(again)["transformer"]
    assert copy.exported.origin is Origin.BUNDLED
    assert _annotate(again, texts) == expected
    assert _written(empty_cache) == []


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _model(bundle: Path) -> Path:
    return next(bundle.glob("*/model.onnx"))


def _listing(bundle: Path, change: Callable[[dict], None]) -> None:
    path = bundle / BUNDLE_FILE
    listing = json.loads(path.read_text())
    change(listing)
    path.write_text(json.dumps(listing))


TAMPERS: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "flipped byte": (lambda b, t: _flip(_model(b)), "model.onnx does not match"),
    "truncated": (
        lambda b, t: _model(b).write_bytes(_model(b).read_bytes()[:100]),
        "model.onnx has 100 bytes",
    ),
    "extra file": (
        lambda b, t: (_model(b).parent / "model.onnx.data").write_bytes(b"x"),
        "model.onnx.data is in",
    ),
    "dot-dot name": (
        lambda b, t: _listing(
            b, lambda m: m["files"].update({"../config.cfg": {"size": 1, "sha256": "0"}})
        ),
        "unsafe file name '../config.cfg'",
    ),
    "symlink out": (
        lambda b, t: (
            (t / "outside.onnx").write_bytes(_model(b).read_bytes()),
            _model(b).unlink(),
            _model_path(b).symlink_to(t / "outside.onnx"),
        ),
        "model.onnx is not a regular file",
    ),
    "manifest and listing disagree": (
        lambda b, t: _manifest_against_listing(b),
        "model.onnx is recorded otherwise in manifest.json",
    ),
    "listed but absent": (
        lambda b, t: (b / next(n for n in os.listdir(b) if len(n) == 64) / "parity.json").unlink(),
        "parity.json is missing",
    ),
}


def _manifest_against_listing(bundle: Path) -> None:
    """The entry's manifest records another model.onnx, and bundle.json the changed
    manifest: every file matches bundle.json, but the entry's own record does not."""
    key = next(name for name in os.listdir(bundle) if len(name) == 64)
    manifest_path = bundle / key / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["model.onnx"]["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    data = manifest_path.read_bytes()
    record = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _listing(bundle, lambda m: m["files"].update({f"{key}/manifest.json": record}))


def _model_path(bundle: Path) -> Path:
    key = next(name for name in os.listdir(bundle) if len(name) == 64)
    return bundle / key / "model.onnx"


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_a_bundle_changed_after_it_was_saved_is_refused_naming_the_file(
    saved: tuple[Path, list],
    empty_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tamper: str,
):
    folder, _ = saved
    change, named = TAMPERS[tamper]
    change(folder / BUNDLE_DIR, tmp_path)
    monkeypatch.setattr(shared_export, "export_onnx", _fail_export)
    with pytest.raises(BundleError, match="changed after they were saved") as caught:
        spacy.load(folder)
    assert named in str(caught.value)
    assert f"delete {folder / BUNDLE_DIR}" in str(caught.value)
    assert _written(empty_cache) == []


def test_a_bundle_this_machine_cannot_run_says_why_and_follows_missing_cache(
    saved: tuple[Path, list],
    cache_dir: Path,
    empty_cache: Path,
    texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    folder, expected = saved
    # As if the installed ONNX Runtime were older than the one that wrote the model.
    monkeypatch.setattr(OnnxRuntimeBackend, "runtime_version", lambda self: "0.1.0")
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        loaded = spacy.load(folder)
    (line,) = [r.getMessage() for r in caplog.records if "cannot be served here" in r.getMessage()]
    assert "later than the 0.1.0 installed here" in line and "missing_cache='rebuild'" in line
    proxy = spacy_accelerate.accelerated_components(loaded)["transformer"]
    assert proxy.exported.origin is Origin.EXPORTED  # rebuilt from the pipeline's weights
    assert proxy.exported.path.parent == empty_cache  # in the loading process's cache
    assert _annotate(loaded, texts) == expected
    # missing_cache="pytorch": on PyTorch, with the same line first.
    caplog.clear()
    shutil.rmtree(empty_cache)
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        plain = spacy.load(
            folder, config={"nlp": {"after_pipeline_creation": {"missing_cache": "pytorch"}}}
        )
    assert any("missing_cache='pytorch'" in r.getMessage() for r in caplog.records)
    assert not spacy_accelerate.is_optimized(plain)


def test_bundle_false_saves_options_only_and_removes_an_earlier_bundle(
    sample_path: Callable[[str], Path], cache_dir: Path, tmp_path: Path
):
    nlp: Language = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, provider="cpu", cache_dir=cache_dir)
    nlp.to_disk(tmp_path / "saved")
    assert (tmp_path / "saved" / BUNDLE_DIR / BUNDLE_FILE).is_file()
    spacy_accelerate.optimize(nlp, provider="cpu", cache_dir=cache_dir, bundle=False)
    nlp.to_disk(tmp_path / "saved")
    assert not (tmp_path / "saved" / BUNDLE_DIR).exists()
    loaded = spacy.load(tmp_path / "saved")
    assert spacy_accelerate.accelerated_components(loaded)["transformer"].exported.cache_hit


def _bundled(provider: Provider, precision: Precision, version: str | None) -> BundledModel:
    return BundledModel(
        key="0" * 64, provider=provider, precision=precision, window=128, runtime_version=version
    )


UNSERVABLE: dict[str, tuple[Callable[[pytest.MonkeyPatch], BundledModel], str]] = {
    "bf16 on a cpu without bf16": (
        lambda mp: (
            mp.setattr(cpu_features_module, "_simulated", [AVX2_EPYC]),
            _bundled(Provider.OPENVINO, Precision.BF16, None),
        )[1],
        "AMX-BF16",
    ),
    "openvino not installed": (
        lambda mp: (
            mp.setattr(registry, "available_providers", lambda: {Provider.CPU}),
            _bundled(Provider.OPENVINO, Precision.FP32, None),
        )[1],
        "spacy-accelerate[openvino]",
    ),
    "a later runtime": (
        lambda mp: _bundled(Provider.CPU, Precision.FP32, "999.0.0"),
        "later than the",
    ),
    "a gpu plan without the gpu": (
        lambda mp: (
            mp.setattr(torch.cuda, "is_available", lambda: False),
            _bundled(Provider.CUDA, Precision.FP16, None),
        )[1],
        "provider='cuda'",
    ),
}


@pytest.mark.parametrize("cause", list(UNSERVABLE))
def test_a_bundled_plan_that_cannot_run_here_is_unservable_saying_why(
    monkeypatch: pytest.MonkeyPatch, cause: str
):
    make, said = UNSERVABLE[cause]
    model = make(monkeypatch)
    config = OptimizeRequest().to_config(None)
    with pytest.raises(Unservable, match=re.escape(said)):
        servable_config(model, config)


def test_a_bundled_plan_this_machine_runs_is_servable():
    import onnxruntime

    here = _bundled(Provider.CPU, Precision.FP32, onnxruntime.__version__)
    served = servable_config(here, OptimizeRequest(provider="auto").to_config(None))
    assert (served.provider, served.precision) == (Provider.CPU, Precision.FP32)


LOADER = """
import json, logging, sys
import spacy
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
nlp = spacy.load(sys.argv[1])
docs = nlp.pipe(json.loads(sys.argv[2]))
print(json.dumps([[(t.tag_, t.pos_, t.dep_, t.head.i, t.ent_iob_, t.ent_type_) for t in doc]
                  for doc in docs]))
"""


@pytest.mark.slow
def test_a_spacy_package_wheel_installed_elsewhere_loads_accelerated_with_no_export(
    saved: tuple[Path, list], texts: list[str], tmp_path: Path
):
    """``spacy package --build wheel``, the wheel installed into a folder of its own and
    loaded from there by a fresh process whose cache does not exist: served from the bundle
    the wheel holds, the same tags, nothing written where the cache would be."""
    folder, expected = saved
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(name="tiny_accel", version="0.0.1")
    (folder / "meta.json").write_text(json.dumps(meta))
    dist = tmp_path / "dist"
    dist.mkdir()
    built = subprocess.run(
        [sys.executable, "-m", "spacy", "package", str(folder), str(dist), "--build", "wheel"],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("*/dist/*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        requires = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert any(f"/{BUNDLE_DIR}/{BUNDLE_FILE}" in name for name in names), names
    # pip brings the library and the runtime the bundle runs on (here ONNX Runtime's CPU).
    assert re.search(r"^Requires-Dist: spacy-accelerate\[cpu\]>=", requires, re.M), requires
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site)]
    installed = subprocess.run([*pip, str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr

    cache = tmp_path / "no-cache-here"
    env = {**os.environ, "PYTHONPATH": str(site), "SPACY_ACCELERATE_CACHE": str(cache)}
    loaded = subprocess.run(
        [sys.executable, "-c", LOADER, "en_tiny_accel", json.dumps(texts)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert re.search(r"runs cpu fp32, bundled", loaded.stderr), loaded.stderr
    assert "export" not in loaded.stderr, loaded.stderr
    assert json.loads(loaded.stdout) == [[list(token) for token in doc] for doc in expected]
    assert not cache.exists()


@pytest.mark.parametrize("provider", ["cpu", pytest.param("openvino", marks=pytest.mark.slow)])
def test_a_bundled_load_with_a_read_only_home_and_pipeline_serves_and_writes_nothing(
    sample_path: Callable[[str], Path],
    cache_dir: Path,
    tmp_path: Path,
    texts: list[str],
    provider: str,
):
    """A fleet machine: the pipeline's folder read-only, no cache configured, and a HOME
    nobody can write (``/proc/self``: root included), where the default cache and the
    runtimes' telemetry files would go. Served from the bundle, the same annotations."""
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, provider=provider, cache_dir=cache_dir)
    expected = _annotate(nlp, texts)
    folder = tmp_path / "saved"
    nlp.to_disk(folder)
    before = _tree(folder)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    unset = ("SPACY_ACCELERATE_CACHE", "XDG_CACHE_HOME")
    env = {name: value for name, value in os.environ.items() if name not in unset}
    loaded = subprocess.run(
        [sys.executable, "-c", LOADER, str(folder), json.dumps(texts)],
        capture_output=True,
        text=True,
        env={**env, "HOME": "/proc/self"},
        cwd=workdir,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert re.search(rf"runs {provider} fp32, bundled", loaded.stderr), loaded.stderr
    assert json.loads(loaded.stdout) == [[list(token) for token in doc] for doc in expected]
    assert _tree(folder) == before and list(workdir.iterdir()) == []


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` with its size and modification time."""
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in folder.rglob("*")
    }
