"""What a hostile user and a busy server do to the library, each with the fix it needed.

One test (or a few) per finding of the adversarial pass: data the library did not make
survives ``clear``; a verdict does not depend on what the cache held before; parity sees
the pieces every real span holds; calibration texts never reach the disk; a saved or
pickled pipeline finds its cache on another machine; failures are the library's errors;
lock waits say so; swaps are safe while other threads annotate; a failed load leaves a
consistent pipeline.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import spacy
from annotations import annotations, disagreements, run
from spacy.language import Language
from thinc.api import Config

import spacy_accelerate
from spacy_accelerate import AccuracyError, CacheError, SpacyAccelerateError
from spacy_accelerate.backends.onnxruntime.session import EncoderSession
from spacy_accelerate.backends.registry import session_layout
from spacy_accelerate.cache import lock as cache_lock
from spacy_accelerate.cache.store import MANIFEST_NAME, ModelCache, sha256_file
from spacy_accelerate.options.config import MissingCache
from spacy_accelerate.pipeline.components import find_transformer_components
from spacy_accelerate.pipeline.patch import CONVERT_INPUTS, PassLayerFlag
from spacy_accelerate.pipeline.persist import CALLBACK_NAME
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.provision import bundle as bundle_module
from spacy_accelerate.provision import exports as shared_export
from spacy_accelerate.provision import get_or_export as exported
from spacy_accelerate.provision.get_or_export import PARITY_FILE
from spacy_accelerate.provision.storage import storage_failure
from spacy_accelerate.verify.parity import check_parity
from spacy_accelerate.verify.verification import random_rows


@pytest.fixture()
def texts(ewt_texts: list[str]) -> list[str]:
    return ewt_texts[:16]


def _proxy(nlp: Language) -> spacy_accelerate.serving.proxy.AcceleratedModule:
    return spacy_accelerate.accelerated_components(nlp)["transformer"]


def _location(nlp: Language) -> spacy_accelerate.pipeline.shim.ShimLocation:
    return find_shim(find_transformer_components(nlp)[0])


def _rewrite_manifest(entry: Path, changed: dict[str, Path | None]) -> None:
    """What a hostile hand does: change files and make the manifest match them again."""
    manifest = json.loads((entry / MANIFEST_NAME).read_text())
    for name, path in changed.items():
        if path is None:
            del manifest["files"][name]
        else:
            manifest["files"][name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    (entry / MANIFEST_NAME).write_text(json.dumps(manifest))


# --------------------------------------------------------------------------- 1. data loss


def test_cache_clear_on_the_command_line_keeps_a_users_files(
    roberta: Language, cache_dir: Path, tmp_path: Path
):
    from typer.testing import CliRunner

    from spacy_accelerate.cli import app

    spacy_accelerate.optimize(roberta, "openvino", "fp32", cache_dir=cache_dir)
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "chapter.tex").write_text("years of work")
    os.symlink(thesis, cache_dir / "openvino" / "some-cpu")
    for mine in ("openvino/notes.txt", "tensorrt/gpu0/timing/t.txt", ".tmp-notes/keep.txt"):
        (cache_dir / mine).parent.mkdir(parents=True, exist_ok=True)
        (cache_dir / mine).write_text("mine")
    result = CliRunner().invoke(app, ["cache", "clear", "--yes", "--cache-dir", str(cache_dir)])
    assert result.exit_code == 0, result.output
    assert "removed 1 cached models" in result.output
    assert (thesis / "chapter.tex").read_text() == "years of work"
    for mine in ("openvino/notes.txt", "tensorrt/gpu0/timing/t.txt", ".tmp-notes/keep.txt"):
        assert (cache_dir / mine).read_text() == "mine"
    assert spacy_accelerate.list_cached(cache_dir) == []


# --------------------------------------------------------------------------- 2. verdicts


def _int8_verdict(nlp: Language, cache_dir: Path, min_cosine: float, verify: bool) -> str:
    try:
        spacy_accelerate.optimize(
            nlp, "cpu", "int8", cache_dir=cache_dir, min_cosine=min_cosine, verify=verify
        )
    except AccuracyError:
        return "refused"
    return f"served, plan {_proxy(nlp).exported.record.plan}"


@pytest.mark.parametrize("verify", [pytest.param(True, marks=pytest.mark.slow), False])
def test_a_verdict_does_not_depend_on_what_the_cache_held(
    roberta: Language, tmp_path: Path, verify: bool
):
    shared = tmp_path / "shared"
    assert _int8_verdict(roberta, shared, 0.9, verify) == "served, plan every MatMul int8"
    # Bounds just above what the all-int8 plan reached: an empty cache tries the next
    # plans for them; a cache holding the looser entry must give the same verdict.
    reached = _proxy(roberta).exported.parity.worst_cosine
    strict = [reached + (1 - reached) * 0.1, reached + (1 - reached) * 0.9]
    fresh = {b: _int8_verdict(roberta, tmp_path / f"fresh-{b}", b, verify) for b in strict}
    after = {b: _int8_verdict(roberta, shared, b, verify) for b in strict}
    assert after == fresh
    # The gate of the plan search is part of the key: one entry per bound served.
    assert len(spacy_accelerate.list_cached(shared)) == 1 + sum(
        verdict.startswith("served") for verdict in fresh.values()
    )


# --------------------------------------------------------------------------- 3. real pieces


def test_parity_sees_the_span_markers_every_real_span_holds(
    roberta: Language, cache_dir: Path, texts: list[str], caplog: pytest.LogCaptureFixture
):
    reference = run(roberta, texts, 8)
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)
    proxy = _proxy(roberta)
    probe = proxy.exported.verification.probe
    assert probe, "the pipeline's own inputs on built-in text are checked"
    first = probe[0]
    bos = int(first.input_ids[0, 0])
    eos = int(first.input_ids[0, first.attention_mask[0].sum() - 1])
    assert {bos, eos} <= {int(row[0]) for batch in probe for row in batch.input_ids} | {eos}
    # Tamper with those two embedding rows only, and make the manifest match again.
    entry = proxy.exported.path
    model = onnx.load(str(entry / "model.onnx"))
    spec = proxy.spec
    (table,) = [
        init
        for init in model.graph.initializer
        if tuple(init.dims) == (spec.vocab_size, spec.embedding_width or spec.hidden_width)
    ]
    weights = onnx.numpy_helper.to_array(table).copy()
    rows = weights[[bos, eos]]
    weights[[bos, eos]] = -rows + 3 * rows.std()
    table.CopyFrom(onnx.numpy_helper.from_array(weights, table.name))
    onnx.save(model, str(entry / "model.onnx"))
    _rewrite_manifest(entry, {"model.onnx": entry / "model.onnx"})
    # Random ids alone would have served it (they miss both rows here) ...
    random = random_rows(spec, 32)
    assert not np.isin([bos, eos], random.input_ids[random.attention_mask.astype(bool)]).any()
    config = proxy.session.config
    layout = session_layout(
        config, spec, proxy.session.layout.buckets, ModelCache(cache_dir), proxy.exported.key
    )
    tampered = EncoderSession(entry / "model.onnx", proxy.session.provider, config, layout)
    detected = spacy_accelerate.architectures.detect_architecture(proxy.read_original())
    gate = config.gate()
    assert check_parity(
        proxy.read_original(), detected, tampered, gate=gate, batches=[random]
    ).passed
    # ... while it changes the annotations.
    spacy_accelerate.restore(roberta)
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir, verify=True)
    # The hit fails its re-check and is rebuilt under its key, never served.
    assert not _proxy(roberta).exported.cache_hit
    assert "is rebuilt" in caplog.text
    assert not disagreements(reference, run(roberta, texts, 8), roberta)


def test_every_special_id_of_the_tokenizer_is_checked(
    sample_path: Callable[[str], Path], cache_dir: Path
):
    nlp = spacy.load(sample_path("st-bert"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    proxy = _proxy(nlp)
    checked = {
        int(i)
        for batch in proxy.exported.verification.batches(proxy.spec)
        for i in batch.input_ids[batch.attention_mask.astype(bool)]
    }
    tokenizer = nlp.get_pipe("transformer").model.tokenizer
    special = set(tokenizer.all_special_ids) - {tokenizer.pad_token_id}
    assert special and special <= checked
    assert set(proxy.exported.verification.special_ids) == set(tokenizer.all_special_ids)


# --------------------------------------------------------------------------- 5. portable


def test_a_saved_pipeline_uses_the_callers_cache_where_it_loads(
    roberta: Language,
    tmp_path: Path,
    texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
):
    reference = run(roberta, texts, 8)
    here = tmp_path / "alice" / "cache"
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=here, bundle=False)
    roberta.to_disk(tmp_path / "saved")
    saved = (tmp_path / "saved" / "config.cfg").read_text()
    assert str(here) not in saved  # no path of this machine goes out with the pipeline
    elsewhere = tmp_path / "bob-env"
    monkeypatch.setenv("SPACY_ACCELERATE_CACHE", str(elsewhere))
    with monkeypatch.context() as patched:
        patched.setattr(shared_export, "export_onnx", _no_export)
        # A folder given at load is the caller's: a hit there.
        shutil.copytree(here, tmp_path / "override")
        override = {"nlp.after_pipeline_creation.cache_dir": str(tmp_path / "override")}
        loaded = spacy.load(tmp_path / "saved", config=override)
        assert _proxy(loaded).exported.path.parent == tmp_path / "override"
        # ... also where the caller gives the whole section (spaCy keeps it as one value).
        section = {"@callbacks": CALLBACK_NAME, "cache_dir": str(tmp_path / "override")}
        whole = {"nlp": {"after_pipeline_creation": section}}
        loaded = spacy.load(tmp_path / "saved", config=whole)
        assert _proxy(loaded).exported.path.parent == tmp_path / "override"
    # Otherwise the environment variable, and the model is exported there.
    loaded = spacy.load(tmp_path / "saved")
    assert _proxy(loaded).exported.path.parent == elsewhere
    assert not disagreements(reference, run(loaded, texts, 8), loaded)
    # Without the variable, the platform's default.
    monkeypatch.delenv("SPACY_ACCELERATE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "bob-home"))
    loaded = spacy.load(tmp_path / "saved")
    assert _proxy(loaded).exported.path.parent == tmp_path / "bob-home" / "spacy-accelerate"


@pytest.mark.parametrize("bundle", [False, True])
def test_a_config_from_elsewhere_does_not_choose_where_this_machine_writes(
    roberta: Language,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    bundle: bool,
):
    # Someone else's pipeline names folders of this machine in its config (as an earlier
    # release's saved_cache_dir, or a hand-written cache_dir); it loads, and serves, but
    # writes nothing there. With a bundle that cannot be served here, it is rebuilt.
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=tmp_path / "theirs", bundle=bundle)
    saved = tmp_path / "saved"
    roberta.to_disk(saved)
    if bundle:
        monkeypatch.setattr(bundle_module, "servable_config", _not_servable_here)
    system = tmp_path / "system"
    system.mkdir()
    config = Config().from_disk(saved / "config.cfg")
    section = config["nlp"]["after_pipeline_creation"]
    section["cache_dir"] = str(system / "cache")
    section["saved_cache_dir"] = str(system / "saved")
    config.to_disk(saved / "config.cfg")
    monkeypatch.setenv("SPACY_ACCELERATE_CACHE", str(tmp_path / "callers"))
    with caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        loaded = spacy.load(saved)
    assert list(system.iterdir()) == []
    assert _proxy(loaded).exported.path.parent == tmp_path / "callers"
    assert "ignored: a loaded pipeline does not choose where this machine writes" in caplog.text
    assert str(system / "cache") in caplog.text and str(system / "saved") in caplog.text


def _not_servable_here(*args: object) -> None:
    raise bundle_module.Unservable("its runtime is not installed here")


def _no_export(*args: object, **kwargs: object) -> None:
    raise AssertionError("the model should have come from the cache")


@pytest.mark.parametrize("missing_cache", list(MissingCache))
def test_an_unpickled_pipeline_whose_cache_is_gone(
    roberta: Language,
    tmp_path: Path,
    texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    missing_cache: MissingCache,
):
    reference = run(roberta, texts, 8)
    first = tmp_path / "first"
    spacy_accelerate.optimize(
        roberta, "cpu", "fp32", cache_dir=first, missing_cache=missing_cache.value
    )
    data = pickle.dumps(roberta)
    shutil.rmtree(first)
    first.write_text("the cache is gone, and its folder cannot be made here")
    monkeypatch.setenv("SPACY_ACCELERATE_CACHE", str(tmp_path / "worker-cache"))
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        copy = pickle.loads(data)
    if missing_cache is MissingCache.REBUILD:  # re-optimized from the pickled weights
        assert spacy_accelerate.is_optimized(copy)
        assert _proxy(copy).exported.path.parent == tmp_path / "worker-cache"
        assert not _proxy(copy).exported.cache_hit
    else:  # plain PyTorch, said so, and trainable again
        assert not spacy_accelerate.is_optimized(copy)
        assert "runs on PyTorch" in caplog.text
        copy.resume_training()
    assert not disagreements(reference, run(copy, texts, 8), copy)


# --------------------------------------------------------------------------- 6. raw errors


@pytest.mark.parametrize("removed", ["model.onnx", PARITY_FILE])
def test_an_entry_without_a_file_it_needs_is_rebuilt(
    roberta: Language, cache_dir: Path, removed: str
):
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)
    entry = _proxy(roberta).exported.path
    (entry / removed).unlink()
    _rewrite_manifest(entry, {removed: None})  # a well-formed manifest without it
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)
    assert not _proxy(roberta).exported.cache_hit
    assert (entry / removed).is_file()
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)
    assert _proxy(roberta).exported.cache_hit


def test_an_entry_cleared_between_its_check_and_its_opening_is_got_again(
    roberta: Language, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)
    opened = exported.open_session
    cleared: list[int] = []

    def cleared_first(*args: object, **kwargs: object) -> object:
        if not cleared:  # what clear_cache() in another process does at the worst moment
            cleared.append(ModelCache(cache_dir).clear())
        return opened(*args, **kwargs)

    monkeypatch.setattr(exported, "open_session", cleared_first)
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)
    assert cleared == [1] and spacy_accelerate.is_optimized(roberta)
    assert not _proxy(roberta).exported.cache_hit


def test_storage_failures_are_recognised_through_the_exporters_wrapping():
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    wrapped = spacy_accelerate.ConversionError("export failed")
    wrapped.__cause__ = full
    assert storage_failure(wrapped) == os.strerror(errno.ENOSPC)
    assert storage_failure(RuntimeError("write: No space left on device")) is not None
    assert storage_failure(RuntimeError("Gather index out of range")) is None


_FULL_DISK = """
import resource, signal, sys
import spacy, spacy_accelerate
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
nlp = spacy.load(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # files over 200 kB fail
try:
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=sys.argv[2])
except spacy_accelerate.SpacyAccelerateError as error:
    print(type(error).__name__, "|", error)
"""


def test_a_full_disk_is_a_cache_error_naming_the_folder(
    sample_path: Callable[[str], Path], tmp_path: Path
):
    script = tmp_path / "full.py"
    script.write_text(_FULL_DISK)
    cache = tmp_path / "small-disk"
    done = subprocess.run(
        [sys.executable, str(script), str(sample_path("roberta")), str(cache)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    kind, message = done.stdout.strip().splitlines()[-1].split(" | ", 1)
    assert kind == "CacheError", message
    assert str(cache) in message and "cache_dir=" in message and "report" not in message
    assert ModelCache(cache).entries() == [] and not list(cache.glob(".tmp-*"))


# --------------------------------------------------------------------------- 7. waiting


def test_optimize_says_it_waits_and_takes_a_lock_timeout(
    roberta: Language,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)
    key = _proxy(roberta).exported.key
    spacy_accelerate.restore(roberta)
    cache = ModelCache(cache_dir)
    cache.evict(key)
    monkeypatch.setattr(cache_lock, "NOTICE_AFTER", 0.2)
    with cache._lock(key), caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        with pytest.raises(CacheError, match="lock_timeout") as info:
            spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir, lock_timeout=1)
    assert f"pid {os.getpid()}" in str(info.value)
    assert any("waiting" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
    assert not spacy_accelerate.is_optimized(roberta)


# --------------------------------------------------------------------------- 6. threads


def test_a_batch_in_flight_finishes_on_the_module_it_started_with(
    roberta: Language, cache_dir: Path
):
    text = "A batch that is in flight while another thread restores the pipeline."
    expected = annotations(roberta(text))
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)
    layer = _location(roberta).layer
    convert = layer.attrs[CONVERT_INPUTS]
    assert isinstance(convert, PassLayerFlag)
    entered, go = threading.Event(), threading.Event()

    def pausing(*args: object, **kwargs: object) -> object:
        if threading.current_thread().name == "annotator":
            entered.set()
            go.wait(10)
        return convert.inner(*args, **kwargs)

    layer.attrs[CONVERT_INPUTS] = PassLayerFlag(pausing)
    results: dict[str, object] = {}

    def annotate() -> None:
        try:
            results["doc"] = annotations(roberta(text))
        except Exception as error:  # reported below
            results["error"] = error

    annotator = threading.Thread(target=annotate, name="annotator")
    restorer = threading.Thread(target=spacy_accelerate.restore, args=(roberta,))
    annotator.start()
    assert entered.wait(10)
    restorer.start()
    time.sleep(0.3)
    assert restorer.is_alive(), "restore() must wait for the batch in flight"
    go.set()
    annotator.join(10)
    restorer.join(10)
    assert "error" not in results, results.get("error")
    assert results["doc"] == expected
    assert not spacy_accelerate.is_optimized(roberta)


def test_optimize_and_restore_while_another_thread_annotates(
    roberta: Language, cache_dir: Path, texts: list[str]
):
    reference = [annotations(doc) for doc in run(roberta, texts, 4)]
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)  # builds once
    stop = threading.Event()
    seen: list[object] = []

    def annotate() -> None:
        while not stop.is_set():
            try:
                seen.append([annotations(doc) for doc in roberta.pipe(texts, batch_size=4)])
            except Exception as error:  # reported below
                seen.append(error)

    annotator = threading.Thread(target=annotate)
    annotator.start()
    try:
        for _ in range(6):
            spacy_accelerate.restore(roberta)
            spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir, warmup=False)
    finally:
        stop.set()
        annotator.join(60)
    errors = [item for item in seen if isinstance(item, Exception)]
    assert not errors, errors[:3]
    assert seen and all(item == reference for item in seen)


# --------------------------------------------------------------------------- 8. half-states


def test_a_failed_load_leaves_the_pipeline_accelerated_as_before(
    roberta: Language, cache_dir: Path, tmp_path: Path, texts: list[str]
):
    reference = run(roberta, texts, 8)
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)
    with pytest.raises((OSError, ValueError)):
        roberta.from_disk(tmp_path / "no-such-pipeline")
    with pytest.raises(Exception):  # noqa: B017 - whatever srsly raises on garbage
        roberta.from_bytes(b"not a pipeline")
    assert spacy_accelerate.is_optimized(roberta)
    assert roberta.config["nlp"]["after_pipeline_creation"]["@callbacks"].startswith(
        "spacy_accelerate.optimize"
    )
    with pytest.raises(spacy_accelerate.InferenceOnlyError):
        roberta.resume_training()
    assert not disagreements(reference, run(roberta, texts, 8), roberta)


def test_a_load_that_cannot_be_accelerated_again_leaves_a_plain_pipeline(
    roberta: Language, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from spacy_accelerate import api as accelerate

    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)

    def fails(*args: object, **kwargs: object) -> None:
        raise spacy_accelerate.ProviderUnavailableError("pretend onnxruntime went away")

    monkeypatch.setattr(accelerate, "apply_config", fails)
    with pytest.raises(OSError):
        roberta.from_disk(tmp_path / "no-such-pipeline")
    # Consistent: PyTorch, trainable, and a config that no longer says "accelerated".
    assert not spacy_accelerate.is_optimized(roberta)
    assert roberta.config["nlp"]["after_pipeline_creation"] is None
    roberta.resume_training()


def test_every_failure_here_is_one_of_the_librarys_errors():
    for error in (CacheError, AccuracyError, spacy_accelerate.errors.CacheMissError):
        assert issubclass(error, SpacyAccelerateError)


# --------------------------------------------------------------------------- entries


def test_cache_keys_hash_what_the_checks_ran_on(roberta: Language, cache_dir: Path):
    spacy_accelerate.optimize(roberta, "cpu", "int8", cache_dir=cache_dir, min_cosine=0.9)
    (entry,) = ModelCache(cache_dir).entries()
    export = entry.manifest["key_inputs"]["export"]
    proxy = _proxy(roberta)
    assert export["verified_on_sha256"] == proxy.exported.verification.digest(proxy.spec)
    assert export["plan_gate"] == {"min_cosine": 0.9}
    assert export["cpu_int8_kernels"] == list(
        spacy_accelerate.cpu_features.cpu_features().int8_kernels
    )
    assert (
        hashlib.sha256(
            json.dumps(entry.manifest["key_inputs"], sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        == entry.key
    )


def test_a_saved_pipeline_told_not_to_export_at_load_runs_on_pytorch(
    roberta: Language,
    cache_dir: Path,
    tmp_path: Path,
    texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    reference = run(roberta, texts, 8)
    spacy_accelerate.optimize(
        roberta, "cpu", "fp32", cache_dir=cache_dir, missing_cache="pytorch", bundle=False
    )
    roberta.to_disk(tmp_path / "saved")
    assert 'missing_cache = "pytorch"' in (tmp_path / "saved" / "config.cfg").read_text()
    assert spacy_accelerate.is_optimized(spacy.load(tmp_path / "saved"))  # cached: a hit
    spacy_accelerate.clear_cache(cache_dir)
    monkeypatch.setattr(shared_export, "export_onnx", _no_export)
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        loaded = spacy.load(tmp_path / "saved")
    assert "runs on PyTorch" in caplog.text and "missing_cache='pytorch'" in caplog.text
    assert not spacy_accelerate.is_optimized(loaded)
    loaded.resume_training()  # as restore() leaves it
    assert not disagreements(reference, run(loaded, texts, 8), loaded)


# --------------------------------------------------------------------------- review findings


def test_a_pipeline_saved_without_cache_dir_keeps_following_the_environment(
    roberta: Language, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("SPACY_ACCELERATE_CACHE", str(tmp_path / "a"))
    spacy_accelerate.optimize(roberta, "cpu", "fp32", bundle=False)
    roberta.to_disk(tmp_path / "first")
    loaded = spacy.load(tmp_path / "first")
    assert loaded.config["nlp"]["after_pipeline_creation"]["saved_cache_dir"] is None
    loaded.to_disk(tmp_path / "second")  # a load -> save round trip records no folder
    monkeypatch.setenv("SPACY_ACCELERATE_CACHE", str(tmp_path / "b"))
    again = _proxy(spacy.load(tmp_path / "second"))
    assert again.exported.path.parent == tmp_path / "b"


def test_calibration_texts_stay_in_memory_for_new_weights_but_never_go_out():
    from spacy_accelerate.options.request import OptimizeRequest, build_config

    texts = ["A private calibration text about Ms. Quillfeather."] * 3
    request = OptimizeRequest.from_config(
        build_config("openvino", "int8", calibration_texts=texts), threads=None
    )
    assert request.calibration_texts == texts  # the load hooks calibrate new weights with them
    assert request.to_config(cache_dir=None).calibration_texts == tuple(texts)
    assert request.saved()["calibration_texts"] is None
    assert (
        request.saved()["calibration_sha256"]
        == request.to_config(cache_dir=None).calibration_sha256
    )
    assert b"Quillfeather" not in pickle.dumps(request)
    assert pickle.loads(pickle.dumps(request)).calibration_sha256 == request.calibration_sha256


def test_a_stricter_gate_never_wipes_an_entry_that_others_use(roberta: Language, cache_dir: Path):
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir)
    before = [(entry.key, entry.created) for entry in spacy_accelerate.list_cached(cache_dir)]
    with pytest.raises(spacy_accelerate.ConversionError, match="tolerance 1e-12"):
        spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir, tolerance=1e-12)
    after = [(entry.key, entry.created) for entry in spacy_accelerate.list_cached(cache_dir)]
    assert after == before  # the failed rebuild replaced nothing
    assert spacy_accelerate.is_optimized(roberta)  # and the previous acceleration serves on


def test_a_cache_folder_that_is_a_link_is_cleared(roberta: Language, tmp_path: Path):
    real = tmp_path / "real-cache"
    real.mkdir()
    os.symlink(real, tmp_path / "cache-link")
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=tmp_path / "cache-link")
    assert len(spacy_accelerate.list_cached(tmp_path / "cache-link")) == 1
    assert spacy_accelerate.clear_cache(tmp_path / "cache-link") == 1
    assert spacy_accelerate.list_cached(real) == []


def test_a_recorded_folder_is_usable_only_if_it_can_really_be_written(tmp_path: Path):
    from spacy_accelerate.cache.location import usable

    assert usable(tmp_path / "new" / "cache")  # can be made
    assert not usable(Path("/proc/no-such/cache"))  # root's permission bits say yes
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert not usable(blocker / "cache") and not usable(blocker)
    assert not list(tmp_path.glob("**/.spacy-accelerate-probe-*"))  # the probe cleans up
