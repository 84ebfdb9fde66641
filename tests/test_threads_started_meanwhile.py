"""Threads that other code starts while an overlapped ``nlp.pipe`` runs (issue 60): torch
runs there on the caller's count, during the pipe and after it. The library runs torch on
one thread only in its own threads' work (:func:`spacy_accelerate.cpu_budget.glue_threads`,
:func:`~spacy_accelerate.cpu_budget.helper_threads`); torch's own ``set_num_threads`` would
also change the default every thread started later reads at its first parallel op."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import spacy
import torch
from spacy.language import Language

import spacy_accelerate
from spacy_accelerate import cpu_budget
from spacy_accelerate.pipeline.pipe import AcceleratedPipe

CALLERS = 2


@pytest.fixture()
def overlapped(
    monkeypatch: pytest.MonkeyPatch, sample_path: Callable[[str], Path], cache_dir: Path
) -> Iterator[Language]:
    monkeypatch.setattr(cpu_budget, "affinity_cpus", lambda: CALLERS)
    previous = torch.get_num_threads()
    torch.set_num_threads(CALLERS)
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir, overlap=True)
    assert isinstance(nlp.pipe, AcceleratedPipe) and nlp.pipe.overlap
    yield nlp
    torch.set_num_threads(previous)


class Elsewhere:
    """Other code in the process: starts threads while the caller's pipe runs, each
    reading torch's count at once, and keeps one (started meanwhile) to read it again
    after the pipe."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.done = threading.Event()
        self.asked_again = threading.Event()
        self.kept: threading.Thread | None = None

    def _read(self) -> None:
        self.seen.append(torch.get_num_threads())

    def _keep(self) -> None:
        self._read()
        self.asked_again.wait()
        self._read()

    def run(self) -> None:
        while not self.done.is_set():
            thread = threading.Thread(target=self._read)
            thread.start()
            thread.join()
            if self.kept is None:
                self.kept = threading.Thread(target=self._keep)
                self.kept.start()


def test_threads_started_during_an_overlapped_pipe_run_torch_on_the_callers_count(
    overlapped: Language, ewt_texts: list[str]
):
    elsewhere = Elsewhere()
    starter = threading.Thread(target=elsewhere.run)
    stream = overlapped.pipe(ewt_texts[:40] * 3, batch_size=8)
    first = next(stream)  # the helper runs from here on
    starter.start()
    docs = [first, *stream]
    elsewhere.done.set()
    starter.join()
    assert elsewhere.kept is not None
    elsewhere.asked_again.set()
    elsewhere.kept.join()
    assert len(docs) == 120 and len(elsewhere.seen) > 2
    assert set(elsewhere.seen) == {CALLERS}, elsewhere.seen
    assert torch.get_num_threads() == CALLERS
