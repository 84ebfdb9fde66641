"""Concurrent calls of one served encoder run together while the runtime is busy (issue 61,
item 1): ``nlp(text)`` from 8 threads gives each document the annotations it gets alone in
fewer encoder calls; a lone call runs at once; a full queue, a failing call and a caller
that stops waiting behave as :mod:`spacy_accelerate.runtime.shared_calls` says."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
import spacy
import torch
from annotations import annotations

import spacy_accelerate
from spacy_accelerate.errors import QueueFullError
from spacy_accelerate.runtime import shared_calls as module
from spacy_accelerate.runtime.shared_calls import SharedCalls

PAD = 1


def _feeds(*rows: list[int]) -> dict[str, torch.Tensor]:
    longest = max(len(row) for row in rows)
    ids = torch.tensor([row + [PAD] * (longest - len(row)) for row in rows])
    mask = (ids != PAD).long()
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


class Runtime:
    """A fake session's ``run_tensors``: the ids times ten as one output, each real piece's
    value its own (so a padded batch gives every row what it gets alone); it blocks while
    ``gate`` is closed, and fails on any call holding the id ``bad``."""

    def __init__(self, bad: int = -1) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.calls: list[torch.Tensor] = []
        self.bad = bad

    def __call__(self, feeds: Mapping[str, torch.Tensor], names: Sequence[str]) -> list:
        self.calls.append(feeds["input_ids"])
        self.entered.set()
        assert self.gate.wait(timeout=60)
        if (feeds["input_ids"] == self.bad).any():
            raise ValueError(f"id {self.bad} cannot be run")
        return [feeds["input_ids"].unsqueeze(-1).float() * 10]


def _in_threads(shared: SharedCalls, runtime: Runtime, rows: list[list[int]]) -> list:
    results: list = [None] * len(rows)

    def call(index: int) -> None:
        try:
            results[index] = shared.run(runtime, _feeds(rows[index]), ("out",))[0]
        except Exception as error:
            results[index] = error

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(rows))]
    for thread in threads:
        thread.start()
    return [threads, results]


def _when(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_a_lone_call_runs_at_once_and_alone():
    shared, runtime = SharedCalls(PAD), Runtime()
    for row in ([5, 6, 7], [8], [9, 10]):
        (out,) = shared.run(runtime, _feeds(row), ("out",))
        assert out[0, :, 0].tolist() == [10.0 * i for i in row]
    assert [call.shape[0] for call in runtime.calls] == [1, 1, 1]


def test_calls_arriving_while_busy_run_together_each_with_its_own_outputs():
    shared, runtime = SharedCalls(PAD), Runtime()
    runtime.gate.clear()
    first, first_results = _in_threads(shared, runtime, [[2, 3]])
    assert runtime.entered.wait(timeout=60)  # the runtime is busy with the first call
    rows = [[4 + i] * (1 + i % 3) for i in range(7)]
    threads, results = _in_threads(shared, runtime, rows)
    _when(lambda: len(shared._waiting) == 7)
    runtime.gate.set()
    for thread in first + threads:
        thread.join()
    assert [call.shape for call in runtime.calls] == [(1, 2), (7, 3)]  # one shared run
    assert first_results[0][0, :, 0].tolist() == [20.0, 30.0]
    for row, result in zip(rows, results, strict=True):
        assert result.shape == (1, len(row), 1)
        assert result[0, :, 0].tolist() == [10.0 * i for i in row]


def test_a_failing_call_fails_alone():
    shared, runtime = SharedCalls(PAD), Runtime(bad=99)
    runtime.gate.clear()
    first, _ = _in_threads(shared, runtime, [[2]])
    assert runtime.entered.wait(timeout=60)
    threads, results = _in_threads(shared, runtime, [[3, 4], [99, 5], [6]])
    _when(lambda: len(shared._waiting) == 3)
    runtime.gate.set()
    for thread in first + threads:
        thread.join()
    assert isinstance(results[1], ValueError)
    assert results[0][0, :, 0].tolist() == [30.0, 40.0]
    assert results[2][0, :, 0].tolist() == [60.0]


def test_a_full_queue_refuses_at_once(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(module, "MAX_WAITING", 2)
    shared, runtime = SharedCalls(PAD), Runtime()
    runtime.gate.clear()
    first, _ = _in_threads(shared, runtime, [[2]])
    assert runtime.entered.wait(timeout=60)
    threads, _ = _in_threads(shared, runtime, [[3], [4]])
    _when(lambda: len(shared._waiting) == 2)
    with pytest.raises(QueueFullError, match="503"):
        shared.run(runtime, _feeds([5]), ("out",))
    runtime.gate.set()
    for thread in first + threads:
        thread.join()


class Interrupted(Exception):
    """Raised in the main thread while it waits, as Ctrl-C would be."""


def test_a_caller_that_stops_waiting_costs_nothing_more():
    shared, runtime = SharedCalls(PAD), Runtime()
    runtime.gate.clear()
    first, _ = _in_threads(shared, runtime, [[2]])
    assert runtime.entered.wait(timeout=60)

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Interrupted):
            shared.run(runtime, _feeds([77, 78]), ("out",))  # waits: the runtime is busy
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert len(shared._waiting) == 0
    threads, results = _in_threads(shared, runtime, [[3]])
    _when(lambda: len(shared._waiting) == 1)
    runtime.gate.set()
    for thread in first + threads:
        thread.join()
    assert results[0][0, :, 0].tolist() == [30.0]
    assert all((call != 77).all() for call in runtime.calls)  # never run
    (out,) = shared.run(runtime, _feeds([4]), ("out",))  # idle again: runs at once
    assert out[0, :, 0].tolist() == [40.0]


class Served:
    """The tiny RoBERTa, accelerated, with eight short held-out texts and their annotations
    alone; its runtime busy with the first call until the others all wait."""

    def __init__(self, sample: Path, cache_dir: Path, texts: list[str]) -> None:
        self.nlp = spacy.load(sample)
        spacy_accelerate.optimize(self.nlp, "cpu", "fp32", cache_dir=cache_dir, overlap=False)
        self.texts = [text for text in texts if len(text) < 300][:8]
        self.alone = [annotations(self.nlp(text)) for text in self.texts]
        (proxy,) = spacy_accelerate.accelerated_components(self.nlp).values()
        self.shared, session = proxy.shared_calls, proxy.session
        run, first = session.run_tensors, threading.Event()

        def busy_until_the_others_wait(*args: object, **kwargs: object) -> object:
            if not first.is_set():
                first.set()
                _when(lambda: len(self.shared._waiting) == len(self.texts) - 1)
            return run(*args, **kwargs)

        session.run_tensors = busy_until_the_others_wait  # type: ignore[method-assign]
        self.runs_before = self.shared.runs

    @property
    def runs(self) -> int:
        return self.shared.runs - self.runs_before


@pytest.fixture()
def served(sample_path: Callable[[str], Path], cache_dir: Path, ewt_texts: list[str]) -> Served:
    return Served(sample_path("roberta"), cache_dir, ewt_texts)


def test_concurrent_nlp_calls_share_the_encoders_runs_and_annotate_as_alone(served: Served):
    together: list = [None] * len(served.texts)

    def annotate(index: int) -> None:
        together[index] = annotations(served.nlp(served.texts[index]))

    threads = [threading.Thread(target=annotate, args=(i,)) for i in range(len(served.texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == served.alone
    assert served.runs == 2  # the first alone, the seven others together
