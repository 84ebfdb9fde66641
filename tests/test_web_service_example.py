"""``examples/web_service.py`` serves a saved accelerated pipeline as ``nlp(text)`` does."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import spacy
from starlette.testclient import TestClient

import spacy_accelerate

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "web_service.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("web_service_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_web_service_answers_as_the_saved_pipeline_does(
    sample_path: Callable[[str], Path],
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ewt_texts: list[str],
):
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, provider="cpu", workload="documents")
    nlp.to_disk(tmp_path / "saved")
    example = _example()
    monkeypatch.setenv(example.PIPELINE_ENV, str(tmp_path / "saved"))
    monkeypatch.setenv(example.THREADS_ENV, "1")
    with TestClient(example.app) as client:
        served = client.app.state.annotate.nlp
        assert spacy_accelerate.is_optimized(served)
        for text in ewt_texts[:4]:
            answer = client.post("/annotate", json={"text": text})
            assert answer.status_code == 200
            expected = nlp(text)
            assert [t["dep"] for t in answer.json()["tokens"]] == [t.dep_ for t in expected]
            assert [e["label"] for e in answer.json()["entities"]] == [
                e.label_ for e in expected.ents
            ]
        assert client.post("/annotate", content=b"not json").status_code == 400
        assert client.post("/annotate", json={"text": 3}).status_code == 400
        assert client.get("/health").status_code == 200
