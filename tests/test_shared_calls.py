"""Concurrent calls of one served encoder run together while the runtime is busy (issue 61,
item 1): ``nlp(text)`` from 8 threads gives each document the annotations it gets alone in
fewer encoder calls; a lone call runs at once; a full queue, a failing call and a caller
that stops waiting behave as :mod:`spacy_accelerate.runtime.shared_calls` says."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
import spacy
import torch
from annotations import annotations
from at_once import at_once

import spacy_accelerate
from spacy_accelerate.backends.onnxruntime.session import EncoderSession
from spacy_accelerate.errors import QueueFullError
from spacy_accelerate.options.config import Precision, Provider
from spacy_accelerate.runtime import shared_calls as module
from spacy_accelerate.runtime.providers import ResolvedProvider
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
        deadline = time.monotonic() + 60
        while not self.gate.wait(0.05):  # in turns: an exception raised into it lands
            assert time.monotonic() < deadline
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
    """Raised into a waiting caller's thread, as Ctrl-C would be into the main thread."""


def _raise_in(thread: threading.Thread, error: type[BaseException]) -> None:
    """Raise ``error`` in ``thread`` when it next runs Python code: a thread blocked in a
    wait never does, so this is also what a signal given to another thread amounts to."""
    assert thread.ident is not None
    raised = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(error)
    )
    assert raised == 1


def _caller(shared: SharedCalls, runtime: Runtime, row: list[int]) -> tuple:
    """A daemon thread calling ``shared.run`` on ``row`` and what it got (outputs or the
    exception); a daemon, so that one blocked for ever cannot hold the process at exit."""
    got: list = []

    def call() -> None:
        try:
            got.append(shared.run(runtime, _feeds(row), ("out",))[0])
        except BaseException as error:
            got.append(error)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, got


def test_a_caller_that_stops_waiting_costs_nothing_more():
    shared, runtime = SharedCalls(PAD), Runtime()
    runtime.gate.clear()
    first, _ = _in_threads(shared, runtime, [[2]])
    assert runtime.entered.wait(timeout=60)
    waiter, got = _caller(shared, runtime, [77, 78])  # waits: the runtime is busy
    _when(lambda: len(shared._waiting) == 1)
    _raise_in(waiter, Interrupted)
    waiter.join(timeout=30)
    assert len(got) == 1 and isinstance(got[0], Interrupted), got
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
        self.shared, session = proxy.served.shared_calls, proxy.session
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


def test_a_leader_stopped_in_its_run_hands_its_batch_on():
    # Ctrl-C in the thread running a shared batch left the batch's other callers waiting
    # for ever: their outputs never came, and no one else ran their rows.
    shared, runtime = SharedCalls(PAD), Runtime()
    runtime.gate.clear()
    first, _ = _in_threads(shared, runtime, [[2]])
    assert runtime.entered.wait(timeout=60)
    leader, got = _caller(shared, runtime, [7])
    _when(lambda: len(shared._waiting) == 1)  # waits first: it leads the next batch
    threads, results = _in_threads(shared, runtime, [[3], [4, 5]])
    _when(lambda: len(shared._waiting) == 3)
    runtime.entered.clear()
    runtime.gate.set()  # the first call ends; the leader runs the shared batch
    runtime.gate.clear()
    assert runtime.entered.wait(timeout=60)
    _raise_in(leader, KeyboardInterrupt)
    leader.join(timeout=30)
    assert len(got) == 1 and isinstance(got[0], KeyboardInterrupt), got
    runtime.gate.set()
    for thread in first + threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert results[0][0, :, 0].tolist() == [30.0]
    assert results[1][0, :, 0].tolist() == [40.0, 50.0]
    assert all((call != 7).all() for call in runtime.calls[2:])  # its rows never run again


def test_calls_of_a_dynamic_int8_model_never_run_together(
    served: Served, monkeypatch: pytest.MonkeyPatch
):
    # ONNX Runtime's int8 scales a call's activations together: a document's outputs
    # would depend on the documents beside it, where alone they did not.
    int8 = ResolvedProvider(Provider.CPU, Precision.INT8)
    assert not EncoderSession.rows_independent.fget(SimpleNamespace(provider=int8))
    fp32 = ResolvedProvider(Provider.CPU, Precision.FP32)
    assert EncoderSession.rows_independent.fget(SimpleNamespace(provider=fp32))
    (proxy,) = spacy_accelerate.accelerated_components(served.nlp).values()
    monkeypatch.setattr(type(proxy.session), "rows_independent", property(lambda _: False))
    monkeypatch.delattr(proxy.session, "run_tensors")  # the fixture's wait for sharing
    together: list = [None] * len(served.texts)

    def annotate(index: int) -> None:
        together[index] = annotations(served.nlp(served.texts[index]))

    at_once(annotate, len(served.texts))
    assert together == served.alone
    assert served.runs == 0  # every call ran directly, alone
