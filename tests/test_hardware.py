"""Every hardware-dependent decision, on each kind of CPU, whatever CPU runs the suite.

The decisions all read :func:`spacy_accelerate.cpu_features.cpu_features`; here each is
checked on simulated CPUs (an Intel Xeon with AMX among them) and, on this machine, against
what that same detection says this CPU is.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
from cpus import AMX_XEON, ARM, AVX2_EPYC, AVX512_EPYC, SIMULATED

from spacy_accelerate import PrecisionUnavailableError
from spacy_accelerate.backends import registry as providers
from spacy_accelerate.backends.onnxruntime.int8_recipe import recipe_for
from spacy_accelerate.backends.openvino import session as openvino_runtime
from spacy_accelerate.cpu_features import CpuFeatures, cpu_features, simulated
from spacy_accelerate.options.config import Precision, Provider
from spacy_accelerate.options.providers import PROVIDERS
from spacy_accelerate.options.request import build_config

#: What each simulated CPU must get: bf16 hint for int8's float layers, the hints dynamic
#: int8 is tried in, whether a bf16 hint quantizes activations at run time, what an int8
#: plan must beat, 7-bit ONNX Runtime weights, auto's first CPU provider at int8.
EXPECTED = {
    "amx-xeon": (("bf16", "f32"), ("f32",), False, "bf16", False, Provider.OPENVINO),
    "avx512-epyc": (("bf16", "f32"), ("f32",), False, "bf16", False, Provider.CPU),
    "avx2-epyc": (("f32",), (), False, "fp32", True, Provider.CPU),
    "arm": (("f32",), (), False, "fp32", False, Provider.CPU),
}


def _key_recipe() -> dict:
    """The int8 recipe the CPU provider's cache key records (what the model is made with)."""
    return providers.backend_for(Provider.CPU).key_options(build_config("cpu", "int8"))["int8"]


def _decisions() -> tuple:
    return (
        openvino_runtime.float_part_hints(),
        openvino_runtime.dynamic_int8_hints(128),
        openvino_runtime.dynamic_quantization_runs("bf16", 128),
        openvino_runtime.speed_baseline(),
        _key_recipe()["reduce_range"],
        next(p for p in providers.auto_order(Precision.INT8) if not PROVIDERS.on_gpu(p)),
    )


@pytest.mark.parametrize("name", list(SIMULATED))
def test_each_cpu_gets_its_own_decisions(name: str):
    with simulated(SIMULATED[name]):
        assert _decisions() == EXPECTED[name]
        bf16 = SIMULATED[name].bf16
        if bf16:
            openvino_runtime.check_precision(Precision.BF16)
        else:
            with pytest.raises(PrecisionUnavailableError, match="AVX512_BF16 or AMX-BF16"):
                openvino_runtime.check_precision(Precision.BF16)
        key = openvino_runtime.openvino_key(Precision.INT8)
        assert key["int8_float_layers"] == ("bf16" if bf16 else "f32")
        assert key["cpu_kernels"] == sorted(SIMULATED[name].flags & openvino_runtime.KERNEL_FLAGS)
        assert f"faster than {EXPECTED[name][3]}" in key["int8_plans"]


def test_the_amx_branch_of_every_decision_is_exercised_here():
    # The AMX Xeon's answers differ from this CPU's wherever the hardware differs: each of
    # its branches runs in this suite whatever the machine.
    with simulated(AMX_XEON):
        assert cpu_features() is AMX_XEON and AMX_XEON.amx and AMX_XEON.bf16
        assert openvino_runtime.dynamic_quantization_runs("f32", 128)
        assert not openvino_runtime.dynamic_quantization_runs("bf16", 128)  # bf16 input
        assert not openvino_runtime.dynamic_quantization_runs("f32", 24)  # not a multiple of 16
        assert not openvino_runtime.dynamic_quantization_runs("f32", 0)
        assert openvino_runtime.precision_hint(Precision.INT8) == "bf16"
    assert cpu_features() is not AMX_XEON  # the simulation ends with its block


def test_this_cpu_gets_what_its_detection_says():
    here = cpu_features()
    expected_hints = ("bf16", "f32") if here.bf16 else ("f32",)
    assert openvino_runtime.float_part_hints() == expected_hints
    runs = here.x86 and here.vnni
    assert openvino_runtime.dynamic_int8_hints(128) == (("f32",) if runs else ())
    assert openvino_runtime.speed_baseline() == ("bf16" if here.bf16 else "fp32")
    assert _key_recipe() == asdict(recipe_for(here))
    assert here.bf16 == ("BF16" in openvino_runtime.cpu_capabilities())


@pytest.mark.parametrize(
    ("flags", "vnni"),
    [
        ({"avx2", "avx_vnni"}, True),
        ({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}, True),
        ({"avx512f", "avx512_vnni"}, False),  # AVX-512 VNNI without avx512_core
        ({"avx2"}, False),
    ],
)
def test_vnni_is_what_onednn_counts(flags: set[str], vnni: bool):
    assert CpuFeatures("GenuineIntel", frozenset(flags), "x86_64").vnni is vnni


def test_a_simulated_cpu_reaches_auto(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(providers, "torch_cuda_problem", lambda: "no GPU in this test")
    with simulated(AMX_XEON):
        assert providers.check_provider(build_config("auto", "bf16")).provider is Provider.OPENVINO
    for cpu in (AVX2_EPYC, ARM):
        with simulated(cpu), pytest.raises(PrecisionUnavailableError):
            providers.check_provider(build_config("openvino", "bf16"))
    with simulated(AVX512_EPYC):
        assert providers.check_provider(build_config("auto", "int8")).provider is Provider.CPU
