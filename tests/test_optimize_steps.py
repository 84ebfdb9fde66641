"""``optimize()`` finds the transformers of a pipeline once for steps 1-9 and once for steps
10-12, and passes them on: no step walks the pipeline for them again (issue 62)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from spacy.language import Language

import spacy_accelerate
from spacy_accelerate.pipeline import components


def _count_walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every walk of a pipeline for its transformers from here on, by the calling function."""
    walks: list[str] = []
    original = components.transformer_components

    def counted(nlp: Language) -> list[components.TransformerComponent]:
        walks.append(sys._getframe(1).f_code.co_name)
        return original(nlp)

    for name, module in list(sys.modules.items()):
        if name.startswith("spacy_accelerate") and (
            getattr(module, "transformer_components", None) is original
        ):
            monkeypatch.setattr(module, "transformer_components", counted)
    return walks


def test_optimize_walks_the_pipeline_for_its_transformers_twice(
    bert: Language, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks = _count_walks(monkeypatch)
    spacy_accelerate.optimize(bert, "cpu", "fp32", cache_dir=cache_dir, overlap=False)
    # Step 1 (find and validate), and once the transformers are served (steps 10-12).
    assert walks == ["find_transformer_components", "served_transformers"]


def test_a_walk_is_counted(bert: Language, monkeypatch: pytest.MonkeyPatch) -> None:
    walks = _count_walks(monkeypatch)
    assert not spacy_accelerate.is_optimized(bert)
    assert walks == ["is_optimized"]
