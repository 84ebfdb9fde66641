"""``examples/web_service.py`` serves a saved accelerated pipeline as ``nlp(text)`` does,
and answers 400 to text it will not annotate, before annotating it."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import spacy
import torch
from at_once import at_once
from starlette.testclient import TestClient

import spacy_accelerate
from spacy_accelerate import aio

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


@pytest.fixture(scope="module")
def service(
    sample_path: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ModuleType, TestClient]]:
    """The example serving the BERT sample: its WordPiece tokenizer is the piece tokenizer
    whose time grows fastest with a word's length."""
    folder = tmp_path_factory.mktemp("web-service")
    nlp = spacy.load(sample_path("bert"))
    spacy_accelerate.optimize(nlp, provider="cpu", workload="documents", cache_dir=folder / "cache")
    nlp.to_disk(folder / "saved")
    example = _example()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPACY_ACCELERATE_CACHE", str(folder / "cache"))
        patch.setenv(example.PIPELINE_ENV, str(folder / "saved"))
        patch.setenv(example.THREADS_ENV, "1")
        with TestClient(example.app) as client:
            yield example, client


def _refused(example: ModuleType, case: str) -> tuple[object, str]:
    """The text the example refuses in ``case`` (bytes: the raw body that carries it) and a
    part of the message that must say why."""
    words = example.MAX_WORD_CHARACTERS
    emoji = "\U0001f600" * (example.MAX_TEXT_BYTES // 4 + 1)  # 4 bytes a character
    cases: dict[str, tuple[object, str]] = {
        "empty": ("", "empty or only whitespace"),
        "whitespace only": (" \n\t\u3000 ", "empty or only whitespace"),
        # As a client sends it: a JSON escape (httpx cannot encode a lone surrogate).
        "lone surrogate": (
            b'{"text": "abc \\ud800 def"}',
            "lone surrogate (U+D800) at character 4",
        ),
        "over-long word": (
            "A word: " + "a" * (words + 1) + " and more.",
            f"a word of {words + 1} characters at character 8, over the limit of {words}",
        ),
        "over-long text": (emoji, f"over the limit of {example.MAX_TEXT_BYTES}"),
        "not a string": (3, "must be a string"),
    }
    return cases[case]


@pytest.mark.parametrize(
    "case",
    [
        "empty",
        "whitespace only",
        "lone surrogate",
        "over-long word",
        "over-long text",
        "not a string",
    ],
)
def test_text_it_will_not_annotate_is_a_400_saying_why(
    service: tuple[ModuleType, TestClient], case: str
):
    example, client = service
    text, why = _refused(example, case)
    if isinstance(text, bytes):
        answer = client.post("/annotate", content=text)
    else:
        answer = client.post("/annotate", json={"text": text})
    assert answer.status_code == 400, answer.text[:300]
    assert why in answer.json()["error"]


def test_a_body_over_the_limit_is_not_read(service: tuple[ModuleType, TestClient]):
    example, client = service
    answer = client.post("/annotate", content=b" " * (example.MAX_BODY_BYTES + 1))
    assert answer.status_code == 413
    assert str(example.MAX_BODY_BYTES) in answer.json()["error"]


def _best_of_three(client: TestClient, text: str, status: int) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        answer = client.post("/annotate", json={"text": text})
        best = min(best, time.perf_counter() - started)
        assert answer.status_code == status, answer.text[:300]
    return best


def test_the_limits_bound_a_requests_time_by_an_ordinary_ones(
    service: tuple[ModuleType, TestClient], ewt_texts: list[str]
):
    example, client = service
    limit = example.MAX_TEXT_BYTES
    english = " ".join(ewt_texts)[:limit]
    assert len(english.encode("utf-8")) == limit
    ordinary = _best_of_three(client, english, 200)
    # A word WordPiece takes seconds on (its time grows faster than the square of the
    # word's length): refused before any annotation, sooner than English is annotated.
    refused = _best_of_three(client, "a" * (limit // 2), 400)
    assert refused < ordinary, (refused, ordinary)
    # The slowest texts within the limits: the longest words WordPiece may see, and as many
    # tokens as characters (spaCy's tokenizer splits a run of ")" one by one).
    for word in ("7" * example.MAX_WORD_CHARACTERS, ")" * example.MAX_WORD_CHARACTERS):
        slowest = " ".join([word] * (limit // len(word)))[:limit]
        taken = _best_of_three(client, slowest, 200)
        assert taken < 10 * ordinary, (word[0], taken, ordinary)


def test_concurrent_requests_are_annotated_together_without_a_lock(
    service: tuple[ModuleType, TestClient], ewt_texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    example, client = service
    nlp = client.app.state.annotate.nlp
    texts = [text for text in ewt_texts if len(text) < 300][:8]
    expected = [[t.dep_ for t in nlp(text)] for text in texts]
    sizes: list[int] = []
    annotate_batch = aio._annotate_batch

    def first_batch_waits_for_the_others(nlp: object, batch: list) -> list:
        if not sizes:  # busy until every other request waits (some may be in this batch)
            (batches,) = aio._BATCHES[nlp].values()
            deadline = time.monotonic() + 60
            while len(batches._waiting) + len(batch) < len(texts):
                assert time.monotonic() < deadline
                time.sleep(0.01)
        sizes.append(len(batch))
        return annotate_batch(nlp, batch)

    monkeypatch.setattr(aio, "_annotate_batch", first_batch_waits_for_the_others)
    answers: list = [None] * len(texts)

    def post(index: int) -> None:
        answers[index] = client.post("/annotate", json={"text": texts[index]})

    at_once(post, len(texts))
    assert [answer.status_code for answer in answers] == [200] * len(texts)
    assert [[t["dep"] for t in a.json()["tokens"]] for a in answers] == expected
    # The first request starts at once, with any that reached the event loop before its
    # batch started (at times all of them); all the others, waiting meanwhile, as one batch.
    assert len(sizes) <= 2 and sum(sizes) == len(texts), sizes


def test_without_the_library_each_request_runs_nlp_in_a_thread(
    service: tuple[ModuleType, TestClient], ewt_texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    example, client = service
    monkeypatch.setattr(example, "aio", None)  # as where spacy-accelerate is not installed
    nlp = client.app.state.annotate.nlp
    answer = client.post("/annotate", json={"text": ewt_texts[0]})
    assert answer.status_code == 200
    assert [t["dep"] for t in answer.json()["tokens"]] == [t.dep_ for t in nlp(ewt_texts[0])]


def test_a_plain_folder_is_served_on_the_threads_asked_for(
    sample_path: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, ewt_texts: list[str]
):
    # SPACY_THREADS on a folder saved without the library's settings (a plain pipeline,
    # as several worker processes serve it) once failed to start: its override named a
    # config section only an accelerated pipeline has.
    example = _example()
    monkeypatch.setenv(example.PIPELINE_ENV, str(sample_path("roberta")))
    monkeypatch.setenv(example.THREADS_ENV, "1")
    threads = torch.get_num_threads()
    try:
        with TestClient(example.app) as client:
            assert not spacy_accelerate.is_optimized(client.app.state.annotate.nlp)
            assert client.post("/annotate", json={"text": ewt_texts[0]}).status_code == 200
    finally:
        torch.set_num_threads(threads)  # the example set PyTorch's (in the app's thread)
