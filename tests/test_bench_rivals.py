"""What a PyTorch user would run instead (``spacy_accelerate.bench.baselines``): each rival
stands in the shim, annotates, and gives the PyTorch module back to the next variant."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
from annotations import annotations
from spacy.language import Language

import spacy_accelerate
from spacy_accelerate.bench.baselines import (
    RIVALS,
    Accelerated,
    DynamicQuantized,
    PyTorch,
    Rival,
    RivalModule,
    TorchCompiled,
)
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.shim import find_shim


def _module(nlp: Language) -> object:
    (component,) = transformer_components(nlp)
    return find_shim(component).module


@pytest.mark.parametrize("rival", [DynamicQuantized(), TorchCompiled()], ids=["int8", "compile"])
def test_a_rival_annotates_and_hands_the_module_back(
    rival: Rival, sample_path: Callable[[str], Path], cache_dir: Path, ewt_texts: list[str]
):
    nlp = spacy.load(sample_path("roberta"))
    original = _module(nlp)
    expected = [annotations(doc) for doc in nlp.pipe(ewt_texts[:6], batch_size=3)]
    rival.apply(nlp)
    stand_in = _module(nlp)
    assert isinstance(stand_in, RivalModule) and stand_in.inner is original
    docs = list(nlp.pipe(ewt_texts[:6], batch_size=3))
    assert [doc.text for doc in docs] == ewt_texts[:6]
    assert all(doc._.trf_data.last_hidden_layer_state.dataXd.size for doc in docs)
    Accelerated({"provider": "cpu", "precision": "fp32", "cache_dir": str(cache_dir)}).apply(nlp)
    assert spacy_accelerate.is_optimized(nlp)
    rival.apply(nlp)
    assert _module(nlp) is stand_in  # made once, kept: switching back costs nothing
    PyTorch().apply(nlp)
    assert _module(nlp) is original
    assert [annotations(doc) for doc in nlp.pipe(ewt_texts[:6], batch_size=3)] == expected


def test_the_rivals_are_what_a_pytorch_user_would_pick():
    kinds = {type(rival).__name__: rival for rival in RIVALS.values()}
    assert set(kinds) == {"TorchCompiled", "DynamicQuantized"}
    compiled = [r for r in RIVALS.values() if isinstance(r, TorchCompiled)]
    assert sorted(r.bf16 for r in compiled) == [False, True]
