"""int8 on CPU: a really quantized model, served only when it passes the cosine gate."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import spacy
from annotations import last_hidden
from spacy.language import Language

import spacy_accelerate
from spacy_accelerate import AccuracyError
from spacy_accelerate.backends import base as backend_base
from spacy_accelerate.backends.onnxruntime import backend as ort_backend
from spacy_accelerate.backends.onnxruntime.int8_recipe import DEFAULT_INT8_RECIPE, recipe_for
from spacy_accelerate.cache.store import MANIFEST_NAME
from spacy_accelerate.cpu_features import CpuFeatures, cpu_features
from spacy_accelerate.export.onnx import MODEL_FILE
from spacy_accelerate.options.request import build_config
from spacy_accelerate.verify.parity import ParityReport


@pytest.fixture()
def bert(sample_path: Callable[[str], Path]) -> Language:
    return spacy.load(sample_path("bert"))


def _op_types(path: Path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


def test_int8_quantizes_the_matmuls_and_passes_the_gate(bert: Language, cache_dir: Path):
    text = "Quantized weights still point the same way ."
    reference = last_hidden(bert(text))
    spacy_accelerate.optimize(bert, provider="cpu", precision="int8", cache_dir=cache_dir)
    proxy = spacy_accelerate.accelerated_components(bert)["transformer"]
    assert proxy.session.config.precision.value == "int8"
    report = proxy.exported.parity
    assert report.gate.min_cosine == 0.99 and report.worst_cosine >= 0.99
    ops = _op_types(proxy.exported.path / MODEL_FILE)
    # Dynamic int8 (MatMulInteger) or blockwise int8 (MatMulNBits): int8 arithmetic.
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulNBits"}, ops
    accelerated = last_hidden(bert(text))
    cosine = np.sum(reference * accelerated, axis=1) / (
        np.linalg.norm(reference, axis=1) * np.linalg.norm(accelerated, axis=1)
    )
    assert cosine.min() >= 0.99
    # Not the fp32 model: int8 is measurably different, and stored under its own key.
    assert np.max(np.abs(reference - accelerated)) > 1e-4
    entries = spacy_accelerate.list_cached(cache_dir)
    assert len(entries) == 1 and entries[0].key == proxy.exported.key


def test_int8_and_fp32_are_separate_cache_entries(bert: Language, cache_dir: Path):
    spacy_accelerate.optimize(bert, provider="cpu", precision="int8", cache_dir=cache_dir)
    spacy_accelerate.optimize(bert, provider="cpu", precision="fp32", cache_dir=cache_dir)
    assert len(spacy_accelerate.list_cached(cache_dir)) == 2


def test_a_failed_accuracy_gate_serves_nothing_and_says_why(bert: Language, cache_dir: Path):
    before = last_hidden(bert("The gate refuses this model ."))
    refusal = r"every token's cosine >= 1 not met \(mean cosine 0\.\d+, smallest 0\.\d+\)"
    with pytest.raises(AccuracyError, match=refusal):
        spacy_accelerate.optimize(
            bert, provider="cpu", precision="int8", cache_dir=cache_dir, min_cosine=1.0
        )
    assert not spacy_accelerate.is_optimized(bert)
    # The refusal is kept in place of a model (a lossy verdict costs a pipeline run), and
    # served again as the same error.
    (entry,) = spacy_accelerate.list_cached(cache_dir)
    assert not (entry.path / MODEL_FILE).exists()
    with pytest.raises(AccuracyError, match=refusal):
        spacy_accelerate.optimize(
            bert, provider="cpu", precision="int8", cache_dir=cache_dir, min_cosine=1.0
        )
    assert np.array_equal(before, last_hidden(bert("The gate refuses this model .")))


def test_a_hit_stored_under_a_looser_gate_is_checked_again(bert: Language, cache_dir: Path):
    spacy_accelerate.optimize(
        bert, provider="cpu", precision="int8", cache_dir=cache_dir, min_cosine=0.5
    )
    spacy_accelerate.restore(bert)
    with pytest.raises(AccuracyError):
        spacy_accelerate.optimize(
            bert,
            provider="cpu",
            precision="int8",
            cache_dir=cache_dir,
            min_cosine=1.0,
            verify=False,
        )


def test_the_default_recipe_is_recorded_in_the_cache_key(bert: Language, cache_dir: Path):
    spacy_accelerate.optimize(bert, provider="cpu", precision="int8", cache_dir=cache_dir)
    (entry,) = spacy_accelerate.list_cached(cache_dir)
    manifest = json.loads((entry.path / MANIFEST_NAME).read_text())
    recipe = manifest["key_inputs"]["export"]["int8"]
    assert recipe == {
        "per_channel": True,
        "reduce_range": cpu_features().int8_products_saturate,  # what this CPU needs
        "fuse_first": False,
        "blocks": list(DEFAULT_INT8_RECIPE.blocks),
        "ladder": DEFAULT_INT8_RECIPE.ladder,
        "harm_rows": DEFAULT_INT8_RECIPE.harm_rows,
    }


@pytest.mark.parametrize(
    ("machine", "flags", "seven_bit"),
    [
        ("x86_64", {"avx2", "avx512f", "avx512bw", "avx512_vnni", "amx_int8", "amx_tile"}, False),
        ("x86_64", {"avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}, False),
        ("x86_64", {"avx2", "avx_vnni"}, False),
        ("x86_64", {"avx2"}, True),  # an AVX2-only EPYC: u8 x s8 products saturate
        ("x86_64", {"avx2", "avx512f", "avx512bw"}, True),  # AVX-512 without VNNI too
        ("aarch64", {"asimd", "asimddp"}, False),
    ],
    ids=["amx", "avx512-vnni", "avx-vnni", "avx2", "avx512-no-vnni", "arm"],
)
def test_the_int8_recipe_follows_what_the_cpu_multiplies_without_saturating(
    machine: str, flags: set[str], seven_bit: bool, monkeypatch: pytest.MonkeyPatch
):
    simulated = CpuFeatures(vendor="", flags=frozenset(flags), machine=machine)
    assert recipe_for(simulated).reduce_range is seven_bit
    monkeypatch.setattr(ort_backend, "cpu_features", lambda: simulated)
    assert _key_recipe()["reduce_range"] is seven_bit
    # This machine gets the recipe its own detection says it needs.
    monkeypatch.undo()
    here = cpu_features()
    assert _key_recipe() == asdict(recipe_for(here))


def _key_recipe() -> dict:
    """The int8 recipe the CPU provider's cache key records (what the model is made with)."""
    return ort_backend.OnnxRuntimeBackend().key_options(build_config("cpu", "int8"))["int8"]


def test_a_plan_refused_by_the_gate_falls_back_to_a_more_careful_one(
    bert: Language, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    calls: list[int] = []
    measure = backend_base.BuildJob.measure

    def drift_first(job: backend_base.BuildJob, session: object) -> ParityReport:
        report = measure(job, session)  # type: ignore[arg-type]
        calls.append(1)
        if len(calls) == 1:  # the all-int8 plan: pretend its tokens drifted
            return replace(report, min_cosine=tuple(0.5 for _ in report.min_cosine))
        return report

    monkeypatch.setattr(backend_base.BuildJob, "measure", drift_first)
    # Dynamic int8 alone, so that its refusal leads to its ladder (no blockwise plans).
    dynamic_only = replace(recipe_for(cpu_features()), blocks=())
    monkeypatch.setattr(ort_backend, "int8_recipe", lambda: dynamic_only)
    spacy_accelerate.optimize(bert, provider="cpu", precision="int8", cache_dir=cache_dir)
    proxy = spacy_accelerate.accelerated_components(bert)["transformer"]
    plan = proxy.exported.record.plan
    # The fewest of the MatMuls int8 harms most, back in float, named in the plan.
    found = re.fullmatch(r"(\d+) of 12 MatMuls kept float: (.*)", plan)
    assert found, plan
    named = found.group(2).split(", ")
    assert len(named) == int(found.group(1)) >= 1
    model = onnx.load(str(proxy.exported.path / MODEL_FILE))
    weights = {init.name for init in model.graph.initializer}
    float_projections = {
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul" and any(i in weights for i in node.input)
    }
    assert float_projections == set(named)
    assert len(float_projections) < 12  # two layers of six projections: some stay int8
    # The record lives in the manifest alone; parity.json keeps the measurements.
    manifest = json.loads((proxy.exported.path / "manifest.json").read_text())
    assert manifest["built"]["plan"] == plan
    refused = "every MatMul int8: every token's cosine >= 0.99 not met"
    assert manifest["built"]["refused"][0].startswith(refused)
    recorded = json.loads((proxy.exported.path / "parity.json").read_text())
    assert "plan" not in recorded and "agreement" not in recorded and recorded["min_cosine"]


def test_when_no_plan_passes_every_attempt_is_reported(bert: Language, cache_dir: Path):
    with pytest.raises(
        AccuracyError, match=r"Plans tried: every MatMul int8: .* \| 11 of 12 MatMuls kept float: "
    ):
        spacy_accelerate.optimize(
            bert, provider="cpu", precision="int8", cache_dir=cache_dir, min_cosine=1.0
        )


def _two_matmuls(first: np.ndarray, second: np.ndarray) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
            helper.make_node("MatMul", ["h", "w2"], ["y"], name="second"),
        ],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])],
        [numpy_helper.from_array(first, "w1"), numpy_helper.from_array(second, "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_each_matmul_switches_to_its_int8_twin_alone():
    import onnxruntime

    from spacy_accelerate.backends.onnxruntime.quantize import switchable_model

    rng = np.random.default_rng(0)
    gentle = rng.normal(size=(8, 8)).astype(np.float32)
    gentle[:, 0] *= 1000.0  # an outlier channel into the second MatMul, which ignores it:
    harsh = rng.normal(size=(8, 8)).astype(np.float32)
    harsh[0] = 0.0  # one scale for its whole input rounds the channels it reads away
    model = _two_matmuls(gentle, harsh)
    plain = onnxruntime.InferenceSession(model.SerializeToString())
    switchable, switches = switchable_model(_two_matmuls(gentle, harsh), DEFAULT_INT8_RECIPE)
    assert list(switches) == ["first", "second"]
    assert {node.op_type for node in switchable.graph.node} == {"If"}
    session = onnxruntime.InferenceSession(switchable.SerializeToString())
    x = rng.normal(size=(5, 8)).astype(np.float32)
    off = {switch: np.array(False) for switch in switches.values()}

    def moved(name: str | None) -> float:
        flags = {**off, switches[name]: np.array(True)} if name else off
        (got,) = session.run(None, {"x": x, **flags})
        (want,) = plain.run(None, {"x": x})
        return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))

    assert moved(None) == 0.0  # every switch off: the float model, to the bit
    assert 0.0 < moved("first") < 0.05 < moved("second")
    # What only the branches read (the rounded weights) counts as read: nothing is dropped.
    from spacy_accelerate.backends.onnxruntime.quantize import _drop_unread

    before = sorted(init.name for init in switchable.graph.initializer)
    _drop_unread(switchable.graph)
    assert sorted(init.name for init in switchable.graph.initializer) == before


def test_the_harm_rows_are_spread_over_the_items_without_padding():
    from spacy_accelerate.architectures.inputs import EncoderInputs
    from spacy_accelerate.backends.onnxruntime.quantize import harm_rows

    ids = np.array([[5, 6, 0, 0], [7, 0, 0, 0]])
    items = [EncoderInputs.from_ids(np.where(ids > 0, ids + k, 0), 0) for k in (0, 10, 20, 30)]
    rows = harm_rows(items, 2)
    assert [row.input_ids.tolist() for row in rows] == [[[5, 6]], [[25, 26]]]
    assert all(row.attention_mask.all() for row in rows)


@pytest.mark.parametrize("sample", ["bert", "roberta"])
def test_a_ladder_plan_made_from_the_all_int8_model_is_what_the_quantizer_makes(
    sample: str, sample_path: Callable[[str], Path], tmp_path: Path
):
    import onnxruntime
    from test_accuracy_control import exported_sample

    from spacy_accelerate.architectures.inputs import EncoderInputs
    from spacy_accelerate.backends.onnxruntime.quantize import (
        prepare,
        quantize_int8,
        weighted_matmuls,
        with_float_matmuls,
    )

    path, detected = exported_sample(sample_path, sample, tmp_path)
    prepared = tmp_path / "prepared.onnx"
    prepare(path, prepared)
    matmuls = [node.name for node in weighted_matmuls(onnx.load(str(prepared)).graph)]
    kept = [matmuls[0], matmuls[1], matmuls[-1]]  # two sharing one input, and the last
    quantize_int8(prepared, tmp_path / "all.onnx", DEFAULT_INT8_RECIPE, ())
    quantize_int8(prepared, tmp_path / "kept.onnx", DEFAULT_INT8_RECIPE, kept)
    made = with_float_matmuls(onnx.load(str(tmp_path / "all.onnx")), onnx.load(str(prepared)), kept)
    assert made is not None
    assert sorted(n.op_type for n in made.graph.node) == sorted(
        n.op_type for n in onnx.load(str(tmp_path / "kept.onnx")).graph.node
    )
    ids = np.random.default_rng(0).integers(5, detected.spec.vocab_size, size=(2, 9))
    inputs = EncoderInputs.from_ids(ids, detected.spec.padding_idx)

    def run(model: bytes) -> list[np.ndarray]:
        session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return session.run(None, inputs.feeds(names))

    want = run((tmp_path / "kept.onnx").read_bytes())
    got = run(made.SerializeToString())
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert not np.array_equal(got[-1], run((tmp_path / "all.onnx").read_bytes())[-1])
    # A graph whose MatMuls are not int8 chains is left to the quantizer.
    assert with_float_matmuls(onnx.load(str(prepared)), onnx.load(str(prepared)), kept) is None


def test_a_second_round_reuses_the_first_rounds_models(
    sample_path: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from types import SimpleNamespace

    from test_accuracy_control import exported_sample

    from spacy_accelerate.architectures.inputs import EncoderInputs
    from spacy_accelerate.backends.onnxruntime import quantize as ort_quantize

    path, detected = exported_sample(sample_path, "bert", tmp_path)

    def job(folder: str) -> SimpleNamespace:
        (tmp_path / folder).mkdir()
        export = SimpleNamespace(path=path)
        model = tmp_path / folder / "model.onnx"
        rows = [EncoderInputs.from_ids(np.arange(5, 14).reshape(1, 9), detected.spec.padding_idx)]
        return SimpleNamespace(
            path=model, export=export, measure=lambda session: None, calibration=None, batches=rows
        )

    def quantizer(folder: str, carried=None) -> ort_quantize.OnnxRuntimeQuantizer:
        return ort_quantize.OnnxRuntimeQuantizer(
            job(folder),
            DEFAULT_INT8_RECIPE,
            lambda model: model,
            carried,  # type: ignore[arg-type]
        )

    first = quantizer("first")
    first.build(ort_quantize.KeptFloat())
    carried = first.carry()
    kept = tuple(n.name for n in ort_quantize.weighted_matmuls(carried.prepared.graph))[:2]
    expected = first.build(ort_quantize.KeptFloat(kept)).session.read_bytes()
    first.discard()
    # The second round prepares and quantizes nothing: its ladder's plans are made from
    # the models handed on, the same to the byte as the first round's.
    for step in ("prepare", "quantize_int8"):
        monkeypatch.setattr(ort_quantize, step, lambda *_, s=step: pytest.fail(f"{s} again"))
    second = quantizer("second", carried)
    assert not second.prepared.exists()
    made = second.build(ort_quantize.KeptFloat(kept)).session
    assert made.parent == tmp_path / "second" and made.read_bytes() == expected
    # Its harm measurement changes a copy: the models handed on stay as they were.
    before = carried.prepared.SerializeToString()
    (ladder,) = second.ladders(None)  # type: ignore[arg-type]
    assert len(ladder) == len(ort_quantize.weighted_matmuls(carried.prepared.graph)) - 1
    assert carried.prepared.SerializeToString() == before
