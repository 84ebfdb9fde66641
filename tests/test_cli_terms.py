"""The library's messages reach command-line users in flag terms (``--precision int8``,
not ``precision='int8'``): the command line spells each error's advice
(:class:`~spacy_accelerate.errors.Advice`) with :mod:`spacy_accelerate.cli.terms`, from
the same parts ``str(error)`` spells in Python's terms."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from spacy_accelerate.cli import app
from spacy_accelerate.cli.terms import COMMAND_LINE, cli_message, flag_of
from spacy_accelerate.errors import PYTHON, UNSET, Advice, InvalidOptionError, OneOf
from spacy_accelerate.options.request import OptimizeOptions


def _optimize_flags() -> set[str]:
    command = typer.main.get_command(app).commands["optimize"]  # type: ignore[attr-defined]
    return {opt for parameter in command.params for opt in parameter.opts}


@pytest.mark.parametrize("option", [f.name for f in fields(OptimizeOptions)])
def test_every_option_is_spelled_as_a_flag_the_command_line_has(option: str):
    flag = flag_of(option)
    if flag is None:  # given in Python or the saved config only: its Python spelling
        assert COMMAND_LINE.spell(Advice(option, 1)) == f"{option}=1"
        return
    assert flag in _optimize_flags()
    assert COMMAND_LINE.spell(Advice(option)) == flag


@pytest.mark.parametrize(
    ("advice", "spelled"),
    [
        (Advice("precision", "bf16"), "--precision bf16"),
        (Advice("fallback", True), "--fallback"),
        (Advice("warmup", False), "--no-warmup"),
        (Advice("calibration_texts", ...), "--calibration-file FILE"),
        (Advice("min_agreement", ...), "--min-agreement ANNOTATION=BOUND"),
        (Advice("min_agreement", item="dep"), "--min-agreement dep=BOUND"),
        (Advice("cache_dir", UNSET), "--cache-dir"),
        (Advice("lock_timeout", 0), "--lock-timeout 0"),
        (Advice("precision", OneOf(("fp32", "auto"))), "--precision fp32 or auto"),
        (
            Advice("provider", OneOf(("cuda", "tensorrt", "auto"))),
            "--provider cuda, tensorrt or auto",
        ),
    ],
)
def test_each_form_of_advice_as_a_flag(advice: Advice, spelled: str):
    assert COMMAND_LINE.spell(advice) == spelled


def test_other_errors_are_shown_as_they_are():
    assert cli_message(ValueError("precision='x' from elsewhere")) == "precision='x' from elsewhere"
    error = InvalidOptionError("Use ", Advice("precision", "fp32"), ".")
    assert (str(error), cli_message(error)) == ("Use precision='fp32'.", "Use --precision fp32.")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--provider", "cpu", "--precision", "bf16"], "--provider cpu with --precision bf16 is"),
        (["--precision", "fp8"], "Unknown --precision 'fp8'"),
        (["--min-agreement", "0.9"], "--min-agreement applies to --precision fp16"),
        (["--precision", "int8", "--min-agreement", "deps=0.9"], "--min-agreement has no"),
        (["--provider", "cpu", "--fallback"], "Drop --fallback."),
    ],
)
def test_optimize_refuses_in_flag_terms(args: list[str], expected: str, bert_path: Path):
    result = CliRunner().invoke(app, ["optimize", str(bert_path), *args])
    assert result.exit_code == 1, result.output
    error = result.output.strip().splitlines()[-1]
    assert error.startswith("Error: ") and expected in error, error
    assert "=" not in error.replace("=BOUND", "").split(" (see")[0] or "deps=" in error, error


def test_several_values_are_one_advice_in_either_spelling():
    advice = Advice("precision", OneOf(("fp16", "bf16", "int8")))
    assert PYTHON.spell(advice) == "precision='fp16', 'bf16' or 'int8'"
    assert COMMAND_LINE.spell(advice) == "--precision fp16, bf16 or int8"
