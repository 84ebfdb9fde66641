"""``provider="openvino"``: the OpenVINO runtime on the CPU: fp32, bf16 and calibrated int8."""

from __future__ import annotations

import hashlib
import logging
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import spacy
from annotations import EDGE_TEXTS, disagreements, max_abs_diff, run, run_each, same_result
from cpus import AMX_XEON, AVX2_EPYC, AVX512_EPYC, SIMULATED

import spacy_accelerate
from spacy_accelerate import cpu_features as cpu_features_module
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.backends.openvino import backend as openvino_backend
from spacy_accelerate.backends.openvino import quantize as openvino_quantize
from spacy_accelerate.backends.openvino import session as openvino_runtime
from spacy_accelerate.backends.openvino.session import IR_FILE, IR_WEIGHTS, OpenVINORunner
from spacy_accelerate.bench.doc_outputs import token_cosines
from spacy_accelerate.bench.side_by_side import agreement
from spacy_accelerate.cache.store import OWNER_MARK
from spacy_accelerate.cpu_features import CpuFeatures, cpu_features, simulated
from spacy_accelerate.errors import (
    AccuracyError,
    InvalidOptionError,
    NoFasterPlanError,
    PrecisionUnavailableError,
    ProviderUnavailableError,
)
from spacy_accelerate.options.config import Precision, Provider, texts_digest
from spacy_accelerate.planning.recording import builtin_texts
from spacy_accelerate.provision import exports as shared_export
from spacy_accelerate.provision import get_or_export as exported
from spacy_accelerate.provision.bundle import BUNDLE_DIR
from spacy_accelerate.verify import speed
from spacy_accelerate.verify.plan_search import SEARCH_RULE, Built, Int8Search, Judged
from spacy_accelerate.verify.verification import Verification

TEXTS = 32


@pytest.fixture(scope="module")
def texts(ewt_texts: list[str]) -> list[str]:
    return ewt_texts[:TEXTS]


@pytest.mark.parametrize("sample", ["roberta", "minilm", "st-bert"])
def test_fp32_matches_pytorch(
    sample: str, sample_path: Callable[[str], Path], texts: list[str], cache_dir: Path
):
    nlp = spacy.load(sample_path(sample))
    expected = run(nlp, texts, batch_size=8)
    spacy_accelerate.optimize(nlp, "openvino", "fp32", cache_dir=cache_dir)
    proxy = next(iter(spacy_accelerate.accelerated_components(nlp).values()))
    assert isinstance(proxy.session.runner, OpenVINORunner)
    assert proxy.exported.parity.worst <= 1e-4
    # The entry serves OpenVINO's IR, not the ONNX file it was converted from.
    files = {path.name for path in proxy.exported.path.iterdir()}
    assert {IR_FILE, IR_WEIGHTS} <= files and "model.onnx" not in files
    actual = run(nlp, texts, batch_size=8)
    assert max_abs_diff(expected, actual) <= 1e-4
    assert disagreements(expected, actual, nlp) == []


def test_texts_at_the_edges_give_what_pytorch_gives(
    sample_path: Callable[[str], Path], cache_dir: Path
):
    # Empty, whitespace only (PyTorch's own listener fails on it: so must this), one
    # emoji, and a text far longer than a span window.
    nlp = spacy.load(sample_path("roberta"))
    expected = run_each(nlp, EDGE_TEXTS)
    spacy_accelerate.optimize(nlp, "openvino", "fp32", cache_dir=cache_dir)
    actual = run_each(nlp, EDGE_TEXTS)
    for text, want, got in zip(EDGE_TEXTS, expected, actual, strict=True):
        assert same_result(want, got), (text[:20], want, got)
    assert isinstance(expected[1], Exception) and not isinstance(expected[3], Exception)


@pytest.mark.slow
def test_bf16_keeps_token_cosine(
    sample_path: Callable[[str], Path], texts: list[str], cache_dir: Path
):
    nlp = spacy.load(sample_path("minilm"))
    if not cpu_features().bf16:  # what this CPU's detection says it must do instead
        with pytest.raises(PrecisionUnavailableError, match="AVX512_BF16 or AMX-BF16"):
            spacy_accelerate.optimize(nlp, "openvino", "bf16", cache_dir=cache_dir)
        return
    expected = run(nlp, texts, batch_size=8)
    # The sample's random heads flip tags at the smallest change: its bounds are lowered
    # (bf16 is still held to PyTorch's own bf16 autocast, within 0.05 point).
    spacy_accelerate.optimize(nlp, "openvino", "bf16", cache_dir=cache_dir, min_agreement=0.95)
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    assert proxy.exported.parity.gate.min_cosine == 0.999
    # judged in the pipeline, like every lossy plan
    assert proxy.exported.record.agreement is not None
    actual = run(nlp, texts, batch_size=8)
    pairs = zip(expected, actual, strict=True)
    cosines = np.concatenate([token_cosines(e, a) for e, a in pairs])
    assert cosines.min() >= 0.999
    assert max_abs_diff(expected, actual) > 1e-4  # bf16 really ran
    assert agreement(expected, actual).rate("ent") >= 0.99


def test_bf16_is_refused_on_a_cpu_without_bf16(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    nlp = spacy.load(sample_path("roberta"))
    with simulated(AVX2_EPYC), pytest.raises(PrecisionUnavailableError, match="AMX-BF16"):
        spacy_accelerate.optimize(nlp, "openvino", "bf16", cache_dir=cache_dir)
    assert not spacy_accelerate.is_optimized(nlp)


@pytest.mark.parametrize("provider", ["openvino", "auto"])
def test_bf16_falls_back_to_fp32_on_a_cpu_without_bf16_when_asked(
    sample_path: Callable[[str], Path],
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    provider: str,
):
    # A pipeline saved with fallback=True must load on a CPU without bf16, not fail there.
    monkeypatch.setattr(cpu_features_module, "_simulated", [AVX2_EPYC])
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, provider, "bf16", cache_dir=cache_dir, fallback=True)
    session = spacy_accelerate.accelerated_components(nlp)["transformer"].session
    assert (session.provider.provider, session.config.precision) == (Provider.CPU, Precision.FP32)
    assert "falling back to provider='cpu', precision='fp32'" in caplog.text
    nlp.to_disk(tmp_path / "saved")
    loaded = spacy_accelerate.accelerated_components(spacy.load(tmp_path / "saved"))
    assert loaded["transformer"].session.provider.provider is Provider.CPU


def test_the_builds_of_one_call_share_one_export_and_convert_it_once(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    # fp32 and int8 (no bf16 on this simulated CPU) built from one export, converted to
    # OpenVINO's model once; no build writes the shared export.
    exported_files: list[tuple[Path, str]] = []
    export = shared_export.export_onnx

    def recorded_export(model, spec, path, *, opset):
        export(model, spec, path, opset=opset)
        exported_files.append((path, hashlib.sha256(path.read_bytes()).hexdigest()))

    monkeypatch.setattr(shared_export, "export_onnx", recorded_export)
    ov = openvino_runtime.import_openvino()
    converted: list[str] = []
    convert = ov.convert_model
    monkeypatch.setattr(ov, "convert_model", lambda path: converted.append(path) or convert(path))
    unchanged: list[bool] = []
    close = shared_export.SharedExport.close

    def checked_close(self: shared_export.SharedExport) -> None:
        for path, digest in exported_files:
            unchanged.append(hashlib.sha256(path.read_bytes()).hexdigest() == digest)
        close(self)

    monkeypatch.setattr(shared_export.SharedExport, "close", checked_close)
    quantizers: list[object] = []
    start = openvino_quantize.OpenVINOQuantizer.__init__

    def recorded_quantizer(self, *args, **kwargs):
        quantizers.append(self)
        start(self, *args, **kwargs)

    monkeypatch.setattr(openvino_quantize.OpenVINOQuantizer, "__init__", recorded_quantizer)
    nlp = spacy.load(sample_path("roberta"))
    with simulated(AVX512_EPYC.without_bf16()):
        spacy_accelerate.optimize(nlp, "openvino", "auto", cache_dir=cache_dir, min_agreement=0.5)
    assert spacy_accelerate.is_optimized(nlp) and len(quantizers) == 1  # fp32 and int8 built
    assert len(exported_files) == 1 and len(converted) == 1
    assert unchanged == [True]
    assert not exported_files[0][0].exists()  # the scratch folder goes with the call


def _tiny_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    weight = helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_the_ir_is_written_once_per_call_and_linked_into_later_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # fp32 and bf16 serve the same IR: the second build links the first one's files
    # instead of writing them again (seconds on a base model).
    graph = tmp_path / "export" / "model.onnx"
    graph.parent.mkdir()
    _tiny_onnx(graph)
    ov = openvino_runtime.import_openvino()
    saved: list[str] = []
    save = ov.save_model
    monkeypatch.setattr(ov, "save_model", lambda *a, **k: saved.append(a[1]) or save(*a, **k))
    export = shared_export.Export(graph)
    fp32, bf16, other = (tmp_path / name for name in ("fp32", "bf16", "other"))
    for folder in (fp32, bf16, other):
        folder.mkdir()
        (folder / OWNER_MARK).write_text("entry")  # a file of the entry's own, not linked
    assert openvino_runtime.convert_to_ir(export, fp32) == fp32 / IR_FILE
    openvino_runtime.convert_to_ir(export, bf16)
    assert saved == [str(fp32 / IR_FILE)]
    ir = [IR_FILE, IR_WEIGHTS]
    assert sorted(path.name for path in bf16.iterdir()) == sorted([OWNER_MARK, *ir])
    assert all((bf16 / name).samefile(fp32 / name) for name in ir)
    weights = (fp32 / IR_WEIGHTS).read_bytes()
    for path in fp32.iterdir():  # evicting the first entry leaves the second whole
        path.unlink()
    assert (bf16 / IR_WEIGHTS).read_bytes() == weights
    # Where no link can be made (the cache on another filesystem), each build writes its
    # own files.
    linked: list[Path] = []

    def no_link(source: Path, target: Path) -> None:
        linked.append(target)
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(shared_export.os, "link", no_link)
    openvino_runtime.convert_to_ir(export, other)
    assert linked and saved[-1] == str(other / IR_FILE)
    assert (other / IR_WEIGHTS).read_bytes() == weights and not (other / IR_FILE).is_symlink()
    apart = shared_export.Export(graph)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        openvino_runtime.convert_to_ir(apart, tmp_path / name)
    assert saved[-2:] == [str(tmp_path / "a" / IR_FILE), str(tmp_path / "b" / IR_FILE)]
    export.close()
    assert not graph.parent.exists()


def test_a_warm_start_loads_the_ir_from_the_cache(
    sample_path: Callable[[str], Path], texts: list[str], cache_dir: Path, monkeypatch
):
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "openvino", "fp32", cache_dir=cache_dir)
    first = spacy_accelerate.accelerated_components(nlp)["transformer"].exported
    assert not first.cache_hit
    blobs = sorted((cache_dir / "openvino").rglob("*"))
    assert any(path.suffix == ".blob" for path in blobs)  # OpenVINO's compiled model
    written = {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in blobs}

    def no_export(*args, **kwargs):
        raise AssertionError("a warm start must not export")

    monkeypatch.setattr(shared_export, "export_onnx", no_export)
    again = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(again, "openvino", "fp32", cache_dir=cache_dir)
    second = spacy_accelerate.accelerated_components(again)["transformer"].exported
    assert second.cache_hit and second.key == first.key
    # Blobs are keyed by the model's content, not its path: the one compiled while the
    # entry was built (in a temporary folder) served the warm start, and no other was made.
    assert sorted((cache_dir / "openvino").rglob("*")) == blobs
    blob_files = [path for path in blobs if path.suffix == ".blob"]
    assert all(written[p] == (p.stat().st_ino, p.stat().st_mtime_ns) for p in blob_files)
    assert disagreements(run(nlp, texts, 8), run(again, texts, 8), again) == []
    # Every key's blob folder goes; a file the library cannot show it made stays.
    stray = blob_files[0].parent.parent / "1234.blob"
    stray.write_bytes(b"not provably ours")
    assert spacy_accelerate.clear_cache(cache_dir) >= 1
    assert [p for p in (cache_dir / "openvino").rglob("*") if p.is_file()] == [stray]


def test_a_damaged_compiled_blob_is_compiled_again_not_served(
    sample_path: Callable[[str], Path],
    texts: list[str],
    cache_dir: Path,
    caplog: pytest.LogCaptureFixture,
):
    # OpenVINO imports a blob without checking it: bytes changed in its weights gave a
    # pipeline that annotated a third of the tokens differently, with verify=False.
    nlp = spacy.load(sample_path("roberta"))
    expected = run(nlp, texts, 8)
    spacy_accelerate.optimize(nlp, "openvino", "fp32", cache_dir=cache_dir)
    key = spacy_accelerate.accelerated_components(nlp)["transformer"].exported.key
    (blob,) = (cache_dir / "openvino").rglob("*.blob")
    assert blob.parent.name == key and (blob.parent / "blobs.json").is_file()
    data = bytearray(blob.read_bytes())
    middle = len(data) * 6 // 10
    data[middle : middle + 4096] = bytes((byte + 77) % 256 for byte in data[middle : middle + 4096])
    blob.write_bytes(bytes(data))
    again = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(again, "openvino", "fp32", cache_dir=cache_dir, verify=False)
    assert disagreements(expected, run(again, texts, 8), again) == []
    assert "did not match their record" in caplog.text
    assert blob.read_bytes() != bytes(data)  # written again by the new compile
    assert spacy_accelerate.cache.store.ModelCache(cache_dir).evict(key)
    assert not blob.parent.exists()  # the entry's blobs go with it


def test_blobs_that_cannot_be_checked_are_not_read(
    sample_path: Callable[[str], Path],
    texts: list[str],
    cache_dir: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
):
    # A read-only cache serves its entries without a lock, but a blob is only read after
    # it was checked under its folder's lock: without the lock, OpenVINO compiles.
    nlp = spacy.load(sample_path("roberta"))
    expected = run(nlp, texts, 8)
    spacy_accelerate.optimize(nlp, "openvino", "fp32", cache_dir=cache_dir)

    def unwritable(self: Any, folder: Path) -> Any:
        raise spacy_accelerate.CacheError(f"the cache folder {self.root} is read-only")

    compiled_with: list[Path | None] = []
    real_session = openvino_backend.OpenVINOSession

    def session(*args: Any, cache_dir: Path | None = None) -> Any:
        compiled_with.append(cache_dir)
        return real_session(*args, cache_dir=cache_dir)

    monkeypatch.setattr(spacy_accelerate.cache.store.ModelCache, "derived_lock", unwritable)
    monkeypatch.setattr(openvino_backend, "OpenVINOSession", session)
    again = spacy.load(sample_path("roberta"))
    # overlap=False: no thread split, whose second session would compile again.
    spacy_accelerate.optimize(again, "openvino", "fp32", cache_dir=cache_dir, overlap=False)
    assert spacy_accelerate.accelerated_components(again)["transformer"].exported.cache_hit
    assert "compiled blobs are not used: the cache folder" in caplog.text
    assert compiled_with == [None]  # compiled without OpenVINO's blob cache
    assert disagreements(expected, run(again, texts, 8), again) == []


def test_the_key_depends_on_openvino_and_the_cpu(monkeypatch: pytest.MonkeyPatch):
    key = openvino_runtime.openvino_key(Precision.FP32)
    assert key["openvino"] and key["cpu"] and "FP32" in key["cpu"]
    import nncf  # read from its metadata, not imported: the same version, so the same keys

    assert key["nncf"] == nncf.__version__
    config = spacy_accelerate.options.request.build_config("openvino", "fp32")
    spec, checks = _TINY_SPEC, Verification(window=16)
    assert exported._export_options(config, spec, checks)["openvino"] == key
    assert "int8_float_layers" not in key  # fp32 entries are unaffected by int8's hint
    assert "int8_plans" not in key  # and by int8's plans
    # An int8 entry chosen among other plans (here: dynamic int8 in other groups, on a CPU
    # that offers it) is not reused.
    with simulated(AMX_XEON):
        plans = openvino_runtime.openvino_key(Precision.INT8)["int8_plans"]
        monkeypatch.setattr(openvino_runtime, "DYNAMIC_INT8_GROUP_SIZE", 64)
        assert openvino_runtime.openvino_key(Precision.INT8)["int8_plans"] != plans
    # The CPU's int8 and bf16 instruction sets are part of the key (a decision made on
    # one CPU, speed included, is not another's).
    with simulated(AVX2_EPYC):
        avx2 = openvino_runtime.openvino_key(Precision.INT8)
    with simulated(AVX512_EPYC):
        assert openvino_runtime.openvino_key(Precision.INT8)["cpu_kernels"] != avx2["cpu_kernels"]
    cpu = spacy_accelerate.options.request.build_config("cpu", "fp32")
    assert "openvino" not in exported._export_options(cpu, spec, checks)


_TINY_SPEC = EncoderSpec(
    family="bert",
    vocab_size=100,
    hidden_width=8,
    num_attention_heads=2,
    intermediate_width=16,
    num_hidden_layers=1,
    hidden_act="gelu",
    layer_norm_eps=1e-12,
    max_position_embeddings=64,
    type_vocab_size=2,
    padding_idx=0,
    model_max_length=64,
)


def test_int8_float_layers_run_in_bf16_only_where_the_cpu_has_it(
    monkeypatch: pytest.MonkeyPatch,
):
    with simulated(AMX_XEON):
        assert openvino_runtime.precision_hint(Precision.INT8) == "bf16"
        assert openvino_runtime.precision_hint(Precision.BF16) == "bf16"
        in_bf16 = openvino_runtime.openvino_key(Precision.INT8)
        assert in_bf16["int8_float_layers"] == "bf16"
    with simulated(AVX2_EPYC):
        assert openvino_runtime.precision_hint(Precision.INT8) == "f32"
        assert openvino_runtime.precision_hint(Precision.FP32) == "f32"
        # A plan judged with its float layers in fp32 is another entry than one in bf16.
        assert openvino_runtime.openvino_key(Precision.INT8)["int8_float_layers"] == "f32"


@pytest.mark.parametrize(
    ("cpu", "dynamic"),
    [(AMX_XEON, ["f32"]), (AVX512_EPYC, ["f32"]), (AVX2_EPYC, [])],
    ids=["amx-xeon", "avx512-epyc", "avx2-epyc"],
)
def test_dynamic_int8_is_tried_only_where_activations_are_quantized_at_run_time(
    cpu: CpuFeatures, dynamic: list[str]
):
    # Dynamic int8 takes f32 input (under bf16 the CPU plugin decompresses the int8
    # weights to bf16 and quantizes nothing) and VNNI; without them it is not a plan.
    group = openvino_runtime.DYNAMIC_INT8_GROUP_SIZE
    with simulated(cpu):
        assert list(openvino_runtime.dynamic_int8_hints(group)) == dynamic
        # The key names each plan tried, and what speed it must beat: an entry chosen by
        # another search is not reused.
        plans = openvino_runtime.openvino_key(Precision.INT8)["int8_plans"]
        listed = [f"dynamic int8, groups of {group}, {hint}" for hint in dynamic]
        baseline = "bf16" if cpu.bf16 else "fp32"
        assert [plan for plan in plans if plan.startswith("dynamic int8")] == listed
        assert plans[-2:] == [f"faster than {baseline}", SEARCH_RULE]


def test_openvino_missing_names_the_extra(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a)
    )
    nlp = spacy.load(sample_path("roberta"))
    with pytest.raises(ProviderUnavailableError, match=r"spacy-accelerate\[openvino\]"):
        spacy_accelerate.optimize(nlp, "openvino", "fp32", cache_dir=cache_dir)


def test_int8_that_changes_the_pipelines_annotations_is_refused(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    # The tiny sample's untrained heads flip tags on small changes: the hidden states pass
    # the cosine gate, and an agreement bound of 99.9% refuses every plan of the ladder
    # (the default 99.5% sits right at what its int8 reaches: 99.4-99.6%).
    nlp = spacy.load(sample_path("roberta"))
    with pytest.raises(AccuracyError, match="agree with PyTorch's on") as caught:
        spacy_accelerate.optimize(nlp, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.999)
    message = str(caught.value)
    # Every kind of plan this CPU offers was tried: static int8, dynamic int8 (only where
    # activations are quantized at run time), then the worse of the two layers in float
    # (where the CPU has bf16, in bf16 first and then in fp32).
    assert "all layers int8" in message
    dynamic = openvino_runtime.dynamic_int8_hints(32)
    for hint in dynamic:
        assert openvino_quantize.DynamicInt8(32, hint).label in message
    assert ("dynamic int8" in message) is bool(dynamic)
    assert re.search(r"layers [12] float \(fp32\)", message)
    assert "min_agreement" in message  # says what to change
    assert not spacy_accelerate.is_optimized(nlp)
    # The decision is what the entry keeps (no model): a warm start reads it, in seconds.
    (entry,) = spacy_accelerate.cache.store.ModelCache(cache_dir).entries()
    assert set(entry.manifest["files"]) == {OWNER_MARK, "refusal.json"}
    import nncf

    monkeypatch.setattr(nncf, "quantize", _no_quantization)
    with pytest.raises(AccuracyError, match="Decided when this model was first tried"):
        spacy_accelerate.optimize(nlp, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.999)


def _no_quantization(*args: object, **kwargs: object) -> None:
    raise AssertionError("a warm start must not quantize")


@pytest.mark.slow
def test_int8_within_a_looser_agreement_is_served_and_its_plan_recorded(
    sample_path: Callable[[str], Path],
    texts: list[str],
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    nlp = spacy.load(sample_path("roberta"))
    expected = run(nlp, texts, batch_size=8)
    spacy_accelerate.optimize(nlp, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.95)
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    parity = proxy.exported.parity
    assert parity.gate.min_mean_cosine == 0.995 and parity.gate.min_cosine == 0.95
    assert parity.worst_mean_cosine >= 0.995 and parity.read_pieces > 1000
    entry = spacy_accelerate.cache.store.ModelCache(cache_dir).lookup(proxy.exported.key)
    plan = proxy.exported.record.plan
    assert entry.manifest["built"]["plan"] == plan
    assert re.fullmatch(
        r"all layers int8|dynamic int8 \(.+\)|layers [\d, ]+ float \((bf16|fp32)\)", plan
    )
    # What is not int8 runs in the hint the plan was judged with: bf16 where the CPU has it,
    # unless the plan says fp32 (accuracy control's fallback).
    hint = proxy.session.compiled.get_property("INFERENCE_PRECISION_HINT")
    first = openvino_runtime.precision_hint(Precision.INT8)
    assert hint.to_string() == ("f32" if plan.endswith("fp32)") else first)
    assert len(entry.manifest["key_inputs"]["export"]["calibration_sha256"]) == 64
    assert set(entry.manifest["files"]) == {
        IR_FILE,
        IR_WEIGHTS,
        "parity.json",
        "spot_check.npz",
        OWNER_MARK,
    }
    actual = run(nlp, texts, batch_size=8)
    assert agreement(expected, actual).rate("tag") >= 0.9  # held-out texts, tiny random heads
    assert max_abs_diff(expected, actual) > 1e-3  # int8 really ran

    # A warm start serves the stored IR without quantizing again, and judges it again.
    import nncf

    def no_quantization(*args, **kwargs):
        raise AssertionError("a warm start must not quantize")

    monkeypatch.setattr(nncf, "quantize", no_quantization)
    again = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(again, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.95)
    warm = spacy_accelerate.accelerated_components(again)["transformer"].exported
    assert warm.cache_hit and warm.key == proxy.exported.key
    assert warm.record == proxy.exported.record and warm.record.plan == plan
    # Not verified again, the hit still says which plan it serves.
    unverified = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(
        unverified, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.95, verify=False
    )
    trusted = spacy_accelerate.accelerated_components(unverified)["transformer"].exported
    assert trusted.cache_hit and trusted.parity is None and trusted.record.plan == plan
    assert disagreements(actual, run(again, texts, 8), again) == []
    # The warm start's spot check runs the stored calibration items: a runtime that
    # computes differently from the one the model was proven with is caught there, and
    # the entry is built again (here, under the same drift, every plan is refused).
    monkeypatch.undo()
    real_run = OpenVINORunner.run_arrays

    def drifting(self, feeds, names):
        noise = np.random.default_rng(0)
        return [a + noise.normal(0, a.std() * 0.5, a.shape) for a in real_run(self, feeds, names)]

    monkeypatch.setattr(OpenVINORunner, "run_arrays", drifting)
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        with pytest.raises(AccuracyError, match="No int8 plan"):
            spacy_accelerate.optimize(
                spacy.load(sample_path("roberta")),
                "openvino",
                "int8",
                cache_dir=cache_dir,
                min_agreement=0.95,
            )
    assert "mean token cosine over the pieces spaCy reads" in caplog.text
    assert "is rebuilt" in caplog.text
    # The bounds a plan was chosen under are part of the key: a stricter agreement is
    # another entry, built and refused here, never the looser model served.
    monkeypatch.undo()
    with pytest.raises(AccuracyError, match="agree with PyTorch's on"):
        spacy_accelerate.optimize(
            again, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.999
        )


def _refusing(refuse: Callable[[Built], bool]) -> Callable[[Int8Search, Built], Judged]:
    """``Int8Search.judged`` that refuses the plans ``refuse`` picks, as the gate would,
    and judges the others for real."""
    real = Int8Search.judged

    def judged(search: Int8Search, built: Built) -> Judged:
        if refuse(built):
            search.note(f"{built.label}: refused by the test")
            return Judged(built, "refused by the test", built.report)
        return real(search, built)

    return judged


def test_int8_float_layers_fall_back_to_fp32_when_no_bf16_plan_passes(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    # On a CPU with bf16 units (simulated: the plan search is what is tested; the numbers
    # are this CPU's own), float layers are tried in bf16 first, then in fp32.
    monkeypatch.setattr(cpu_features_module, "_simulated", [AMX_XEON])
    hints: list[str] = []

    def bf16_fails(built: Built) -> bool:  # as if bf16's own error failed the gate
        hint = built.session.settings["INFERENCE_PRECISION_HINT"]  # as requested for the plan
        hints.append(hint)
        return len(hints) <= 3 or hint == "bf16"  # the whole plans, then every bf16 plan

    monkeypatch.setattr(Int8Search, "judged", _refusing(bf16_fails))
    import openvino as ov

    written: list[str] = []
    real_save = ov.save_model

    def save_model(model: Any, path: str, **kwargs: Any) -> None:
        written.append(Path(path).name)
        real_save(model, path, **kwargs)

    monkeypatch.setattr(ov, "save_model", save_model)
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.95)
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    # Five plans compiled from memory, and only the served one written, as the entry's IR.
    assert written == [IR_FILE]
    # Two layers: static int8 (float part bf16), its feed-forward outputs in float (bf16),
    # dynamic int8 (f32 only: bf16 input is not quantized), the one bf16 plan, the one
    # fp32 plan.
    assert hints == ["bf16", "bf16", "f32", "bf16", "f32"]
    assert re.fullmatch(r"layers [12] float \(fp32\)", proxy.exported.record.plan)
    assert proxy.session.settings["INFERENCE_PRECISION_HINT"] == "f32"
    # The IR carries the precision it was judged in: a warm start compiles it the same way.
    monkeypatch.undo()
    monkeypatch.setattr(cpu_features_module, "_simulated", [AMX_XEON])
    again = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(again, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.95)
    warm = spacy_accelerate.accelerated_components(again)["transformer"]
    assert warm.exported.cache_hit and warm.exported.record.plan == proxy.exported.record.plan
    assert warm.session.settings["INFERENCE_PRECISION_HINT"] == "f32"


@pytest.mark.parametrize("cpu", ["this-cpu", "amx-xeon", "avx2-epyc"])
def test_dynamic_int8_is_served_only_where_it_quantizes_and_compiled_as_judged(
    sample_path: Callable[[str], Path],
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    cpu: str,
):
    real = cpu_features()
    if cpu != "this-cpu":
        monkeypatch.setattr(cpu_features_module, "_simulated", [SIMULATED[cpu]])
    offered = openvino_runtime.dynamic_int8_hints(32)
    judged: list[str] = []

    def static_fails(built: Built) -> bool:  # the whole static plans
        judged.append(_plan_settings(built.session))
        plan = built.plan
        whole = isinstance(plan, openvino_quantize.FloatLayers) and not plan.layers
        return whole or isinstance(plan, openvino_quantize.FloatFeedForwardOutputs)

    monkeypatch.setattr(Int8Search, "judged", _refusing(static_fails))
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.95)
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    first = openvino_quantize.FloatFeedForwardOutputs(openvino_runtime.float_part_hints()[0])
    refused = ["all layers int8: refused by the test", f"{first.label}: refused by the test"]
    if not offered:  # no VNNI: dynamic int8 would be int8 weights with float arithmetic
        assert "dynamic" not in proxy.exported.record.plan
        assert re.fullmatch(r"layers [12] float \((bf16|fp32)\)", proxy.exported.record.plan)
        assert not any("dynamic" in reason for reason in proxy.exported.record.refused)
        return
    label = "dynamic int8 (activations per token, groups of 32; the rest fp32)"
    assert proxy.exported.record.plan == label
    assert "activations quantized at run time" in proxy.exported.record.compiled_as
    # The static plans first, then dynamic int8 with f32 input: the only way it quantizes.
    assert judged[-1] == "f32, groups of 32" and len(judged) == 3
    # Why the faster plan was not served is on record, in the manifest too.
    assert proxy.exported.record.refused == tuple(refused)
    entry = spacy_accelerate.cache.store.ModelCache(cache_dir).lookup(proxy.exported.key)
    assert entry.manifest["built"]["refused"] == refused
    assert entry.manifest["built"]["compiled_as"] == proxy.exported.record.compiled_as
    assert _plan_settings(proxy.session) == "f32, groups of 32"
    # Every MatMul with a weight reads it in int8 (NNCF's weight compression); no activation
    # is quantized in the IR: OpenVINO quantizes them at run time.
    import openvino as ov

    served = ov.Core().read_model(str(proxy.exported.path / IR_FILE))
    weighted = [
        op
        for op in served.get_ops()
        if op.get_type_name() == "MatMul" and not _reads_activation(op.input_value(1))
    ]
    assert len(weighted) == 12  # six per layer, two layers
    assert all(_stored_in_int8(op.input_value(1)) for op in weighted)
    assert "FakeQuantize" not in {op.get_type_name() for op in served.get_ops()}
    # Where this machine really quantizes at run time, the same IR without it (weights
    # int8 only) computes other hidden states.
    if openvino_runtime.dynamic_quantization_runs("f32", 32, real):
        ids = np.arange(5, 37, dtype=np.int64).reshape(2, 16)
        feeds = EncoderInputs.from_ids(ids, proxy.spec.padding_idx)
        batch = feeds.feeds(proxy.session.input_names)
        weight_only = ov.Core().compile_model(
            served, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
        )
        last = proxy.spec.hidden_state_names[-1]
        plain = weight_only.create_infer_request().infer(batch)[weight_only.output(last)]
        dynamic = proxy.session.runner.run_whole(batch, [last])[0]
        assert np.abs(plain - dynamic).max() > 1e-4
    # A warm start compiles the stored plan with the settings its IR records.
    monkeypatch.setattr(Int8Search, "judged", _refusing(lambda built: False))
    again = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(again, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.95)
    warm = spacy_accelerate.accelerated_components(again)["transformer"]
    assert warm.exported.cache_hit and warm.exported.record.plan == proxy.exported.record.plan
    assert warm.exported.record == proxy.exported.record
    assert _plan_settings(warm.session) == "f32, groups of 32"


@pytest.mark.parametrize(
    ("widths", "group"),
    [((768, 3072), 128), ((384, 1536), 128), ((48, 100), 32), ((40,), 32), ((8,), 8)],
)
def test_dynamic_int8_groups_fit_the_narrowest_weighted_matmul(widths: tuple[int, ...], group: int):
    import openvino as ov

    opset = ov.opset13
    tokens = opset.parameter(ov.PartialShape([-1, -1, widths[0]]), ov.Type.f32)
    hidden = tokens.output(0)
    for width, out in zip(widths, (*widths[1:], widths[0]), strict=True):
        weight = opset.constant(np.zeros((width, out), dtype=np.float32))
        hidden = opset.matmul(hidden, weight, False, False).output(0)
    scores = opset.matmul(hidden, hidden, False, True)  # no weight: its width does not count
    model = ov.Model([scores], [tokens])
    assert openvino_quantize.dynamic_group_size(model) == group


def _reads_activation(value: Any) -> bool:
    """Whether ``value`` depends on a model input (else it is a constant weight)."""
    stack, seen = [value.get_node()], set()
    while stack:
        node = stack.pop()
        if node.get_type_name() == "Parameter":
            return True
        if node.get_friendly_name() not in seen:
            seen.add(node.get_friendly_name())
            stack.extend(source.get_node() for source in node.input_values())
    return False


def _stored_in_int8(value: Any) -> bool:
    """Whether the weight ``value`` is decompressed from an int8 constant."""
    node = value.get_node()
    if node.get_type_name() == "Constant":
        return node.get_output_element_type(0).to_string() in {"u8", "i8"}
    return any(_stored_in_int8(source) for source in node.input_values())


def _plan_settings(session: Any) -> str:
    """The hint and group a plan was compiled with, as requested from its IR's record."""
    settings = session.settings
    group = settings.get("DYNAMIC_QUANTIZATION_GROUP_SIZE", "none")
    return f"{settings['INFERENCE_PRECISION_HINT']}, groups of {group}"


@pytest.mark.slow
def test_calibration_texts_are_part_of_the_key_and_only_their_digest_is_saved(
    sample_path: Callable[[str], Path], texts: list[str], cache_dir: Path, tmp_path: Path
):
    nlp = spacy.load(sample_path("roberta"))
    secret = "Ms. Quillfeather's account number is 4929-1234-5678."
    private = [*texts, secret]
    options = {"cache_dir": cache_dir, "min_agreement": 0.5, "min_cosine": 0.9}
    spacy_accelerate.optimize(nlp, "openvino", "int8", calibration_texts=private, **options)
    mine = spacy_accelerate.accelerated_components(nlp)["transformer"].exported
    # Only the texts' sha256 and count go to disk, and they find the same entry.
    nlp.to_disk(tmp_path / "saved")
    config_text = (tmp_path / "saved" / "config.cfg").read_text()
    assert "Quillfeather" not in config_text and texts[0] not in config_text
    assert texts_digest(private) in config_text
    assert f"calibration_count = {len(private)}" in config_text
    # No file holds the texts. (spaCy's own vocabulary keeps the words of every text a
    # pipeline ran on, these too, but not the texts.)
    for path in (tmp_path / "saved").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    saved = spacy.load(tmp_path / "saved")
    reloaded = spacy_accelerate.accelerated_components(saved)["transformer"].exported
    assert reloaded.key == mine.key and reloaded.origin is exported.Origin.BUNDLED
    # A pickle carries no texts either.
    assert secret.encode() not in pickle.dumps(nlp)
    spacy_accelerate.optimize(nlp, "openvino", "int8", **options)
    builtin = spacy_accelerate.accelerated_components(nlp)["transformer"].exported
    assert mine.key != builtin.key and not builtin.cache_hit
    digests = {
        entry.manifest["key_inputs"]["export"]["calibration_sha256"]
        for entry in spacy_accelerate.cache.store.ModelCache(cache_dir).entries()
    }
    assert digests == {
        texts_digest(private),
        texts_digest(builtin_texts()),
    }
    # Where the entry is gone, the bundle saved with the pipeline still serves it ...
    spacy_accelerate.clear_cache(cache_dir)
    bundled = spacy_accelerate.accelerated_components(spacy.load(tmp_path / "saved"))
    assert bundled["transformer"].exported.key == mine.key
    # ... and without the bundle the texts cannot be had again: the error says how to
    # give them, and the pipeline is left plain (not half accelerated).
    shutil.rmtree(tmp_path / "saved" / BUNDLE_DIR)
    with pytest.raises(InvalidOptionError, match="calibration_texts"):
        spacy.load(tmp_path / "saved")


def test_calibration_texts_are_validated():
    with pytest.raises(InvalidOptionError, match="calibration_texts must be"):
        spacy_accelerate.options.request.build_config(
            "openvino", "int8", calibration_texts="one text"
        )
    assert (
        spacy_accelerate.options.request.build_config("openvino", "int8").gate().min_mean_cosine
        == 0.995
    )


def test_too_few_calibration_tokens_are_refused_before_any_work(
    sample_path: Callable[[str], Path], cache_dir: Path
):
    # One piece of calibration passed the gate and changed a fifth of real tags.
    nlp = spacy.load(sample_path("roberta"))
    for few in (["a"], ["\u200b"], ["A short sentence."] * 20):
        with pytest.raises(InvalidOptionError, match=r"calibration_texts hold \d+ tokens"):
            spacy_accelerate.optimize(
                nlp, "openvino", "int8", calibration_texts=few, cache_dir=cache_dir
            )
    assert not spacy_accelerate.is_optimized(nlp)
    assert not cache_dir.exists() or not any(cache_dir.iterdir())


@pytest.mark.slow
def test_a_plan_judged_with_a_component_disabled_does_not_serve_the_whole_pipeline(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    # The gate judges what runs: with the tagger disabled it never sees tags, so that
    # entry must not be a hit for the pipeline with the tagger enabled (its tags were
    # 99.51% when served that way, below a 99.55% bound). A disabled component is never
    # run: it may be disabled because it cannot run.
    nlp = spacy.load(sample_path("roberta"))
    nlp.disable_pipe("tagger")
    options = {"cache_dir": cache_dir, "min_agreement": 0.5, "min_cosine": 0.9}
    spacy_accelerate.optimize(nlp, "openvino", "int8", **options)
    without = spacy_accelerate.accelerated_components(nlp)["transformer"].exported
    judged = {annotation.value for annotation, _ in without.record.agreement.rates}
    assert "tag" not in judged and "ent" in judged  # no tags on either side
    assert nlp.disabled == ["tagger"]
    nlp.enable_pipe("tagger")
    spacy_accelerate.optimize(nlp, "openvino", "int8", **options)
    whole = spacy_accelerate.accelerated_components(nlp)["transformer"].exported
    assert whole.key != without.key and not whole.cache_hit
    assert "tag" in {annotation.value for annotation, _ in whole.record.agreement.rates}


def _timed(candidate_seconds: list[float]) -> Callable[..., speed.Race]:
    """A race whose candidate takes the next of ``candidate_seconds`` (1 s the baseline)."""

    def race(candidate, baseline, items, name, margin=0.0):
        return speed.Race(candidate_seconds.pop(0), 1.0, name, 4, margin)

    return race


@pytest.mark.real_speed
def test_an_int8_plan_not_faster_than_bf16_is_refused_and_never_served(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(cpu_features_module, "_simulated", [AMX_XEON])  # bf16 units
    # static, its feed-forward outputs float, dynamic; then (fallback=True) ONNX Runtime's
    # three whole plans, faster than its fp32
    monkeypatch.setattr(speed, "race", _timed([2.0, 2.5, 3.0, 0.5, 0.5, 0.5]))
    nlp = spacy.load(sample_path("roberta"))
    with pytest.raises(NoFasterPlanError, match="precision='bf16'") as caught:
        spacy_accelerate.optimize(nlp, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.5)
    message = str(caught.value)
    slower = "not faster than openvino bf16 by 5% on this CPU"
    assert f"all layers int8: {slower} (2000 ms vs openvino bf16 1000 ms" in message
    assert f"float (bf16): {slower} (2500 ms" in message
    assert f"groups of 32; the rest fp32): {slower} (3000 ms" in message
    assert "units back in float: not tried" in message
    assert not spacy_accelerate.is_optimized(nlp)
    # The decision is kept with the entry (keyed by this CPU): a warm start reads it.
    import nncf

    monkeypatch.setattr(nncf, "quantize", _no_quantization)
    with pytest.raises(NoFasterPlanError, match="Decided when this model was first tried"):
        spacy_accelerate.optimize(nlp, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.5)
    # With fallback=True, the request is served by the next provider instead.
    spacy_accelerate.optimize(
        nlp, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.5, fallback=True
    )
    assert spacy_accelerate.accelerated_components(nlp)[
        "transformer"
    ].session.provider.provider is (Provider.CPU)


@pytest.mark.real_speed
def test_a_faster_plan_is_served_after_a_slower_one_is_refused(
    sample_path: Callable[[str], Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(cpu_features_module, "_simulated", [AMX_XEON])
    # the static plans slower, dynamic not
    monkeypatch.setattr(speed, "race", _timed([1.5, 1.5, 0.5]))
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "openvino", "int8", cache_dir=cache_dir, min_agreement=0.5)
    exported_model = spacy_accelerate.accelerated_components(nlp)["transformer"].exported
    assert exported_model.record.plan.startswith("dynamic int8")
    assert exported_model.record.refused[0].startswith(
        "all layers int8: not faster than openvino bf16 by 5% on this CPU (1500 ms vs "
        "openvino bf16 1000 ms"
    )


@pytest.mark.real_speed
def test_a_race_alternates_and_compares_medians(monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []
    # The warm-ups (one item each) take 10 ms: a pass holds the most items, four.
    seconds = {"candidate": iter([0.01, 3, 4, 5]), "baseline": iter([0.01, 2, 6, 4])}

    def timed(session, items):
        calls.append(session)
        return next(seconds[session])

    monkeypatch.setattr(speed, "seconds_per_pass", timed)
    items = [EncoderInputs.from_ids(np.ones((1, 4), dtype=np.int64), 0)] * 6
    result = speed.race("candidate", "baseline", items, "bf16")
    # A warm-up each, then alternating rounds: medians 4 (candidate) and 4 (baseline).
    assert calls == ["candidate", "baseline"] * 4
    assert (result.candidate, result.baseline, result.items) == (4, 4, 4)
    assert not result.faster  # a tie is not faster
    assert result.finding().startswith("not faster than bf16 on this CPU (4000 ms vs bf16")
    # A large model's item takes a second: one item a pass, so a race takes seconds.
    # Two rounds settle it (3 and 2 against 4 and 4): the third is never timed.
    seconds.update(candidate=iter([1.0, 3, 2, 1]), baseline=iter([1.0, 4, 4, 4]))
    calls.clear()
    slow = speed.race("candidate", "baseline", items, "bf16", 0.05)
    assert (
        slow.items == 1 and slow.faster and slow.finding().startswith("not faster than bf16 by 5%")
    )
    assert len(calls) == 6 and (slow.candidate, slow.baseline) == (2.5, 4)
