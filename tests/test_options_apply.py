"""An option the request would ignore is refused, naming it, the provider and precision
asked for and those that read it; a saved pipeline holding one warns and loads."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import spacy
from spacy.language import Language
from thinc.api import Config

import spacy_accelerate
from spacy_accelerate.backends import registry
from spacy_accelerate.errors import InvalidOptionError
from spacy_accelerate.options.applicability import RULES, served_pairs
from spacy_accelerate.options.config import Precision, Provider, check_supported
from spacy_accelerate.options.request import build_config

TEXTS = ["A calibration text like the ones you will process ."]

#: (provider, precision, option as given, the option as messages name it in Python's terms,
#: a phrase of where it applies)
IGNORED = [
    ("cpu", "fp32", {"min_agreement": 0.5}, "min_agreement", "'fp16', 'bf16', 'int8' or 'auto'"),
    ("cpu", "fp32", {"min_cosine": 0.99}, "min_cosine", "'fp16', 'bf16', 'int8' or 'auto'"),
    ("cpu", "fp32", {"calibration_texts": TEXTS}, "calibration_texts", "'fp16', 'bf16', 'int8'"),
    (
        "openvino",
        "fp32",
        {"calibration_texts": TEXTS},
        "calibration_texts",
        "'fp16', 'bf16', 'int8'",
    ),
    ("auto", "fp32", {"min_agreement": {"dep": 0.9}}, "min_agreement", "'fp16', 'bf16', 'int8'"),
    ("cuda", "fp32", {"min_cosine": 0.99}, "min_cosine", "'fp16', 'bf16', 'int8' or 'auto'"),
    ("cpu", "int8", {"tolerance": 1e-3}, "tolerance", "precision='fp32' or 'auto'"),
    ("openvino", "bf16", {"tolerance": 1e-3}, "tolerance", "precision='fp32' or 'auto'"),
    ("cuda", "fp16", {"tolerance": 1e-3}, "tolerance", "precision='fp32' or 'auto'"),
    ("cpu", "fp32", {"device_id": 1}, "device_id", "provider='cuda', 'tensorrt' or 'auto'"),
    ("openvino", "int8", {"device_id": 0}, "device_id", "provider='cuda', 'tensorrt'"),
    ("cpu", "int8", {"gpu": {"cuda_graph": True}}, "gpu", "provider='cuda', 'tensorrt'"),
    ("openvino", "auto", {"gpu": {"batch_buckets": [8]}}, "gpu", "provider='cuda'"),
    ("cpu", "fp32", {"fallback": True}, "fallback=True", "provider='cuda', 'tensorrt', 'openvino'"),
    ("cpu", "auto", {"fallback": True}, "fallback=True", "provider='cuda', 'tensorrt', 'openvino'"),
]


@pytest.mark.parametrize(("provider", "precision", "option", "keyword", "where"), IGNORED)
def test_an_option_the_request_ignores_is_refused_by_name(
    provider: str, precision: str, option: dict, keyword: str, where: str
) -> None:
    with pytest.raises(InvalidOptionError) as refused:
        build_config(provider, precision, **option)
    message = str(refused.value)
    assert message.startswith(f"{keyword} applies to ")
    assert where in message
    assert f"provider={provider!r} with precision={precision!r}" in message
    assert f"Drop {keyword}" in message


def test_the_message_says_what_is_checked_instead_and_what_to_ask_for() -> None:
    with pytest.raises(InvalidOptionError) as refused:
        build_config("cpu", "fp32", calibration_texts=TEXTS)
    assert str(refused.value) == (
        "calibration_texts applies to precision='fp16', 'bf16', 'int8' or 'auto' (they are "
        "judged on it); provider='cpu' with precision='fp32' is checked to tolerance instead "
        "(its parity with PyTorch). Drop calibration_texts, or ask for precision='int8' or "
        "'auto'."
    )
    with pytest.raises(InvalidOptionError, match=r"ask for precision='bf16', 'int8' or 'auto'"):
        build_config("openvino", "fp32", min_cosine=0.99)
    with pytest.raises(InvalidOptionError, match=r"ask for precision='fp32'\.$"):
        build_config("cpu", "int8", tolerance=1e-3)


def test_every_option_the_request_ignores_is_named_at_once() -> None:
    with pytest.raises(InvalidOptionError) as refused:
        build_config("cpu", "fp32", min_cosine=0.99, device_id=1, min_agreement=0.9)
    message = str(refused.value)
    for keyword in ("min_cosine", "min_agreement", "device_id"):
        assert f"{keyword} applies to" in message


def test_an_option_unknown_value_is_still_reported_as_such_first() -> None:
    with pytest.raises(InvalidOptionError, match=r"tolerance must be a number"):
        build_config("cpu", "int8", tolerance=5)
    # A pair this release does not serve says so, whatever the options.
    with pytest.raises(InvalidOptionError, match="not available in this release"):
        check_supported(Provider.CPU, Precision.FP16)
    build_config("cuda", "int8", fallback=True, tolerance=1e-3)  # refused later, as before


APPLIED = [
    ("cpu", "fp32", {"tolerance": 1e-3, "threads": 1, "warmup": False, "verify": False}),
    ("cpu", "int8", {"min_cosine": 0.99, "min_agreement": 0.9, "calibration_texts": TEXTS}),
    ("openvino", "bf16", {"min_cosine": 0.999, "min_agreement": {"tag": 0.99}}),
    ("openvino", "int8", {"calibration_texts": TEXTS, "fallback": True}),
    ("cuda", "fp16", {"device_id": 1, "gpu": {"cuda_graph": True}, "min_cosine": 0.999}),
    ("tensorrt", "fp32", {"device_id": 0, "gpu": {"batch_buckets": [8]}, "fallback": True}),
    # auto reads what any of its candidates reads.
    ("auto", "fp32", {"tolerance": 1e-3, "device_id": 0, "gpu": {"cuda_graph": True}}),
    ("auto", "int8", {"min_cosine": 0.99, "fallback": True, "tolerance": 1e-3}),
    ("cpu", "auto", {"tolerance": 1e-3, "min_agreement": 0.9, "calibration_texts": TEXTS}),
    ("auto", "auto", {"tolerance": 1e-3, "min_cosine": 0.99, "device_id": 1, "fallback": True}),
    # fallback: the CPU serves a precision it lacks as fp32, checked to tolerance=.
    ("cuda", "fp16", {"fallback": True, "tolerance": 1e-3}),
    ("openvino", "bf16", {"fallback": True, "tolerance": 1e-3}),
    ("tensorrt", "fp16", {"fallback": True, "min_agreement": 0.9}),
]


@pytest.mark.parametrize(("provider", "precision", "options"), APPLIED)
def test_options_a_plan_of_the_request_reads_are_accepted(
    provider: str, precision: str, options: dict
) -> None:
    build_config(provider, precision, **options)


def test_fallback_with_a_precision_the_fallback_serves_still_refuses_tolerance() -> None:
    # openvino int8 falls back to cpu int8: no plan is fp32.
    with pytest.raises(InvalidOptionError, match=r"and fallback=True is judged by min_cosine "):
        build_config("openvino", "int8", fallback=True, tolerance=1e-3)


def test_what_auto_may_serve_covers_what_the_registry_tries() -> None:
    # On any machine: the options and the registry read one provider table.
    config = build_config("auto", "auto", fallback=True)
    assert {tuple(pair) for pair in registry.precision_candidates(config)} <= served_pairs(
        Provider.AUTO, Precision.AUTO, True
    )


def test_every_rule_names_its_keyword_as_optimize_spells_it() -> None:
    import inspect

    parameters = inspect.signature(spacy_accelerate.optimize).parameters
    for rule in RULES:
        assert rule.option.option in parameters


# --------------------------------------------------------------------------- saved configs


def _saved_with(nlp: Language, folder: Path, **section: object) -> Path:
    """``nlp`` saved accelerated, its recorded options then edited as another machine or an
    earlier release could have left them."""
    nlp.to_disk(folder)
    config = Config().from_disk(folder / "config.cfg", interpolate=False)
    config["nlp"]["after_pipeline_creation"].update(section)
    config.to_disk(folder / "config.cfg")
    return folder


def test_a_saved_pipeline_with_an_option_that_does_not_apply_warns_and_loads(
    roberta: Language, cache_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir, warmup=False)
    saved = _saved_with(roberta, tmp_path / "saved", min_cosine=0.99, min_agreement=0.9)
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        loaded = spacy.load(saved)
    assert spacy_accelerate.is_optimized(loaded)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("min_cosine applies to precision='fp16'" in w for w in warnings), warnings
    assert any("min_agreement applies to precision='fp16'" in w for w in warnings), warnings
    assert all("is ignored" in w for w in warnings if "applies to" in w)
    (proxy,) = spacy_accelerate.accelerated_components(loaded).values()
    assert proxy.session.config.precision is Precision.FP32


def test_a_load_time_override_that_does_not_apply_warns_and_loads(
    roberta: Language, cache_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir, warmup=False)
    roberta.to_disk(tmp_path / "saved")
    override = {"nlp": {"after_pipeline_creation": {"device_id": 1, "fallback": True}}}
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        loaded = spacy.load(tmp_path / "saved", config=override)
    assert spacy_accelerate.is_optimized(loaded)
    assert "device_id applies to provider='cuda'" in caplog.text
    assert "fallback=True applies to provider" in caplog.text


def test_a_saved_pipeline_with_default_gpu_options_loads_without_a_warning(
    roberta: Language, cache_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The record holds device_id=0 and the GPU defaults even for the CPU: not given.
    spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir, warmup=False)
    section = roberta.config["nlp"]["after_pipeline_creation"]
    assert section["device_id"] == 0 and section["gpu"] is not None
    roberta.to_disk(tmp_path / "saved")
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        loaded = spacy.load(tmp_path / "saved")
    assert spacy_accelerate.is_optimized(loaded)
    assert "applies to" not in caplog.text


def test_optimize_refuses_before_touching_the_pipeline(roberta: Language, cache_dir: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r"^min_agreement applies to"):
        spacy_accelerate.optimize(roberta, "cpu", "fp32", cache_dir=cache_dir, min_agreement=0.5)
    assert not spacy_accelerate.is_optimized(roberta)
    assert not cache_dir.exists() or not any(cache_dir.iterdir())
