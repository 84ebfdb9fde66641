"""A process that leaves an overlapped ``nlp.pipe`` unfinished ends as it would without
overlap (issue 60): the caller's own exit status, no abort, nothing on stderr that the
caller's code did not cause. The helper thread is kept inside the runtime's C++ call (each
runtime call runs the model many times over), where a daemon thread still running at the
interpreter's finalization aborted the process (``terminate called without an active
exception``, exit status 134). ``abandoned``: a helper stopped by its pipe's collection is
waited for to the end of its thread, whose last C++ work (what its thread-locals run as
they are destroyed) the finalizing interpreter would otherwise cut short the same way (on
619420a: that abort, every run)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

SCRIPT = """
import os, signal, sys
import spacy, spacy_accelerate
from spacy_accelerate import cpu_budget
cpu_budget.affinity_cpus = lambda: 2
sample, cache, provider, way = sys.argv[1:5]
nlp = spacy.load(sample)
spacy_accelerate.optimize(nlp, provider, "fp32", cache_dir=cache, overlap=True)
(proxy,) = spacy_accelerate.accelerated_components(nlp).values()
runner = proxy.session.runner
run_whole = runner.run_whole
def in_the_runtime_for_long(feeds, names):
    for _ in range(200):
        outputs = run_whole(feeds, names)
    return outputs
runner.run_whole = in_the_runtime_for_long
texts = ["The quick brown fox jumps over the lazy dog near the river bank."] * 400
if way == "abandoned":
    # The helper holds, in a thread-local, what runs C++ code (torch's, the GIL released)
    # when it is destroyed, as its thread ends; the caller abandons the pipe, and raises
    # once that has begun: the exit must wait for the thread to its end.
    import threading, torch
    from spacy_accelerate.serving.overlap import HELPER_NAME
    held, dying = threading.local(), threading.Event()
    class CppWhenDestroyed:
        def __del__(self):
            dying.set()
            x = torch.randn(400, 400)
            for _ in range(500):
                x = torch.tanh(x @ x)
    proxy_run = proxy._run
    def holding(*args, **kwargs):
        if threading.current_thread().name == HELPER_NAME:
            if not hasattr(held, "it"):
                held.it = CppWhenDestroyed()
        return proxy_run(*args, **kwargs)
    proxy._run = holding
    stream = nlp.pipe(texts, batch_size=64)
    next(stream)
    del stream
    dying.wait(60)
    raise RuntimeError("raised by the caller")
if way == "next":
    doc = next(iter(nlp.pipe(texts, batch_size=64)))
else:
    for index, doc in enumerate(nlp.pipe(texts, batch_size=64)):
        if way == "break":
            break
        if way == "exit":
            sys.exit(3)
        if way == "raise":
            raise RuntimeError("raised by the caller")
        if way == "ctrl-c":
            os.kill(os.getpid(), signal.SIGINT)
            signal.pause()
print("ended", flush=True)
"""

#: Each way the caller's code ends, with the exit status and the last line of stderr that
#: the caller's own code causes (the traceback's, where there is one).
WAYS = {
    "break": (0, None),
    "next": (0, None),
    "exit": (3, None),
    "raise": (1, "RuntimeError: raised by the caller"),
    "abandoned": (1, "RuntimeError: raised by the caller"),
    "ctrl-c": (-signal.SIGINT, "KeyboardInterrupt"),
}


@pytest.fixture(scope="module")
def exit_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model cache for every way (the model is exported once a provider)."""
    return tmp_path_factory.mktemp("exit-status-cache")


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("provider", ["cpu", pytest.param("openvino", marks=pytest.mark.slow)])
def test_an_unfinished_overlapped_pipe_ends_with_the_callers_exit_status(
    sample_path: Callable[[str], Path], exit_cache: Path, provider: str, way: str
):
    command = [sys.executable, "-c", textwrap.dedent(SCRIPT)]
    args = [str(sample_path("roberta")), str(exit_cache), provider, way]
    result = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=300, check=False
    )
    status, last_error_line = WAYS[way]
    assert "terminate called" not in result.stderr, result.stderr
    assert result.returncode == status, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if last_error_line is None:
        assert lines == [], result.stderr
    else:
        assert lines[-1] == last_error_line, result.stderr
    assert ("ended" in result.stdout) == (status == 0)
