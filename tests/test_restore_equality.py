"""``restore()`` gives back the pipeline as it was (issue 62, item 2): after ``optimize()``
and ``restore()``, and after a load of a saved accelerated pipeline and ``restore()``, the
pipeline equals one never optimized: ``nlp.pipe`` and the other methods, every layer's
forward and attributes (the transformer's ``convert_inputs``, the listeners' mixes), every
shim's module, the config, torch's threads, the process's CPU budget, training and
bit-identical outputs."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import spacy
import torch
from annotations import last_hidden, run
from spacy.language import Language
from spacy.pipeline import TrainablePipe
from spacy.training import Example

import spacy_accelerate
from spacy_accelerate.cpu_budget import BUDGET


def _named(function: Any) -> str:
    """A function by its module and name (a wrapper by its class's): the same for two
    loads of one pipeline."""
    named = function if hasattr(function, "__qualname__") else type(function)
    return f"{named.__module__}.{named.__qualname__}"


def _state(nlp: Language) -> dict[str, Any]:
    """What a pipeline is, as far as ``optimize()`` ever changed it."""
    layers = [
        node
        for _, pipe in nlp.components
        if isinstance(pipe, TrainablePipe)
        for node in pipe.model.walk()
    ]
    return {
        "methods": sorted(name for name, value in vars(nlp).items() if callable(value)),
        "forwards": [_named(node._func) for node in layers],
        "attrs": [
            {key: _named(value) for key, value in node.attrs.items() if callable(value)}
            for node in layers
        ],
        "modules": [type(shim._model) for node in layers for shim in node.shims],
        "config": dict(nlp.config),  # its content (a saved and loaded one orders keys anew)
        "torch_threads": torch.get_num_threads(),
    }


def _outputs(nlp: Language, texts: list[str]) -> list[np.ndarray]:
    return [last_hidden(doc) for doc in run(nlp, texts, 8)]


def _assert_as_never_optimized(
    nlp: Language, never: dict[str, Any], expected: list[np.ndarray], texts: list[str]
) -> None:
    got = _state(nlp)
    for key, value in never.items():
        assert got[key] == value, key
    assert all(np.array_equal(a, b) for a, b in zip(_outputs(nlp, texts), expected, strict=True))
    # Training works (tags only: spacy-curated-transformers 0.3.1 fails with parser and
    # entity gold under numpy >= 2.4, accelerated or not; see test_lifecycle.py).
    optimizer = nlp.resume_training()
    doc = nlp.make_doc("Training works again .")
    example = Example.from_dict(doc, {"tags": ["NN", "VBZ", "RB", "."]})
    assert nlp.update([example], sgd=optimizer)["tagger"] > 0


@pytest.fixture()
def never_optimized(
    sample_path: Callable[[str], Path], ewt_texts: list[str]
) -> tuple[dict[str, Any], list[np.ndarray]]:
    nlp = spacy.load(sample_path("roberta"))
    return _state(nlp), _outputs(nlp, ewt_texts[:8])


def test_optimize_then_restore_is_a_never_optimized_pipeline(
    sample_path: Callable[[str], Path],
    cache_dir: Path,
    ewt_texts: list[str],
    never_optimized: tuple[dict[str, Any], list[np.ndarray]],
):
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    spacy_accelerate.restore(nlp)
    _assert_as_never_optimized(nlp, *never_optimized, ewt_texts[:8])


def test_a_loaded_accelerated_pipeline_restored_is_never_optimized(
    sample_path: Callable[[str], Path],
    cache_dir: Path,
    tmp_path: Path,
    ewt_texts: list[str],
    never_optimized: tuple[dict[str, Any], list[np.ndarray]],
):
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    nlp.to_disk(tmp_path / "saved")
    spacy_accelerate.restore(nlp)
    loaded = spacy.load(tmp_path / "saved")
    spacy_accelerate.restore(loaded)
    _assert_as_never_optimized(loaded, *never_optimized, ewt_texts[:8])


def test_the_cpu_budget_serves_only_while_a_pipeline_is_accelerated(
    sample_path: Callable[[str], Path], cache_dir: Path
):
    # BUDGET.serving (forked children run torch on one thread) counts the transformers
    # served: restore() takes its own back.
    gc.collect()  # pipelines of earlier tests gone: only this test's count changes
    before = BUDGET.served
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    assert BUDGET.served == before + 1 and BUDGET.serving
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)  # again: still one
    assert BUDGET.served == before + 1
    spacy_accelerate.restore(nlp)
    assert BUDGET.served == before and BUDGET.serving == (before > 0)
