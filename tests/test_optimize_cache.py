"""optimize() and the model cache together: hits, misses, corruption, concurrency."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
import torch

import spacy_accelerate
from spacy_accelerate.cache.store import ModelCache
from spacy_accelerate.export.onnx import MODEL_FILE
from spacy_accelerate.provision import exports as shared_export
from spacy_accelerate.serving.proxy import AcceleratedEncoder


def optimize(nlp: spacy.language.Language, cache_dir: Path) -> AcceleratedEncoder:
    spacy_accelerate.optimize(nlp, provider="cpu", precision="fp32", cache_dir=cache_dir)
    return spacy_accelerate.accelerated_components(nlp)["transformer"]


@pytest.fixture()
def minilm(sample_path: Callable[[str], Path]) -> spacy.language.Language:
    return spacy.load(sample_path("minilm"))


def test_second_optimize_is_a_hit_without_export(
    minilm: spacy.language.Language,
    sample_path: Callable[[str], Path],
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    start = time.perf_counter()
    first = optimize(minilm, cache_dir)
    cold = time.perf_counter() - start
    assert not first.exported.cache_hit

    def no_export(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cache hit must not export")

    monkeypatch.setattr(shared_export, "export_onnx", no_export)
    fresh = spacy.load(sample_path("minilm"))  # as a new process would
    start = time.perf_counter()
    second = optimize(fresh, cache_dir)
    warm = time.perf_counter() - start
    assert second.exported.cache_hit
    assert second.exported.key == first.exported.key
    assert len(spacy_accelerate.list_cached(cache_dir)) == 1
    print(f"\ncold optimize {cold:.2f} s, warm optimize {warm:.2f} s, {cold / warm:.1f}x faster")


def test_one_changed_weight_misses(minilm: spacy.language.Language, cache_dir: Path):
    first = optimize(minilm, cache_dir)
    spacy_accelerate.restore(minilm)
    module = minilm.get_pipe("transformer").model.get_ref("transformer").shims[0]._model
    with torch.no_grad():
        module.curated_encoder.layers[3].ffn.output.bias[7] += 0.25
    assert minilm.meta["name"] and minilm.meta["version"]  # same name and version as before
    second = optimize(minilm, cache_dir)
    assert not second.exported.cache_hit
    assert second.exported.key != first.exported.key
    assert {entry.key for entry in spacy_accelerate.list_cached(cache_dir)} == {
        first.exported.key,
        second.exported.key,
    }


def test_truncated_onnx_file_is_detected_and_rebuilt(
    minilm: spacy.language.Language, cache_dir: Path, caplog: pytest.LogCaptureFixture
):
    first = optimize(minilm, cache_dir)
    model_file = first.exported.path / MODEL_FILE
    size = model_file.stat().st_size
    with model_file.open("r+b") as handle:
        handle.truncate(size // 2)
    spacy_accelerate.restore(minilm)
    second = optimize(minilm, cache_dir)
    assert not second.exported.cache_hit
    assert second.exported.key == first.exported.key
    assert model_file.stat().st_size == size
    assert "Evicted corrupt model cache entry" in caplog.text
    assert ModelCache(cache_dir).lookup(first.exported.key) is not None


CONCURRENT_SCRIPT = """
import sys, spacy, spacy_accelerate
nlp = spacy.load(sys.argv[1])
spacy_accelerate.optimize(nlp, provider="cpu", cache_dir=sys.argv[2])
proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
print("HIT" if proxy.exported.cache_hit else "MISS", proxy.exported.key)
"""


def test_two_processes_optimizing_at_once_leave_one_entry(
    sample_path: Callable[[str], Path], cache_dir: Path
):
    path = sample_path("minilm")
    command = [sys.executable, "-c", CONCURRENT_SCRIPT, str(path), str(cache_dir)]
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [process.communicate(timeout=600) for process in processes]
    for process, (_, err) in zip(processes, results, strict=True):
        assert process.returncode == 0, err[-2000:]
    lines = sorted(out.strip().splitlines()[-1] for out, _ in results)
    assert [line.split()[0] for line in lines] == ["HIT", "MISS"]
    assert len({line.split()[1] for line in lines}) == 1
    children = sorted(p.name for p in cache_dir.iterdir() if not p.name.startswith(".locks"))
    assert children == [lines[0].split()[1]]


def test_cache_management_functions(minilm: spacy.language.Language, cache_dir: Path):
    assert spacy_accelerate.list_cached(cache_dir) == []
    proxy = optimize(minilm, cache_dir)
    [entry] = spacy_accelerate.list_cached(cache_dir)
    assert entry.key == proxy.exported.key
    assert (entry.family, entry.provider, entry.precision) == ("bert", "cpu", "fp32")
    assert spacy_accelerate.cache_size(cache_dir) >= entry.size_bytes > 1_000_000
    # The environment variable is the default location (set by the fixture).
    assert [e.key for e in spacy_accelerate.list_cached()] == [entry.key]
    assert spacy_accelerate.clear_cache(cache_dir) == 1
    assert spacy_accelerate.list_cached(cache_dir) == []
