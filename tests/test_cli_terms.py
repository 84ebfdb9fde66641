"""The library's messages reach command-line users in flag terms (``--precision int8``,
not ``precision='int8'``): :func:`spacy_accelerate.cli.terms.cli_terms` on real messages."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
import typer.main

from spacy_accelerate.cli import app
from spacy_accelerate.cli.terms import FLAGS, cli_terms
from spacy_accelerate.errors import InvalidOptionError
from spacy_accelerate.options.config import Precision, Provider, check_supported
from spacy_accelerate.options.request import OptimizeOptions, build_config


def _message(**options: Any) -> str:
    with pytest.raises(InvalidOptionError) as raised:
        build_config(**options)
    return str(raised.value)


def _optimize_flags() -> set[str]:
    command = typer.main.get_command(app).commands["optimize"]  # type: ignore[attr-defined]
    return {opt for parameter in command.params for opt in parameter.opts}


def test_every_option_the_command_line_sets_has_its_flag():
    """Each ``optimize()`` keyword with a flag is in the table, with a flag that exists."""
    flags = _optimize_flags()
    cli_named = {f.name for f in fields(OptimizeOptions)} - {"gpu"}  # gpu: Python/config only
    assert set(FLAGS) == cli_named
    assert set(FLAGS.values()) <= flags, set(FLAGS.values()) - flags


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"min_cosine": 2.0}, "--min-cosine must be a number in (0, 1]"),
        ({"tolerance": 2.0}, "--tolerance must be a number between 0 and 1"),
        ({"threads": 0}, "--threads must be a positive integer"),
        ({"lock_timeout": -1.0}, "--lock-timeout must be a number of seconds"),
        ({"min_agreement": {"deps": 0.9}}, "--min-agreement has no annotation 'deps'"),
        ({"min_agreement": {"dep": 2}}, "--min-agreement for 'dep' must be a number"),
        ({"missing_cache": "never"}, "Unknown --missing-cache 'never'"),
        ({"calibration_texts": [" "]}, "--calibration-file must be a non-empty list"),
        ({"provider": "cuda", "device_id": -1}, "--device-id must be a CUDA device index"),
    ],
)
def test_option_errors_name_the_flag(options: dict[str, Any], expected: str):
    message = _message(**options)
    rewritten = cli_terms(message)
    assert expected in rewritten, rewritten
    for keyword in FLAGS:
        assert f"{keyword}=" not in rewritten and not rewritten.startswith(keyword), rewritten


def test_an_unsupported_pair_names_both_flags():
    with pytest.raises(InvalidOptionError) as raised:
        check_supported(Provider.CPU, Precision.BF16)
    rewritten = cli_terms(str(raised.value))
    assert rewritten.startswith("--provider cpu with --precision bf16 is not available")
    assert "Supported: --provider cpu with --precision fp32" in rewritten
    assert "provider=" not in rewritten and "precision=" not in rewritten


@pytest.mark.parametrize(
    ("message", "expected", "gone"),
    [
        (  # backends/registry.py, a GPU provider on a machine without CUDA
            "provider='cuda' runs on torch CUDA tensors, but no GPU. Install a CUDA build of "
            "torch, or pass fallback=True to optimize().",
            "--provider cuda runs on torch CUDA tensors, but no GPU. Install a CUDA build of "
            "torch, or pass --fallback.",
            "optimize()",
        ),
        (  # pipeline/judging.py, the agreement gate's refusal
            "The pipeline's dep agreement 0.9 < 0.97, so this plan was not served and the "
            "pipeline is unchanged. Use precision='fp32' (or 'auto', the fastest plan that "
            "passes), calibrate on texts like yours (calibration_texts=...), or lower "
            "min_agreement for that annotation (min_agreement={...: bound}) if this is enough "
            "for you.",
            "Use --precision fp32 (or 'auto', the fastest plan that passes), calibrate on "
            "texts like yours (--calibration-file FILE), or lower --min-agreement for that "
            "annotation (--min-agreement ANNOTATION=BOUND)",
            "calibration_texts",
        ),
        (  # pipeline/judging.py, too few calibration tokens
            "calibration_texts hold 12 tokens; a lossy plan's calibration needs at least "
            "1000. Pass more texts, or leave calibration_texts out to use the built-in sample.",
            "--calibration-file hold 12 tokens; a lossy plan's calibration needs at least "
            "1000. Pass more texts, or leave --calibration-file out",
            "calibration_texts",
        ),
        (  # the spacy.load config path stays a config path
            "Give the texts again when loading: spacy.load(path, config={'nlp.after_pipeline_"
            "creation.calibration_texts': [...]}), or optimize(nlp, ..., calibration_texts="
            "[...]) with the precision you asked for",
            "'nlp.after_pipeline_creation.calibration_texts': [...]}), or --calibration-file "
            "FILE with the precision you asked for",
            "optimize(",
        ),
        (  # verify/parity.py: "tolerance" as a plain word is left alone
            "largest absolute difference 0.3 > tolerance 0.0001 on a padded batch. Use "
            "precision='fp32', or lower min_cosine if this accuracy is enough for you.",
            "> tolerance 0.0001 on a padded batch. Use --precision fp32, or lower --min-cosine",
            "min_cosine",
        ),
        (  # cache/store.py
            "cannot create or write the model cache folder /x (Permission denied); set "
            "cache_dir= or the SPACY_ACCELERATE_CACHE environment variable to a writable folder",
            "set --cache-dir or the SPACY_ACCELERATE_CACHE environment variable",
            "cache_dir",
        ),
        (  # backends/openvino/session.py
            "precision='bf16' needs a CPU with bf16 arithmetic (AVX512_BF16 or AMX-BF16), "
            "which this CPU does not have. Use precision='fp32' (or 'int8'), or pass "
            "fallback=True to be served fp32 by ONNX Runtime here.",
            "--precision bf16 needs a CPU with bf16 arithmetic (AVX512_BF16 or AMX-BF16), "
            "which this CPU does not have. Use --precision fp32 (or 'int8'), or pass "
            "--fallback to be served fp32",
            "fallback=",
        ),
        (  # errors.py / pipeline/proxy.py
            "its model is not cached here and missing_cache='pytorch', so it is not exported",
            "its model is not cached here and --missing-cache pytorch, so it is not exported",
            "missing_cache",
        ),
        (
            "checked with warmup=False and verify=False",
            "checked with --no-warmup and --no-verify",
            "=False",
        ),
    ],
)
def test_library_messages_read_in_flags(message: str, expected: str, gone: str):
    rewritten = cli_terms(message)
    assert expected in rewritten, rewritten
    assert gone not in rewritten.replace("nlp.after_pipeline_creation.calibration_texts", "")


def test_a_message_without_keywords_is_unchanged():
    message = "Unknown precision 'fp8'. Valid values: 'auto', 'fp32'. See --help."
    assert cli_terms(message) == message
