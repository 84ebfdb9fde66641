"""A pipeline served on OpenVINO holds one copy of the encoder's weights (issue 61, item
4): OpenVINO's CPU plugin packs its own copy at the first inference, and the IR's mapped
``model.bin``, every page of which compiling read, is given back after it
(:mod:`spacy_accelerate.backends.openvino.mapped_weights`), after ``optimize()`` and after
a load of the saved bundle alike; outputs stay bit-identical when OpenVINO reads the
pages again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import spacy
from annotations import last_hidden, run
from spacy.language import Language

import spacy_accelerate
from spacy_accelerate.backends.openvino.mapped_weights import FileId, file_ids, give_back
from spacy_accelerate.backends.openvino.session import (
    IR_WEIGHTS,
    OpenVINORunner,
    cpu_capabilities,
    import_openvino,
    precision_hint,
)
from spacy_accelerate.options.config import Precision


def _resident_kib(file: Path) -> tuple[int, int]:
    """This process's resident KiB of its mappings of ``file``, and their size in KiB."""
    resident = size = 0
    counting = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and ":" not in fields[0]:  # a mapping's header line
            counting = len(fields) >= 6 and fields[5] == str(file.resolve())
        elif counting and fields[0] == "Rss:":
            resident += int(fields[1])
        elif counting and fields[0] == "Size:":
            size += int(fields[1])
    return resident, size


def _ir_weights(nlp: Language) -> Path:
    (proxy,) = spacy_accelerate.accelerated_components(nlp).values()
    return proxy.exported.path / IR_WEIGHTS


def _matmuls_ir(folder: Path) -> Path:
    """An IR of two MatMuls with 16 MiB of fp32 weights (most of what an encoder's IR holds
    is such weights: 95% of trf-base's), written to ``folder``."""
    ov = import_openvino()
    from openvino import opset13 as ops

    rows = np.random.default_rng(0)
    inputs = ops.parameter([-1, 1024], np.float32, name="x")
    up = ops.matmul(
        inputs, ops.constant(rows.standard_normal((1024, 2048), np.float32)), False, False
    )
    down = ops.matmul(
        ops.relu(up), ops.constant(rows.standard_normal((2048, 1024), np.float32)), False, False
    )
    ov.save_model(ov.Model([down], [inputs]), str(folder / "model.xml"), compress_to_fp16=False)
    return folder / "model.xml"


def test_the_packed_weights_are_the_only_copy_after_the_first_inference(tmp_path: Path):
    ir = _matmuls_ir(tmp_path)
    core = import_openvino().Core()
    hint = precision_hint(Precision.BF16 if "BF16" in cpu_capabilities() else Precision.FP32)
    compiled = core.compile_model(
        core.read_model(str(ir)), "CPU", {"INFERENCE_PRECISION_HINT": hint}
    )
    runner = OpenVINORunner(compiled, file_ids([ir.with_suffix(".bin")]))
    resident, size = _resident_kib(ir.with_suffix(".bin"))
    assert size >= 16 * 1024 and resident >= 0.9 * size  # compiling read every page
    shapes = [(1, 7), (8, 128), (16, 300)] if hint == "bf16" else [(1, 7)]
    for rows, length in shapes:  # under f32 the plugin reads some originals in place again
        feeds = {"x": np.ones((rows * length, 1024), np.float32)}
        runner.run_arrays(feeds, [runner.compiled.outputs[0].any_name])
        resident, _ = _resident_kib(ir.with_suffix(".bin"))
        assert resident <= 0.05 * size, f"{resident} of {size} KiB resident, {hint}"


@pytest.fixture()
def optimized(sample_path: Callable[[str], Path], cache_dir: Path) -> Language:
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "openvino", "fp32", cache_dir=cache_dir)
    return nlp


def _given_back(nlp: Language) -> frozenset[FileId]:
    (proxy,) = spacy_accelerate.accelerated_components(nlp).values()
    return proxy.session.runner.mapped


def test_optimize_and_a_bundled_load_give_back_the_irs_mapped_weights(
    optimized: Language, tmp_path: Path
):
    assert file_ids([_ir_weights(optimized)]) <= _given_back(optimized)
    optimized.to_disk(tmp_path / "saved")
    loaded = spacy.load(tmp_path / "saved")
    assert _ir_weights(loaded).is_relative_to(tmp_path / "saved")  # served from the bundle
    assert file_ids([_ir_weights(loaded)]) <= _given_back(loaded)


def test_pages_read_again_give_the_same_outputs(optimized: Language, ewt_texts: list[str]):
    texts = ewt_texts[:16]
    before = [last_hidden(doc) for doc in run(optimized, texts, batch_size=8)]
    assert give_back(file_ids([_ir_weights(optimized)])) > 0
    after = [last_hidden(doc) for doc in run(optimized, texts, batch_size=8)]
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
