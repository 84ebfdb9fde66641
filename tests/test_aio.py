"""Awaited requests annotated together (``spacy_accelerate.aio``, issue 61 item 1): a lone
request starts at once; requests awaited at the same time run as one ``nlp.pipe`` batch and
get the annotations they get alone; a failing request fails alone; a cancelled one is never
annotated; a full queue refuses."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
from annotations import annotations
from spacy.language import Language

import spacy_accelerate
from spacy_accelerate import aio
from spacy_accelerate.errors import QueueFullError


@pytest.fixture(scope="module")
def served(
    sample_path: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Language:
    nlp = spacy.load(sample_path("roberta"))
    cache = tmp_path_factory.mktemp("aio-cache")
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache, overlap=False)
    return nlp


@pytest.fixture(scope="module")
def texts(ewt_texts: list[str]) -> list[str]:
    return [text for text in ewt_texts if len(text) < 300][:8]


def _spied(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The texts of every batch annotated."""
    seen: list[list[str]] = []
    annotate_batch = aio._annotate_batch

    def spy(nlp: Language, batch: list) -> list:
        seen.append([request.text for request in batch])
        return annotate_batch(nlp, batch)

    monkeypatch.setattr(aio, "_annotate_batch", spy)
    return seen


def test_requests_awaited_together_run_as_one_batch_and_annotate_as_alone(
    served: Language, texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    alone = [annotations(served(text)) for text in texts]
    seen = _spied(monkeypatch)

    async def requests() -> list:
        docs = await asyncio.gather(*(aio.annotate(served, text) for text in texts))
        return [annotations(doc) for doc in docs]

    assert asyncio.run(requests()) == alone
    assert seen == [texts]


def test_a_lone_request_starts_at_once_alone(
    served: Language, texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    seen = _spied(monkeypatch)

    async def one_after_the_other() -> None:
        for text in texts[:3]:
            assert (await aio.annotate(served, text)).text == text

    asyncio.run(one_after_the_other())
    assert seen == [[text] for text in texts[:3]]


def test_a_failing_request_fails_alone(served: Language, texts: list[str]):
    async def requests() -> list:
        bad: object = 42  # not a text: spaCy refuses it, and the batch with it
        calls = [aio.annotate(served, text) for text in (texts[0], bad, texts[1])]
        return await asyncio.gather(*calls, return_exceptions=True)

    first, failed, last = asyncio.run(requests())
    assert isinstance(failed, ValueError) and "E1041" in str(failed)
    assert (first.text, last.text) == (texts[0], texts[1])
    assert first.has_annotation("DEP") and last.has_annotation("DEP")


def test_a_cancelled_request_is_never_annotated(
    served: Language, texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    seen = _spied(monkeypatch)

    async def requests() -> list:
        tasks = [asyncio.ensure_future(aio.annotate(served, text)) for text in texts[:3]]
        await asyncio.sleep(0)  # each request is waiting now
        tasks[1].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    first, cancelled, last = asyncio.run(requests())
    assert isinstance(cancelled, asyncio.CancelledError)
    assert seen == [[texts[0], texts[2]]]
    assert (first.text, last.text) == (texts[0], texts[2])


def test_a_full_queue_refuses(served: Language, texts: list[str], monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(aio, "MAX_WAITING", 2)

    async def requests() -> list:
        calls = [aio.annotate(served, text) for text in texts[:3]]
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(requests())
    assert isinstance(results[2], QueueFullError) and "503" in str(results[2])
    assert [doc.text for doc in results[:2]] == texts[:2]


def test_a_batch_the_workers_cannot_run_fails_its_requests_and_the_next_batch_runs(
    served: Language, texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    # A batch whose worker raised past _annotate_batch (here: as a shut-down executor
    # does) left its requests, and every request waiting behind it, awaited for ever.
    annotate_batch, failed = aio._annotate_batch, []

    def first_fails(nlp: Language, batch: list) -> list:
        if not failed:
            failed.append(len(batch))
            raise RuntimeError("cannot schedule new futures after shutdown")
        return annotate_batch(nlp, batch)

    monkeypatch.setattr(aio, "_annotate_batch", first_fails)

    async def requests() -> list:
        calls = [aio.annotate(served, text) for text in texts[:3]]
        together = asyncio.gather(*calls, return_exceptions=True)
        return await asyncio.wait_for(together, timeout=120)

    results = asyncio.run(requests())
    assert failed == [3]
    assert all(isinstance(r, RuntimeError) and "shutdown" in str(r) for r in results)
    again = asyncio.run(requests())  # the batcher serves on
    assert [doc.text for doc in again] == texts[:3]


def test_requests_left_when_the_event_loop_ends_are_cancelled(
    served: Language, texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    seen = _spied(monkeypatch)
    batcher: list[aio.RequestBatches] = []
    tasks: list[asyncio.Future] = []

    async def abandoned() -> None:
        tasks.extend(asyncio.ensure_future(aio.annotate(served, text)) for text in texts[:3])
        await asyncio.sleep(0)  # each request is waiting now, the batcher's task started
        batcher.append(aio.batches_of(served))

    asyncio.run(abandoned())  # ends with the requests unanswered: the loop cancels them
    (batches,) = batcher
    assert len(batches._waiting) == 0 and batches._draining is None
    assert all(task.cancelled() for task in tasks)
    assert len(seen) <= 1
