"""Property: any Unicode document is annotated as PyTorch fp32 annotates it.

Control characters, NUL, right-to-left text and marks, combining marks, emoji, very long
tokens and runs of whitespace: whatever spaCy's tokenizer and the piece encoder make of
them, the accelerated pipeline must give the same annotations as the PyTorch one (or fail
the same way where PyTorch fails).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
from annotations import run_each, same_result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spacy.language import Language

import spacy_accelerate

#: Pieces hypothesis combines with arbitrary characters, each a known trouble-maker.
TROUBLE = [
    "\x00",
    "\x07\x1b[31m",
    "\u200b\u200c\u200d",  # zero-width
    "\u202e\u2066\u200f",  # right-to-left override, isolate, mark
    "שלום עולם",
    "مرحبا بالعالم",
    "e\u0301\u0308\u0327",  # combining marks
    "👩\u200d👩\u200d👧\u200d👦🏳️\u200d🌈",
    "x" * 400,  # a token far longer than a span window
    " \t\n\r\u00a0\u3000  \n\n",
    "\ufffd\ufeff",
    "Zürich, 東京 and Mumbai.",
]

documents = st.lists(
    st.one_of(
        st.text(st.characters(codec="utf-8"), max_size=40),
        st.sampled_from(TROUBLE),
        st.text(alphabet=" \t\n", min_size=1, max_size=30),
    ),
    min_size=1,
    max_size=6,
).map("".join)


@pytest.fixture(scope="module")
def pipelines(
    sample_path: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Language, Language]:
    path = sample_path("roberta")
    accelerated = spacy.load(path)
    cache = tmp_path_factory.mktemp("unicode-cache")
    spacy_accelerate.optimize(accelerated, "cpu", "fp32", cache_dir=cache)
    return spacy.load(path), accelerated


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same documents on every run: a failure is reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=documents)
def test_any_unicode_document_is_annotated_as_pytorch_annotates_it(
    pipelines: tuple[Language, Language], text: str
):
    pytorch, accelerated = pipelines
    (expected,) = run_each(pytorch, [text])
    (actual,) = run_each(accelerated, [text])
    assert same_result(expected, actual), (text, expected, actual)
