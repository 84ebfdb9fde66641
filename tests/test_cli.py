"""The command line: every command works, and every failure is one line and a non-zero exit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import spacy
from click.testing import Result
from spacy_accelerate_samples.pipelines import SAMPLES_ENV_VAR
from typer.testing import CliRunner

import spacy_accelerate
from spacy_accelerate.cli import app, outputs
from spacy_accelerate.cli import bench as bench_cli
from spacy_accelerate.cli import optimize as optimize_cli
from spacy_accelerate.cli.outputs import check_pipeline_folder
from spacy_accelerate.provision.bundle import BUNDLE_DIR, BUNDLE_FILE

runner = CliRunner()


def invoke(*args: str, input: str | None = None) -> Result:
    return runner.invoke(app, list(args), input=input)


def assert_one_line_error(result: Result, pattern: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: ") and pattern in lines[0], lines[0]


def test_doctor_reports_cpu_available_and_gpu_providers_missing(cache_dir: Path):
    result = invoke("doctor", "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    assert "spacy-accelerate" in result.output and "onnxruntime" in result.output
    curated = next(
        line for line in result.output.splitlines() if "spacy-curated-transformers" in line
    )
    assert "not installed" not in curated
    lines = result.output.splitlines()
    assert any(line.split()[:3] == ["cpu", "yes", "available"] for line in lines), result.output
    cuda = next(line for line in lines if line.strip().startswith("cuda"))
    assert "no" in cuda and "pip install 'spacy-accelerate[gpu]'" in cuda
    tensorrt = next(line for line in lines if line.strip().startswith("tensorrt"))
    assert "no" in tensorrt and "spacy-accelerate[tensorrt]" in tensorrt
    assert f"cache: {cache_dir}" in result.output
    assert "gpu: " in result.output
    # OpenVINO (a test dependency) runs here; its runtime line says what it can do.
    assert any(line.split()[:3] == ["openvino", "yes", "available"] for line in lines)
    runtimes = [line.strip() for line in lines if line.startswith("  OpenVINO ")]
    assert runtimes and "FP32" in runtimes[0], result.output
    assert any(line.strip().startswith("ONNX Runtime ") for line in lines), result.output
    cpu = next(line for line in lines if line.startswith("cpu: "))
    assert "auto serves int8 with" in cpu


def test_doctor_with_a_file_as_cache_dir_is_one_line(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    assert_one_line_error(invoke("doctor", "--cache-dir", str(tmp_path / "file")), "is a file")


def test_optimize_builds_the_cache_then_hits_it(bert_path: Path, cache_dir: Path, tmp_path: Path):
    first = invoke("optimize", str(bert_path), "--provider", "cpu", "--cache-dir", str(cache_dir))
    assert first.exit_code == 0, first.output
    assert "transformer: served by cpu fp32, exported" in first.output
    assert "max abs diff" in first.output
    saved = tmp_path / "saved"
    second = invoke(
        "optimize",
        str(bert_path),
        "--provider",
        "cpu",
        "--cache-dir",
        str(cache_dir),
        "--output",
        str(saved),
    )
    assert second.exit_code == 0, second.output
    assert re.search(r"transformer: served by cpu fp32, cache hit, key [0-9a-f]{12}", second.output)
    assert len(spacy_accelerate.list_cached(cache_dir)) == 1
    assert (saved / BUNDLE_DIR / BUNDLE_FILE).is_file()  # --output bundles by default
    assert spacy_accelerate.is_optimized(spacy.load(saved))
    plain = tmp_path / "plain"
    args = ["--provider", "cpu", "--cache-dir", str(cache_dir), "--output", str(plain)]
    third = invoke("optimize", str(bert_path), *args, "--no-bundle")
    assert third.exit_code == 0, third.output
    assert (plain / "config.cfg").is_file() and not (plain / BUNDLE_DIR).exists()


def test_optimize_falls_back_only_when_asked(
    bert_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    import onnxruntime
    import torch

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["optimize", str(bert_path), "--provider", "tensorrt", "--precision", "fp16"]
    refused = invoke(*args, "--cache-dir", str(cache_dir))
    assert_one_line_error(refused, "spacy-accelerate[tensorrt]")
    assert "--provider tensorrt" in refused.output and "provider=" not in refused.output
    served = invoke(*args, "--cache-dir", str(cache_dir), "--fallback")
    assert served.exit_code == 0, served.output
    assert "transformer: served by cpu fp32" in served.output


@pytest.mark.parametrize(
    ("make_path", "pattern"),
    [
        (lambda tmp: tmp / "no-such-pipeline", "No pipeline at"),
        (lambda tmp: tmp, "has no config.cfg"),
        (lambda tmp: Path("en_core_web_trf"), "No pipeline at en_core_web_trf: tried a folder"),
    ],
    ids=["bad-path", "folder-without-pipeline", "missing-package"],
)
def test_optimize_without_a_pipeline_is_one_line(
    make_path: Callable[[Path], Path], pattern: str, tmp_path: Path
):
    assert_one_line_error(invoke("optimize", str(make_path(tmp_path))), pattern)


def test_optimize_with_a_bad_option_is_one_line(bert_path: Path, cache_dir: Path):
    result = invoke("optimize", str(bert_path), "--precision", "fp8", "--cache-dir", str(cache_dir))
    assert_one_line_error(result, "Unknown --precision 'fp8'")


def test_bench_compares_with_pytorch(
    bert_path: Path,
    texts_file: Path,
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    report = tmp_path / "bench.json"
    result = invoke(
        "bench",
        str(bert_path),
        str(texts_file),
        "--precision",
        "fp32",
        "--precision",
        "int8",
        "--precision",
        "auto",
        "--repeats",
        "1",
        "--output",
        str(report),
    )
    assert result.exit_code == 0, result.output
    assert "PyTorch fp32" in result.output and "cpu fp32" in result.output
    assert "cpu int8" in result.output and "agreement: tag" in result.output
    assert "cpu auto" in result.output  # the fastest plan that passes, timed like the others
    written = json.loads(report.read_text())
    assert set(written["variants"]) == {"fp32", "int8", "auto"}
    assert written["variants"]["fp32"]["agreement"]["tag"] == 1.0
    # Where the time goes: PyTorch's stages beside the first precision's, and the advice.
    assert "where the time goes" in result.output and "encoder call" in result.output
    assert "one process reaches at most" in result.output
    stages = written["where_time_goes"]["stages"]
    assert set(stages) == {"pytorch fp32", "fp32"}
    assert sum(row["share"] for row in stages["fp32"].values()) == pytest.approx(1, abs=0.01)
    assert written["where_time_goes"]["processes"] >= 1


def test_bench_without_texts_or_pipeline_is_one_line(
    bert_path: Path, texts_file: Path, tmp_path: Path
):
    missing = invoke("bench", str(bert_path), str(tmp_path / "missing.txt"))
    assert_one_line_error(missing, "No texts file at")
    (tmp_path / "empty.txt").write_text("\n\n")
    assert_one_line_error(invoke("bench", str(bert_path), str(tmp_path / "empty.txt")), "no text")
    no_pipeline = invoke("bench", str(tmp_path / "nothing"), str(texts_file))
    assert_one_line_error(no_pipeline, "No pipeline at")


def test_cache_list_size_and_clear(bert_path: Path, cache_dir: Path):
    assert invoke("cache", "list", "--cache-dir", str(cache_dir)).output.strip() == (
        "no cached models"
    )
    assert invoke("optimize", str(bert_path), "--cache-dir", str(cache_dir)).exit_code == 0
    listed = invoke("cache", "list", "--cache-dir", str(cache_dir))
    assert listed.exit_code == 0 and "bert" in listed.output and "fp32" in listed.output
    size = invoke("cache", "size", "--cache-dir", str(cache_dir))
    assert size.exit_code == 0 and float(size.output.split()[0]) > 0
    refused = invoke("cache", "clear", "--cache-dir", str(cache_dir), input="n\n")
    assert refused.exit_code == 1 and len(spacy_accelerate.list_cached(cache_dir)) == 1
    cleared = invoke("cache", "clear", "--cache-dir", str(cache_dir), "--yes")
    assert cleared.exit_code == 0 and "removed 1 cached models" in cleared.output
    assert spacy_accelerate.list_cached(cache_dir) == []


@pytest.mark.parametrize("command", ["list", "size", "clear"])
def test_cache_commands_with_a_file_as_cache_dir_are_one_line(command: str, tmp_path: Path):
    (tmp_path / "file").write_text("x")
    result = invoke("cache", command, "--cache-dir", str(tmp_path / "file"), "--yes")
    if command != "clear":
        result = invoke("cache", command, "--cache-dir", str(tmp_path / "file"))
    assert_one_line_error(result, "is a file")


@pytest.mark.slow
def test_the_demo_script_accelerates_the_trained_minilm_pipeline(
    samples_root: Path, trained_minilm_cache: Path, monkeypatch: pytest.MonkeyPatch
):
    """The README's first command ends with ``python examples/demo.py``."""
    monkeypatch.setenv(SAMPLES_ENV_VAR, str(samples_root))
    monkeypatch.setenv("SPACY_ACCELERATE_CACHE", str(trained_minilm_cache))
    demo = Path(__file__).resolve().parents[1] / "examples" / "demo.py"
    completed = subprocess.run(
        [sys.executable, str(demo), "--sentences", "60", "--repeats", "1"],
        capture_output=True,
        text=True,
    )
    output = completed.stdout
    assert completed.returncode == 0, completed.stderr
    assert "PyTorch fp32" in output
    assert "accelerated fp32" in output and "accelerated auto" in output
    assert re.search(r"optimize\(\) accelerated auto: .*\n  serves \w+ \w+", output), output
    assert "agreement with PyTorch: tag" in output
    assert "Entities found" in output and "->" in output


def test_module_entry_point_runs():
    completed = subprocess.run(
        [sys.executable, "-m", "spacy_accelerate", "--help"], capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stderr
    for command in ("doctor", "optimize", "bench", "cache"):
        assert command in completed.stdout


def test_optimize_accepts_auto_and_cache_list_shows_plans_and_agreement(
    bert_path: Path, cache_dir: Path
):
    args = ["optimize", str(bert_path), "--provider", "cpu", "--cache-dir", str(cache_dir)]
    bad = invoke(*args, "--precision", "int8", "--min-agreement", "dep=high")
    assert_one_line_error(bad, "--min-agreement 'dep=high' is neither a number")
    unknown = invoke(*args, "--precision", "int8", "--min-agreement", "deps=0.9")
    assert_one_line_error(unknown, "--min-agreement has no annotation 'deps'")
    served = invoke(*args, "--precision", "int8", "--min-agreement", "dep=0.9,tag=0.95")
    assert served.exit_code == 0, served.output
    assert "agreement on the calibration texts: tag " in served.output
    auto = invoke(*args, "--precision", "auto")
    assert auto.exit_code == 0, auto.output
    assert re.search(r"transformer: served by cpu (fp32|int8)", auto.output), auto.output
    listed = invoke("cache", "list", "--cache-dir", str(cache_dir)).output
    assert "precision='auto' choice: cpu " in listed
    assert re.search(r"plan: (every MatMul int8|\d+ of \d+ MatMuls kept float: )", listed), listed
    assert re.search(r"agreement with PyTorch fp32 on the calibration texts: .*tag \d", listed)


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda tmp, _: _file(tmp / "passwd"), "is a file: give a folder"),
        (lambda tmp, _: _file(tmp / "notes" / "mine.txt").parent, "is a folder of other files"),
        (lambda tmp, _: _file(tmp / "a-file") / "below", "a-file is a file, not a folder"),
        (lambda tmp, patch: _read_only(tmp / "locked", patch) / "saved", "is not writable here"),
    ],
    ids=["existing-file", "foreign-folder", "under-a-file", "unwritable-parent"],
)
def test_optimize_checks_output_before_any_work(
    bert_path: Path, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make, pattern
):
    output = make(tmp_path, monkeypatch)
    monkeypatch.setattr(optimize_cli, "load_pipeline", _no_work)
    result = invoke("optimize", str(bert_path), "--provider", "cpu", "--output", str(output))
    assert_one_line_error(result, f"--output {output}")
    assert pattern in result.output
    assert not cache_dir.exists()  # nothing was built


def test_bench_and_annotate_check_their_output_before_any_work(
    bert_path: Path, texts_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(bench_cli, "load_pipeline", _no_work)
    report = _file(tmp_path / "a-file") / "report.json"
    bench = invoke("bench", str(bert_path), str(texts_file), "--output", str(report))
    assert_one_line_error(bench, "--output")
    assert "is a file, not a folder" in bench.output
    locked = _read_only(tmp_path / "locked", monkeypatch)
    annotated = invoke("annotate", str(bert_path), str(texts_file), str(locked / "out.jsonl"))
    assert_one_line_error(annotated, f"OUTPUT {locked / 'out.jsonl'} cannot be written")


def test_optimize_output_may_be_new_empty_or_a_pipeline(tmp_path: Path):
    check_pipeline_folder(tmp_path / "new" / "deeper", "--output")
    (tmp_path / "empty").mkdir()
    check_pipeline_folder(tmp_path / "empty", "--output")
    _file(tmp_path / "pipeline" / "config.cfg")
    check_pipeline_folder(tmp_path / "pipeline", "--output")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty", "pipeline"]


def _file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("someone's file")
    return path


def _read_only(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder this process cannot write into: read-only by its mode, and (root writes
    whatever the mode says) by the probe the check makes, which fails there as the
    kernel would."""
    path.mkdir()
    path.chmod(0o555)
    made = tempfile.mkstemp

    def refuse_inside(*args: Any, dir: Any = None, **kwargs: Any) -> Any:
        if dir is not None and Path(dir) == path:
            raise PermissionError(13, "Permission denied")
        return made(*args, dir=dir, **kwargs)

    monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse_inside)
    return path


def _no_work(*args: object, **kwargs: object) -> None:
    raise AssertionError("the command started its work before checking its output")
