"""Acceptance: the accelerated pipeline annotates real text exactly like PyTorch.

For each sample (tiny random RoBERTa, tiny random BERT, real MiniLM weights)
and batch sizes 1, 7 and 64, over 520 UD-EWT test sentences grouped into
documents that are longer than the span window: every doc's last hidden
state within 1e-4 of PyTorch's, every annotation identical.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import spacy
from annotations import (
    EDGE_TEXTS,
    disagreements,
    last_hidden,
    max_abs_diff,
    run,
    run_each,
    same_result,
)

import spacy_accelerate
from spacy_accelerate.pipeline.components import find_transformer_components
from spacy_accelerate.pipeline.shim import find_shim, find_span_settings

BATCH_SIZES = (1, 7, 64)
TOLERANCE = 1e-4


class Outcome:
    """PyTorch and accelerated docs for one sample, computed once per module."""

    def __init__(self, name: str, path: Path, texts: list[str], cache_dir: Path) -> None:
        self.nlp = spacy.load(path)
        component = find_transformer_components(self.nlp)[0]
        self.window = find_span_settings(component).window
        self.reference = {bs: run(self.nlp, texts, bs) for bs in BATCH_SIZES}
        self.edge_reference = run_each(self.nlp, EDGE_TEXTS)
        spacy_accelerate.optimize(self.nlp, provider="cpu", precision="fp32", cache_dir=cache_dir)
        self.accelerated = {bs: run(self.nlp, texts, bs) for bs in BATCH_SIZES}
        self.edge_accelerated = run_each(self.nlp, EDGE_TEXTS)
        self.shim = find_shim(component).shim
        self.cache_dir = cache_dir


@pytest.fixture(scope="module", params=["roberta", "bert", "minilm"])
def outcome(
    request: pytest.FixtureRequest,
    sample_path: Callable[[str], Path],
    ewt_texts: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Outcome:
    name = request.param
    return Outcome(name, sample_path(name), ewt_texts, tmp_path_factory.mktemp(f"cache-{name}"))


def test_the_text_is_real_and_longer_than_the_window(outcome: Outcome, ewt_texts: list[str]):
    assert sum(text.count(" ") + 1 for text in ewt_texts) > 6_000
    pieces = [last_hidden(doc).shape[0] for doc in outcome.reference[64]]
    assert len(pieces) == len(ewt_texts)
    assert sum(n > outcome.window for n in pieces) >= 10, (outcome.window, max(pieces))


def test_the_pipeline_runs_accelerated(outcome: Outcome):
    assert spacy_accelerate.is_optimized(outcome.nlp)
    assert type(outcome.shim._model).__name__ == "AcceleratedEncoder"


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
def test_hidden_states_match_pytorch(outcome: Outcome, batch_size: int):
    diff = max_abs_diff(outcome.reference[batch_size], outcome.accelerated[batch_size])
    assert diff <= TOLERANCE, diff


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
def test_annotations_identical(outcome: Outcome, batch_size: int):
    tokens = sum(len(doc) for doc in outcome.reference[batch_size])
    assert tokens > 6_000
    differing = disagreements(
        outcome.reference[batch_size], outcome.accelerated[batch_size], outcome.nlp
    )
    assert differing == [], f"{len(differing)} of {tokens} tokens differ: {differing[:5]}"


@pytest.mark.parametrize("index", range(len(EDGE_TEXTS)))
def test_edge_inputs_match_pytorch(outcome: Outcome, index: int):
    expected, actual = outcome.edge_reference[index], outcome.edge_accelerated[index]
    assert same_result(expected, actual), (EDGE_TEXTS[index][:20], expected, actual)


def test_edge_inputs_without_exceptions_where_pytorch_has_none(outcome: Outcome):
    reference = outcome.edge_reference
    failing = [EDGE_TEXTS[i] for i, r in enumerate(reference) if isinstance(r, Exception)]
    # Only the whitespace-only text fails, and it fails in PyTorch too (see run_each).
    assert failing in ([], ["   "])
    assert list(outcome.nlp.pipe([])) == []
    mixed = ["", "\U0001f600", "   ", "A short sentence."]
    assert [len(doc) for doc in outcome.nlp.pipe(mixed, batch_size=4)] == [0, 1, 1, 4]


def test_restore_is_bit_identical(outcome: Outcome, ewt_texts: list[str]):
    spacy_accelerate.restore(outcome.nlp)
    try:
        assert not spacy_accelerate.is_optimized(outcome.nlp)
        restored = run(outcome.nlp, ewt_texts[:40], 7)
        for before, after in zip(outcome.reference[7][:40], restored, strict=True):
            assert np.array_equal(last_hidden(before), last_hidden(after))
        assert disagreements(outcome.reference[7][:40], restored) == []
    finally:
        spacy_accelerate.optimize(outcome.nlp, provider="cpu", cache_dir=outcome.cache_dir)
