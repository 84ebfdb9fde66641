"""The caller's process as it was found (issue 53): torch's threads after and between the
documents of overlapped ``nlp.pipe`` calls (interleaved, nested, concurrent, abandoned,
collected), prompt ends, bounded memory, a confined budget (the overlap plan decided once
and kept: test_overlap_plan.py)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import spacy
import torch
from spacy.language import Language
from spacy.tokens import Doc

import spacy_accelerate
from spacy_accelerate import cpu_budget
from spacy_accelerate.pipeline.pipe import AcceleratedPipe

HELPER = "spacy-accelerate-transformer"
BATCH = 4


def _helpers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == HELPER]


def _no_helper_left(seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while _helpers() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _helpers()


def _in_new_thread() -> int:
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


@pytest.fixture()
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Overlap can run whatever this machine has, and torch starts on 2 threads."""
    monkeypatch.setattr(cpu_budget, "affinity_cpus", lambda: 2)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


@pytest.fixture()
def overlapped(
    two_cpus: None, sample_path: Callable[[str], Path], cache_dir: Path
) -> Iterator[Language]:
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, overlap=True)
    assert isinstance(nlp.pipe, AcceleratedPipe) and nlp.pipe.overlap
    torch.set_num_threads(2)
    yield nlp
    assert _no_helper_left()


@pytest.fixture(scope="module")
def texts(ewt_texts: list[str]) -> list[str]:
    return ewt_texts[:40]


def test_interleaved_generators_leave_torchs_threads_as_found(
    overlapped: Language, texts: list[str]
):
    pairs = list(zip(overlapped.pipe(texts, batch_size=BATCH), overlapped.pipe(texts), strict=True))
    assert len(pairs) == len(texts)
    assert torch.get_num_threads() == 2
    assert _in_new_thread() == 2


def test_between_two_documents_torch_runs_on_the_callers_threads(
    overlapped: Language, texts: list[str]
):
    seen = []
    for doc in overlapped.pipe(texts, batch_size=BATCH):
        seen.append((torch.get_num_threads(), _in_new_thread()))
        for _inner in overlapped.pipe(texts[:6], batch_size=2):  # nested
            seen.append((torch.get_num_threads(), _in_new_thread()))
        assert doc.has_annotation("DEP")
    assert set(seen) == {(2, 2)}


def test_concurrent_callers_leave_torchs_threads_as_found(overlapped: Language, texts: list[str]):
    errors: list[BaseException] = []

    def annotate() -> None:
        try:
            assert len(list(overlapped.pipe(texts, batch_size=BATCH))) == len(texts)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=annotate) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert torch.get_num_threads() == 2
    assert _in_new_thread() == 2


def test_collected_generators_stop_their_helpers_without_errors(
    overlapped: Language, texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    raised: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    unraisable: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: unraisable.append(args.exc_value))
    for _ in range(30):
        stream = overlapped.pipe(texts, batch_size=BATCH)
        next(stream)
        cycle: dict = {"g": stream}
        cycle["h"] = cycle
        del stream, cycle
    gc.collect()
    assert _no_helper_left()
    assert raised == [] and unraisable == []
    assert torch.get_num_threads() == 2
    assert _in_new_thread() == 2


def _annotated_by_the_transformer(nlp: Language) -> list[int]:
    """Counts the documents the transformer has annotated, as they are."""
    component = nlp.get_pipe("transformer")
    counted = [0]
    set_annotations = component.set_annotations

    def counting(docs: list[Doc], *args: object, **kwargs: object) -> None:
        counted[0] += len(docs)
        set_annotations(docs, *args, **kwargs)

    component.set_annotations = counting  # type: ignore[method-assign]
    return counted


def test_the_transformer_keeps_at_most_one_batch_ahead_of_the_caller(
    overlapped: Language, texts: list[str]
):
    counted = _annotated_by_the_transformer(overlapped)
    stream = overlapped.pipe(texts, batch_size=BATCH)
    taken = [next(stream)]
    time.sleep(1.0)  # the caller is busy: the helper must wait, not run on
    # The batch the caller reads from, and one more finished ahead of it.
    assert counted[0] <= 2 * BATCH
    taken.extend(stream)
    assert len(taken) == len(texts) and counted[0] == len(texts)


#: Model runs in one runtime call, in tests that keep the helper inside the runtime.
LONG_CALL = 200


def test_closing_early_aborts_the_helpers_runtime_call(
    overlapped: Language, texts: list[str], monkeypatch: pytest.MonkeyPatch
):
    # Each runtime call runs the model LONG_CALL times, in ONNX Runtime's C++: close() must
    # abort the call the helper is in, not wait for it, whatever the machine's speed.
    (proxy,) = spacy_accelerate.accelerated_components(overlapped).values()
    runner = proxy.session.runner
    run_whole = runner.run_whole
    closing, second_call = threading.Event(), threading.Event()
    runs = {"calls": 0, "after_close": 0}

    def in_the_runtime_for_long(feeds: object, names: object) -> object:
        runs["calls"] += 1
        for _ in range(LONG_CALL):
            if runs["calls"] == 2:
                second_call.set()  # the helper is inside its second batch's call
            outputs = run_whole(feeds, names)
            runs["after_close"] += closing.is_set()
        return outputs

    monkeypatch.setattr(runner, "run_whole", in_the_runtime_for_long)
    stream = overlapped.pipe(texts * 3, batch_size=len(texts))
    next(stream)  # the first batch, whole: the helper goes on with the second
    assert second_call.wait(timeout=300)
    closing.set()
    stream.close()
    assert runs["after_close"] <= 1, runs  # the call in flight, aborted or just ending
    assert _helpers() == []


INTERRUPTED = """
import os, signal, sys, time, threading
import spacy, spacy_accelerate
from spacy_accelerate import cpu_budget
cpu_budget.affinity_cpus = lambda: 2
nlp = spacy.load(sys.argv[1])
overlap = sys.argv[4] == "overlap"
spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=sys.argv[2], overlap=overlap)
(proxy,) = spacy_accelerate.accelerated_components(nlp).values()
run = proxy.session.run_tensors
def slow(*args, **kwargs):
    time.sleep(0.5)
    return run(*args, **kwargs)
proxy.session.run_tensors = slow
texts = [line for line in open(sys.argv[3]).read().splitlines() if line] * 40
for index, doc in enumerate(nlp.pipe(texts)):  # the default batch size
    if index == 0:
        print("first", flush=True)
"""


def _seconds_to_end_after_ctrl_c(command: list[str]) -> float:
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "first"
        time.sleep(0.5)
        sent = time.monotonic()
        os.kill(process.pid, signal.SIGINT)
        process.wait(timeout=120)
        ended = time.monotonic() - sent
        errors.seek(0)
        # KeyboardInterrupt, unhandled: Python ends itself by SIGINT, as Ctrl-C would (an
        # abort would be -SIGABRT, shown as 134 by a shell).
        assert process.returncode == -signal.SIGINT, (process.returncode, errors.read()[-3000:])
    return ended


@pytest.mark.slow
def test_ctrl_c_during_an_overlapped_pipe_is_as_prompt_as_without(
    sample_path: Callable[[str], Path], cache_dir: Path, texts: list[str], tmp_path: Path
):
    # Every runtime call takes 0.5 s more: a helper that finished its batch (the default
    # batch size: 23 runtime calls here) before it stopped would end 10 s or more later than
    # the sequential pipe, timed here (a busy machine slows both; half of that is allowed).
    texts_file = tmp_path / "texts.txt"
    texts_file.write_text("\n".join(texts))
    command = [sys.executable, "-c", textwrap.dedent(INTERRUPTED)]
    args = [str(sample_path("roberta")), str(cache_dir), str(texts_file)]
    without = _seconds_to_end_after_ctrl_c([*command, *args, "sequential"])
    overlapped = _seconds_to_end_after_ctrl_c([*command, *args, "overlap"])
    assert overlapped < 2 * without + 5.0, (overlapped, without)


def test_a_confined_process_serves_on_its_share(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cpu_budget, "affinity_cpus", lambda: 8)
    budget = cpu_budget.CpuBudget()
    assert budget.cpus() == 8
    budget.confine(2.5)  # a Ray actor's num_cpus
    assert budget.cpus() == 2
    budget.confine(32)  # never more than its affinity
    assert budget.cpus() == 8
    budget.confine(None)
    assert budget.cpus() == 8


def test_a_saved_plan_is_read_strictly():
    plan = cpu_budget.OverlapPlan(True, 1, "measured", None)
    assert cpu_budget.OverlapPlan.from_record(plan.record()) == cpu_budget.OverlapPlan(
        True, 1, "recorded with the pipeline", None
    )
    for record in ({"overlap": 1, "fewer": 0}, {"overlap": True, "fewer": True}, "on", None):
        assert cpu_budget.OverlapPlan.from_record(record) is None
    assert plan.runtime_threads(2) == 1 and plan.runtime_threads(1) == 1
    assert cpu_budget.OverlapPlan(False, 0).runtime_threads(4) == 4
