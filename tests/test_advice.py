"""A message names ``optimize()``'s options as data (:class:`~spacy_accelerate.errors.Advice`),
so that each interface spells them in its own terms: ``str(error)`` in Python's
(``precision='bf16'``), the command line in its flags (``--precision bf16``), from the same
parts. Every error class carries its parts (across processes too), no message of the
library writes an option in Python's keyword form as text, and real messages read right
both ways."""

from __future__ import annotations

import ast
import pickle
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from source_scan import docstring_ids

import spacy_accelerate.errors
from spacy_accelerate.cli.terms import COMMAND_LINE
from spacy_accelerate.errors import (
    PYTHON,
    Advice,
    AgreementError,
    CacheMissError,
    InvalidOptionError,
    OneOf,
    OutpacedError,
    SpacyAccelerateError,
    joined,
    spelled,
)
from spacy_accelerate.options.config import Precision, Provider, check_supported
from spacy_accelerate.options.request import OptimizeOptions, build_config
from spacy_accelerate.provision import refusals

SOURCE = Path(spacy_accelerate.errors.__file__).parent

#: ``optimize()``'s keyword options, as a message may name them.
OPTIONS = tuple(option.name for option in fields(OptimizeOptions))

#: An option in Python's keyword form: ``precision=``, ``min_agreement['`` (not a config
#: path such as ``after_pipeline_creation.calibration_texts``, nor a ``--flag``).
KEYWORD = re.compile(rf"(?<![\w.-])({'|'.join(OPTIONS)})(=|\[['\"])")
#: An option whose name is no English word, named bare.
BARE = re.compile(rf"(?<![\w.-])({'|'.join(name for name in OPTIONS if '_' in name)})\b")


#: The command line's terms: each option as its flag.
FLAGS_LIKE = COMMAND_LINE

#: Parts every error class is built with.
PARTS = (
    "Not served here. Use ",
    Advice("precision", "bf16"),
    ", pass ",
    Advice("fallback", True),
    ", or calibrate on texts like yours (",
    Advice("calibration_texts", ...),
    ").",
)
IN_PYTHON = "Use precision='bf16', pass fallback=True, or calibrate on texts like yours "
IN_PYTHON += "(calibration_texts=...)."
IN_FLAGS = "Use --precision bf16, pass --fallback, or calibrate on texts like yours "
IN_FLAGS += "(--calibration-file FILE)."


def _every_error_class() -> list[type[SpacyAccelerateError]]:
    found: list[type[SpacyAccelerateError]] = []
    waiting: list[type[SpacyAccelerateError]] = [SpacyAccelerateError]
    while waiting:
        kind = waiting.pop()
        if kind.__module__.startswith("spacy_accelerate") and kind not in found:
            found.append(kind)
        waiting.extend(kind.__subclasses__())
    return sorted(found, key=lambda kind: kind.__name__)


ERROR_CLASSES = _every_error_class()


def _made(kind: type[SpacyAccelerateError]) -> SpacyAccelerateError:
    if issubclass(kind, AgreementError):
        return kind(*PARTS, finding=("dep agree on 97.00%",))
    if issubclass(kind, OutpacedError):
        return kind(*PARTS, resume=("resumed", 3))
    return kind(*PARTS)


def test_the_walk_finds_every_error_class_of_the_library():
    defined = {
        value
        for value in vars(spacy_accelerate.errors).values()
        if isinstance(value, type) and issubclass(value, SpacyAccelerateError)
    }
    assert defined <= set(ERROR_CLASSES)
    assert len(ERROR_CLASSES) >= 17


@pytest.mark.parametrize("kind", [k for k in ERROR_CLASSES if k is not CacheMissError])
def test_every_error_spells_its_advice_in_each_interfaces_terms(kind):
    error = _made(kind)
    assert str(error) == "Not served here. " + IN_PYTHON
    assert error.spelled(PYTHON) == str(error)
    assert error.spelled(FLAGS_LIKE) == "Not served here. " + IN_FLAGS
    assert not KEYWORD.search(error.spelled(FLAGS_LIKE))
    assert error.parts == PARTS


@pytest.mark.parametrize("kind", ERROR_CLASSES)
def test_every_error_travels_between_processes_with_its_parts(kind):
    error = CacheMissError("0123456789abcdef" * 4) if kind is CacheMissError else _made(kind)
    error.note = "an attribute set later"  # type: ignore[attr-defined]
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is kind
    assert copy.parts == error.parts
    assert str(copy) == str(error)
    assert copy.spelled(FLAGS_LIKE) == error.spelled(FLAGS_LIKE)
    assert copy.__dict__ == error.__dict__  # finding, resume, key, and the rest


def test_a_cache_miss_advises_its_own_option():
    error = CacheMissError("0123456789abcdef" * 4)
    assert "saved with missing_cache='pytorch', so" in str(error)
    assert "saved with --missing-cache pytorch, so" in error.spelled(FLAGS_LIKE)
    assert error.key == "0123456789abcdef" * 4


def test_an_error_among_the_parts_is_spelled_in_the_same_terms():
    inner = InvalidOptionError("pass ", Advice("fallback", False))
    outer = AgreementError(
        "refused (", inner, "); lower ", Advice("min_agreement", item="dep"), finding=("x",)
    )
    assert str(outer) == "refused (pass fallback=False); lower min_agreement['dep']"
    assert (
        outer.spelled(FLAGS_LIKE) == "refused (pass --no-fallback); lower --min-agreement dep=BOUND"
    )
    said = joined([("a ", Advice("threads")), (Advice("tolerance", 0.1),)], "; ")
    assert spelled(said) == "a threads; tolerance=0.1"
    assert spelled(said, FLAGS_LIKE) == "a --threads; --tolerance 0.1"


def test_a_stored_refusal_keeps_its_advice_as_data():
    # A warm start raises the refusal its cache entry holds: in the caller's terms too.
    finding = ("dep below ", Advice("min_agreement", item="dep"), "; use ")
    finding += (Advice("precision", OneOf(("fp32", "auto"))),)
    nested = AgreementError("the gate (", InvalidOptionError(*PARTS), ")", finding=finding)
    kept = refusals._parts_from_json(refusals._parts_as_json(nested.finding))
    assert kept is not None and spelled(kept, FLAGS_LIKE) == spelled(finding, FLAGS_LIKE)
    assert (
        spelled(kept, FLAGS_LIKE)
        == "dep below --min-agreement dep=BOUND; use --precision fp32 or auto"
    )
    stored = refusals._parts_as_json(nested.parts)
    assert stored is not None
    read = refusals._parts_from_json(stored)
    assert read is not None
    assert spelled(read) == str(nested)
    assert spelled(read, FLAGS_LIKE) == nested.spelled(FLAGS_LIKE)
    assert refusals._parts_from_json(None) is None  # an entry of an earlier release
    assert refusals._parts_from_json([1]) is None


# ---------------------------------------------------------------------------- the sources


def keyword_mentions(source: str) -> list[tuple[int, str]]:
    """Each string literal of ``source`` (docstrings aside; f-strings' text too) that names
    an option of ``optimize()`` in Python's keyword form, with its line."""
    tree = ast.parse(source)
    docstrings = docstring_ids(tree)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and KEYWORD.search(node.value)
    )


def test_the_scan_finds_a_keyword_written_as_text():
    source = '''
def check(value: object) -> None:
    """A docstring may say ``precision='bf16'``."""
    if value:
        raise ValueError(f"use precision='bf16' or pass fallback=True, got {value!r}")
    raise ValueError("lower min_agreement['dep'] or set config.calibration_texts=...")
'''
    found = keyword_mentions(source)
    assert [line for line, _ in found] == [5, 6]
    assert "precision='bf16'" in found[0][1]
    assert keyword_mentions('x = "--precision bf16, nlp.after_pipeline_creation.gpu=1"') == []


def test_no_message_of_the_library_names_an_option_as_python_text():
    """Every option a message names is an Advice, spelled by whoever shows the message."""
    mentions = {
        f"{path.relative_to(SOURCE)}:{line}": text
        for path in sorted(SOURCE.rglob("*.py"))
        if "cli" not in path.relative_to(SOURCE).parts
        for line, text in keyword_mentions(path.read_text(encoding="utf8"))
    }
    assert not mentions, mentions


# ---------------------------------------------------------------------- real messages


def _refusal(*args: Any, **options: Any) -> InvalidOptionError:
    with pytest.raises(InvalidOptionError) as refused:
        build_config(*args, **options)
    return refused.value


def _reads_right_in_flags(error: SpacyAccelerateError) -> str:
    in_flags = error.spelled(FLAGS_LIKE)
    assert not KEYWORD.search(in_flags), in_flags
    assert not BARE.search(in_flags), in_flags
    assert "optimize(" not in in_flags, in_flags
    return in_flags


def test_an_unsupported_pair_reads_right_both_ways():
    with pytest.raises(InvalidOptionError) as refused:
        check_supported(Provider.CPU, Precision.BF16)
    error = refused.value
    assert str(error).startswith("provider='cpu' with precision='bf16' is not available")
    assert "Supported: provider='cpu' with precision='fp32', " in str(error)
    in_flags = _reads_right_in_flags(error)
    assert in_flags.startswith("--provider cpu with --precision bf16 is not available")
    assert "Supported: --provider cpu with --precision fp32, " in in_flags


def test_an_option_the_request_ignores_reads_right_both_ways():
    error = _refusal("cpu", "fp32", min_agreement=0.9)
    assert str(error) == (
        "min_agreement applies to precision='fp16', 'bf16', 'int8' or 'auto' (a lossy plan's "
        "annotations of the calibration texts are judged on it); provider='cpu' with "
        "precision='fp32' is checked to tolerance instead (its parity with PyTorch). Drop "
        "min_agreement, or ask for precision='int8' or 'auto'."
    )
    assert _reads_right_in_flags(error) == (
        "--min-agreement applies to --precision fp16, bf16, int8 or auto (a lossy "
        "plan's annotations of the calibration texts are judged on it); --provider cpu with "
        "--precision fp32 is checked to --tolerance instead (its parity with PyTorch). Drop "
        "--min-agreement, or ask for --precision int8 or auto."
    )
    several = _refusal("cpu", "fp32", device_id=1, fallback=True)
    assert "Drop device_id, or ask for provider='cuda' or 'tensorrt'. fallback=True" in str(several)
    assert "Drop --device-id, or ask for --provider cuda or tensorrt. --fallback applies" in (
        _reads_right_in_flags(several)
    )


@pytest.mark.parametrize(
    ("options", "in_python", "in_flags"),
    [
        ({"threads": 0}, "threads must be a positive integer", "--threads must be"),
        ({"tolerance": 2.0}, "tolerance must be a number between", "--tolerance must be"),
        ({"min_cosine": 2.0}, "min_cosine must be a number in (0, 1]", "--min-cosine must"),
        ({"lock_timeout": -1.0}, "lock_timeout must be a number", "--lock-timeout must"),
        ({"min_agreement": {"deps": 0.9}}, "min_agreement has no annotation 'deps'", None),
        ({"min_agreement": {"dep": 2}}, "min_agreement['dep'] must be", "--min-agreement dep="),
        ({"missing_cache": "never"}, "Unknown missing_cache 'never'", "Unknown --missing-cache"),
        ({"precision": "fp8"}, "Unknown precision 'fp8'", "Unknown --precision 'fp8'"),
        ({"calibration_texts": [" "]}, "calibration_texts must be", "--calibration-file must"),
        ({"provider": "cuda", "device_id": -1}, "device_id must be a CUDA", "--device-id must"),
        (
            {"provider": "tensorrt", "gpu": {"cuda_graph": True}},
            "not available with provider='tensorrt': ",
            "not available with --provider tensorrt: ",
        ),
    ],
)
def test_an_invalid_option_reads_right_both_ways(options, in_python, in_flags):
    error = _refusal(**options)
    assert in_python in str(error)
    assert (in_flags or "--min-agreement has no annotation") in _reads_right_in_flags(error)
