"""The mixed-genre calibration sample (``data/calibration_sample.txt``): its size, its genres
sidecar, the README's per-genre counts, no EWT test text, and that the build script in
``benchmarks/build_calibration_sample.py`` reproduces it."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import spacy

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "spacy_accelerate" / "data"
SAMPLE = DATA / "calibration_sample.txt"
GENRES = DATA / "calibration_sample.genres"
README = DATA / "README.md"
SCRIPT = ROOT / "benchmarks" / "build_calibration_sample.py"

#: A README table row: | `genre` | source | documents | tokens |
README_ROW = re.compile(r"^\| `(\w+)` \| [^|]+ \| ([\d,]+) \| ([\d,]+) \|$", re.MULTILINE)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf8").split("\n")[:-1]  # one trailing newline


@pytest.fixture(scope="module")
def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_calibration_sample", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.fixture(scope="module")
def tokens_per_line() -> list[int]:
    tokenizer = spacy.blank("en").tokenizer
    return [len(tokenizer(line)) for line in _lines(SAMPLE)]


def test_sample_holds_8500_to_10000_tokens(tokens_per_line: list[int]):
    assert 8500 <= sum(tokens_per_line) <= 10000


def test_every_line_is_a_non_blank_document():
    text = SAMPLE.read_text(encoding="utf8")
    assert text.endswith("\n") and "\r" not in text
    for number, line in enumerate(_lines(SAMPLE), 1):
        assert line.strip(), f"line {number} is blank"
        assert line == line.strip(), f"line {number} has surrounding whitespace"


def test_genres_sidecar_is_aligned_and_mixed(tokens_per_line: list[int]):
    genres = _lines(GENRES)
    assert len(genres) == len(tokens_per_line)
    assert all(re.fullmatch(r"\w+", genre) for genre in genres)
    tokens: Counter[str] = Counter()
    for genre, count in zip(genres, tokens_per_line, strict=True):
        tokens[genre] += count
    assert len(tokens) >= 5
    total = sum(tokens.values())
    for genre, count in tokens.items():
        assert count <= 0.30 * total, f"{genre} holds {count / total:.0%} of the tokens"


def test_readme_lists_each_genres_documents_and_tokens(tokens_per_line: list[int]):
    genres = _lines(GENRES)
    tokens: Counter[str] = Counter()
    for genre, count in zip(genres, tokens_per_line, strict=True):
        tokens[genre] += count
    listed = {
        genre: (int(documents.replace(",", "")), int(count.replace(",", "")))
        for genre, documents, count in README_ROW.findall(README.read_text(encoding="utf8"))
    }
    assert listed == {genre: (genres.count(genre), tokens[genre]) for genre in tokens}


def test_no_ewt_test_sentence_is_in_the_sample(builder: ModuleType):
    """The EWT test split is the held-out evaluation (it is tracked in the repository's
    ``data/`` folder, so this runs everywhere)."""
    sample = " ".join(" ".join(line.split()) for line in _lines(SAMPLE))
    test_sentences = builder.ewt_test_sentences(builder.default_data_dir())
    assert len(test_sentences) > 1000
    assert [sentence for sentence in test_sentences if sentence in sample] == []


def test_build_script_reproduces_the_sample(builder: ModuleType):
    """The EWT genres are rebuilt exactly on any Python; the whole files (whose technical
    genre comes from this interpreter's ``pydoc_data``) on the CPython it was built with."""
    documents = builder.build()
    shipped = list(zip(_lines(GENRES), _lines(SAMPLE), strict=True))
    for genre in builder.EWT_GENRES:
        rebuilt = [document.text for document in documents if document.genre == genre]
        assert rebuilt == [text for name, text in shipped if name == genre], genre
    if sys.version_info[:3] == builder.BUILT_WITH_PYTHON:
        sample, genres = builder.render(documents)
        assert sample == SAMPLE.read_text(encoding="utf8")
        assert genres == GENRES.read_text(encoding="utf8")
