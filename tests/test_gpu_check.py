"""``benchmarks/gpu_check.py`` on a machine without a GPU: it says what is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"


def test_gpu_check_lists_what_is_missing_and_exits_non_zero(tmp_path: Path):
    if torch.cuda.is_available():
        pytest.skip("describes a machine without a GPU; on a GPU the script runs the check")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    out = result.stdout
    assert "[MISSING] CUDA device 0 visible to torch" in out
    assert "[MISSING] onnxruntime-gpu: CUDAExecutionProvider" in out
    assert "install: pip uninstall -y onnxruntime && pip install 'spacy-accelerate[gpu]'" in out
    assert "[MISSING] onnxruntime-gpu: TensorrtExecutionProvider" in out
    assert "Cannot run the GPU check: missing CUDA device 0 visible to torch" in out
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written
    optional = subprocess.run(
        [sys.executable, str(SCRIPT), "--no-tensorrt", "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert optional.returncode == 2
    assert "[missing (optional)] onnxruntime-gpu: TensorrtExecutionProvider" in optional.stdout
