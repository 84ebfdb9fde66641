"""What happens when a GPU provider is missing or cannot start, simulated on a CPU machine.

By default: a clear error, and the pipeline exactly as it was. With
``fallback=True``: TensorRT -> CUDA -> CPU with a warning at each step, and
the pipeline served by the first provider that works.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import spacy
import torch
from annotations import disagreements, max_abs_diff, run

import spacy_accelerate
from spacy_accelerate.backends import registry as providers
from spacy_accelerate.backends.onnxruntime import session as runtime
from spacy_accelerate.backends.onnxruntime.provider_options import import_onnxruntime
from spacy_accelerate.backends.onnxruntime.session import engine_failures
from spacy_accelerate.backends.registry import check_provider, fallback_chain
from spacy_accelerate.cpu_features import cpu_features
from spacy_accelerate.errors import (
    ConversionError,
    EngineBuildError,
    InvalidInputError,
    InvalidOptionError,
    ProviderUnavailableError,
)
from spacy_accelerate.options.config import Provider
from spacy_accelerate.options.request import build_config
from spacy_accelerate.pipeline import patch as patch_module

ort = import_onnxruntime()
TEXTS_USED = 16


@pytest.fixture()
def nlp(sample_path: Callable[[str], Path]) -> spacy.language.Language:
    return spacy.load(sample_path("roberta"))


@pytest.fixture()
def pretend_gpu_providers_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime-gpu as on a machine whose driver or GPU is missing: the providers are
    listed, but ONNX Runtime cannot start them and quietly runs on the CPU instead."""
    listed = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: listed)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.fixture()
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU build of onnxruntime and of torch, whatever this machine has."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def steps(config) -> list[tuple[str, str, bool]]:
    return [(c.provider.value, c.precision.value, c.gpu.cuda_graph) for c in fallback_chain(config)]


def test_gpu_providers_need_a_torch_that_can_use_the_gpu(monkeypatch: pytest.MonkeyPatch):
    listed = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: listed)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ProviderUnavailableError, match="CPU-only build"):
        check_provider(build_config("cuda", "fp16"))
    assert check_provider(build_config("auto", "fp32")).provider is Provider.CPU


def test_with_cuda_graphs_the_gpu_is_tried_again_without_them(cpu_only):
    config = build_config("cuda", "fp16", fallback=True, gpu={"cuda_graph": True})
    assert steps(config) == [("cuda", "fp16", True), ("cuda", "fp16", False), ("cpu", "fp32", True)]
    assert fallback_chain(build_config("cuda", "fp16")) == [build_config("cuda", "fp16")]


def test_fallback_never_serves_a_request_this_release_refuses(cpu_only):
    for provider, precision in (("cpu", "fp16"), ("cuda", "int8"), ("tensorrt", "int8")):
        with pytest.raises(InvalidOptionError, match="not available in this release"):
            fallback_chain(build_config(provider, precision, fallback=True))
    # int8 on the GPU is refused, not quietly served as fp32 on the GPU.
    assert steps(build_config("cpu", "int8")) == [("cpu", "int8", False)]
    # The CPU has nothing to fall back to: fallback=True there is refused, not ignored.
    with pytest.raises(InvalidOptionError, match=r"fallback=True applies to provider"):
        build_config("cpu", "int8", fallback=True)


def test_auto_walks_every_usable_provider(pretend_gpu_providers_installed, monkeypatch):
    here = cpu_features()
    monkeypatch.setattr(providers, "cpu_features", lambda: replace(here, vendor="AuthenticAMD"))
    assert steps(build_config("auto", "fp32")) == [
        ("tensorrt", "fp32", False),
        ("cuda", "fp32", False),
        ("cpu", "fp32", False),
        ("openvino", "fp32", False),  # OpenVINO (a test dependency) serves the CPU too
    ]
    # fp16: only the GPU serves it; the CPU (at fp32) only when falling back is allowed.
    assert [s[:2] for s in steps(build_config("auto", "fp16"))] == [
        ("tensorrt", "fp16"),
        ("cuda", "fp16"),
    ]
    assert steps(build_config("auto", "fp16", fallback=True))[-1] == ("cpu", "fp32", False)
    # int8 is the CPU's: ONNX Runtime first on an AMD CPU, OpenVINO first on an Intel one.
    assert steps(build_config("auto", "int8")) == [
        ("cpu", "int8", False),
        ("openvino", "int8", False),
    ]
    monkeypatch.setattr(providers, "cpu_features", lambda: replace(here, vendor="GenuineIntel"))
    assert steps(build_config("auto", "int8"))[0] == ("openvino", "int8", False)


def test_auto_fp16_on_a_cpu_machine_falls_back_only_when_asked(cpu_only):
    assert steps(build_config("auto", "fp16", fallback=True)) == [("cpu", "fp32", False)]
    with pytest.raises(InvalidOptionError, match="precision='fp16' is not available"):
        check_provider(fallback_chain(build_config("auto", "fp16"))[0])


def test_auto_serves_on_the_cpu_when_the_listed_gpu_providers_cannot_start(
    nlp, cache_dir: Path, pretend_gpu_providers_installed, caplog: pytest.LogCaptureFixture
):
    # onnxruntime-gpu lists TensorRT even without TensorRT's libraries: plain
    # optimize(nlp) must still work.
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        spacy_accelerate.optimize(nlp, cache_dir=cache_dir)
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    assert proxy.session.provider.provider is Provider.CPU
    warnings = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert len(warnings) == 2 and "could not start TensorrtExecutionProvider" in warnings[0]


def test_a_missing_gpu_provider_is_an_error_naming_the_extra(nlp, cache_dir: Path, cpu_only):
    for provider, extra in (("cuda", "gpu"), ("tensorrt", "tensorrt")):
        install = re.escape(f"pip install 'spacy-accelerate[{extra}]'")
        with pytest.raises(ProviderUnavailableError, match=install):
            spacy_accelerate.optimize(nlp, provider, "fp16", cache_dir=cache_dir)
    assert not spacy_accelerate.is_optimized(nlp)
    assert spacy_accelerate.list_cached(cache_dir) == []


def test_fallback_walks_tensorrt_cuda_cpu_with_warnings(
    nlp, ewt_texts: list[str], cache_dir: Path, caplog: pytest.LogCaptureFixture, cpu_only
):
    texts = ewt_texts[:TEXTS_USED]
    expected = run(nlp, texts, batch_size=8)
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        spacy_accelerate.optimize(nlp, "tensorrt", "fp16", cache_dir=cache_dir, fallback=True)
    steps = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert len(steps) == 2
    assert "provider='tensorrt'" in steps[0] and "provider='cuda', precision='fp16'" in steps[0]
    assert "provider='cuda'" in steps[1] and "provider='cpu', precision='fp32'" in steps[1]
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    assert proxy.session.provider.provider is Provider.CPU
    assert proxy.session.config.precision.value == "fp32"
    actual = run(nlp, texts, batch_size=8)
    assert max_abs_diff(expected, actual) <= 1e-4
    assert disagreements(expected, actual, nlp) == []


def test_a_provider_that_cannot_start_is_an_error_and_the_pipeline_is_unchanged(
    nlp, cache_dir: Path, pretend_gpu_providers_installed
):
    module = spacy_accelerate.accelerated_components(nlp)
    assert module == {}
    with pytest.raises(EngineBuildError, match="could not start CUDAExecutionProvider"):
        spacy_accelerate.optimize(nlp, "cuda", "fp32", cache_dir=cache_dir)
    assert not spacy_accelerate.is_optimized(nlp)
    # Nothing half-built is left in the cache: the failed build was never committed.
    assert spacy_accelerate.list_cached(cache_dir) == []


def test_fallback_from_a_provider_that_cannot_start(
    nlp, cache_dir: Path, pretend_gpu_providers_installed, caplog: pytest.LogCaptureFixture
):
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        spacy_accelerate.optimize(nlp, "cuda", "fp16", cache_dir=cache_dir, fallback=True)
    assert spacy_accelerate.is_optimized(nlp)
    warning = next(r.getMessage() for r in caplog.records if "falling back" in r.getMessage())
    assert "could not start CUDAExecutionProvider" in warning
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    assert proxy.session.provider.provider is Provider.CPU


def test_accuracy_failures_never_fall_back(
    nlp,
    cache_dir: Path,
    pretend_gpu_providers_installed,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    # The "CUDA" session runs (on the CPU), so the model reaches the parity gate and
    # fails it: that is the model's fault, not the provider's, so no fallback.
    monkeypatch.setattr(runtime, "check_active", lambda session, provider: None)
    monkeypatch.setitem(runtime._RUNNERS, Provider.CUDA, runtime._host_runner)
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        with pytest.raises(ConversionError, match="does not match the PyTorch module"):
            spacy_accelerate.optimize(
                nlp, "cuda", "fp32", cache_dir=cache_dir, fallback=True, tolerance=1e-12
            )
    assert not spacy_accelerate.is_optimized(nlp)
    assert "falling back" not in caplog.text  # the CPU was never tried


def test_a_failure_after_patching_puts_the_previous_acceleration_back(
    nlp, cache_dir: Path, pretend_gpu_providers_installed, monkeypatch: pytest.MonkeyPatch
):
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    before = spacy_accelerate.accelerated_components(nlp)["transformer"]
    record = dict(nlp.config["nlp"]["after_pipeline_creation"])
    monkeypatch.setattr(runtime, "check_active", lambda session, provider: None)
    monkeypatch.setitem(runtime._RUNNERS, Provider.CUDA, runtime._host_runner)
    patched = []

    def failing_warm_up(proxy, spans, all_layers):
        patched.append(spacy_accelerate.accelerated_components(nlp)["transformer"])
        raise EngineBuildError("the engine failed at warm-up")

    monkeypatch.setattr(patch_module, "warm_up", failing_warm_up)
    with pytest.raises(EngineBuildError, match="failed at warm-up"):
        spacy_accelerate.optimize(nlp, "cuda", "fp16", cache_dir=cache_dir)
    assert patched and patched[0] is not before  # the new proxy was in place ...
    assert spacy_accelerate.accelerated_components(nlp)["transformer"] is before  # ... and left
    assert dict(nlp.config["nlp"]["after_pipeline_creation"]) == record


@pytest.mark.parametrize(
    "failure",
    [
        ort.capi.onnxruntime_pybind11_state.Fail("TensorRT engine build failed"),
        RuntimeError("Error in execution: CUDA failure 900"),  # what run_with_iobinding raises
    ],
    ids=["Fail", "RuntimeError"],
)
def test_onnx_runtime_failures_on_a_gpu_provider_become_engine_build_errors(failure):
    with pytest.raises(EngineBuildError, match="TensorrtExecutionProvider failed to build"):
        with engine_failures(Provider.TENSORRT, "build", ort):
            raise failure
    with pytest.raises(type(failure)):  # on the CPU they stay what they are
        with engine_failures(Provider.CPU, "build", ort):
            raise failure
    with pytest.raises(InvalidInputError):  # our own errors pass through unchanged
        with engine_failures(Provider.CUDA, "run", ort):
            raise InvalidInputError("too long")


def test_fallback_and_gpu_options_are_saved_with_the_pipeline(
    nlp, cache_dir: Path, tmp_path: Path, ewt_texts: list[str], cpu_only
):
    gpu = spacy_accelerate.GpuOptions(batch_buckets=(1, 4), cuda_graph=True)
    spacy_accelerate.optimize(nlp, "cuda", "fp16", cache_dir=cache_dir, fallback=True, gpu=gpu)
    nlp.to_disk(tmp_path / "saved")
    loaded = spacy.load(tmp_path / "saved")
    section = loaded.config["nlp"]["after_pipeline_creation"]
    assert section["fallback"] is True and section["gpu"]["batch_buckets"] == [1, 4]
    assert section["gpu"]["cuda_graph"] is True and section["tolerance"] is None
    assert section["gpu"]["tensorrt"] == {
        "builder_optimization_level": 3,
        "max_workspace_size": 4 * 1024**3,
        "engine_cache": True,
        "timing_cache": True,
    }
    assert spacy_accelerate.is_optimized(loaded)
    proxy = spacy_accelerate.accelerated_components(loaded)["transformer"]
    assert proxy.session.config.gpu == gpu
    texts = ewt_texts[:8]
    assert disagreements(run(nlp, texts, 4), run(loaded, texts, 4), loaded) == []
