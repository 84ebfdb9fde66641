"""``nlp.pipe(n_process=N)`` on accelerated pipelines: no hang, the same annotations as one
process, and the workers share the parent's threads (``spacy_accelerate.cpu_budget``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
from spacy_accelerate_samples.pipelines import SAMPLES_ENV_VAR

import spacy_accelerate
from spacy_accelerate.cpu_budget import CpuBudget, worker_count
from spacy_accelerate.pipeline.pipe import AcceleratedPipe

#: The script each test runs in a fresh interpreter.
WORKERS_SCRIPT = Path(__file__).parent / "workers_script.py"


def _run_workers(
    pipeline: str, texts: list[str], start: str, options: dict[str, object], env_root: Path
) -> dict[str, object]:
    child = subprocess.run(
        [
            sys.executable,
            str(WORKERS_SCRIPT),
            pipeline,
            start,
            json.dumps(options),
        ],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=600,  # a worker that hangs fails the test instead of the run
        env={**os.environ, SAMPLES_ENV_VAR: str(env_root)},
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def _check_workers(found: dict, parent_threads: int) -> None:
    assert found["double"] == found["single"]
    pid, threads = found["parent"]
    assert threads == parent_threads  # the parent keeps its threads
    workers = found["workers"]
    assert len({worker[0] for worker in workers}) == 2 and pid not in {w[0] for w in workers}
    # Each worker: torch on one thread at most, the runtime on its share of the parent's.
    for _, torch_threads, runtime_threads in workers:
        assert runtime_threads == max(1, parent_threads // 2)
        assert torch_threads <= runtime_threads


@pytest.mark.slow
def test_n_process_on_minilm_ewt_accelerated_auto_is_one_process_split_in_two(
    samples_root: Path, trained_minilm_cache: Path, ewt_texts: list[str]
):
    # minilm-ewt's heads run torch ops (a scalar weighting of the layers): without the
    # library's fork handler the forked workers hang in torch's thread pool.
    # The parent annotates with overlap (asked for), its component behind the
    # transformer; threads given, so that the runtime keeps all of them (no split).
    cpus = len(os.sched_getaffinity(0))
    options = {
        "provider": "auto",
        "precision": "auto",
        "cache_dir": str(trained_minilm_cache),
        "threads": cpus,
        "overlap": True,
    }
    found = _run_workers("minilm-ewt", ewt_texts[:24], "fork", options, samples_root)
    _check_workers(found, cpus)
    assert found["overlapped"] == (cpus >= 2)
    assert "auto" not in str(found["served"])  # auto chose a concrete plan


@pytest.mark.parametrize("start", ["fork", pytest.param("forkserver", marks=pytest.mark.slow)])
def test_each_worker_runs_on_its_share_of_the_parents_threads(
    sample_path: Callable[[str], Path], cache_dir: Path, ewt_texts: list[str], start: str
):
    # Forked workers open their session on their share; pickled ones (forkserver, the
    # default from Python 3.14) carry it in the pickle.
    options = {"provider": "cpu", "threads": 4, "cache_dir": str(cache_dir)}
    found = _run_workers(
        str(sample_path("roberta")), ewt_texts[:12], start, options, cache_dir.parent
    )
    _check_workers(found, 4)
    assert all(worker[2] == 2 for worker in found["workers"])


def test_the_share_counts_the_workers_of_the_calls_running_now():
    share = CpuBudget()
    assert share.threads_each(8) == 8
    with share.sharing(2):
        assert share.threads_each(8) == 4 and share.threads_each(1) == 1
        with share.sharing(3):
            assert share.threads_each(8) == 2
        assert share.threads_each(8) == 4
    assert share.workers == 1
    assert worker_count(3) == 3 and worker_count(-1) >= 1


def test_restore_gives_back_spacys_own_pipe(
    sample_path: Callable[[str], Path], cache_dir: Path, ewt_texts: list[str]
):
    nlp = spacy.load(sample_path("roberta"))
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    assert isinstance(nlp.pipe, AcceleratedPipe)
    assert len(list(nlp.pipe(ewt_texts[:3], batch_size=2))) == 3
    spacy_accelerate.restore(nlp)
    assert "pipe" not in nlp.__dict__
