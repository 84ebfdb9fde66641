"""One long request in a served process (issue 60), for ``benchmarks/serving.py``: the
process's memory before and after one 100,000-character document, and what giving the
runtime's working memory back costs single documents and ``nlp.pipe`` batches.

- **memory**: each saved variant in a fresh process, annotating like a service: 50
  held-out sentences, ``VmRSS`` (after ``gc.collect`` and ``malloc_trim``, so that only
  memory still in use counts), one 100,000-character text, 30 more sentences, ``VmRSS``
  again. Accelerated variants twice: as served (``release``) and with the runtime keeping
  its working memory as before issue 60 (``keep``:
  ``working_memory.RELEASE_AFTER_PIECES`` out of reach).
- **speed**: one process holding every accelerated variant, the two policies alternating
  round by round: the median ``nlp(text)`` over held-out sentences and the wall time of
  ``nlp.pipe`` over paragraphs at batch size 64 and at the pipeline's own batch size, each
  policy's against the other's.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from spacy_accelerate.runtime import working_memory

#: The long request's length in characters (examples/web_service.py's limit).
LONG_CHARACTERS = 100_000
POLICIES = {"release": working_memory.RELEASE_AFTER_PIECES, "keep": sys.maxsize}

#: argv: the saved folder, a JSON file of sentences, the policy, the long text's length;
#: prints one JSON line (MiB).
PROBE = """
import ctypes, gc, json, sys
import spacy
from spacy_accelerate.runtime import working_memory
folder, texts, policy = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
working_memory.RELEASE_AFTER_PIECES = int(policy)
def rss():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
nlp = spacy.load(folder)
for text in texts[:50]:
    nlp(text)
before = rss()
nlp(" ".join(texts * 100)[:int(sys.argv[4])])
for text in texts[50:80]:
    nlp(text)
after = rss()
print(json.dumps({"before_mib": before, "after_mib": after, "growth_mib": after - before}))
"""


def memory_row(folder: Path, sentences_file: Path, policy: str) -> dict[str, float]:
    command = [sys.executable, "-c", PROBE, str(folder), str(sentences_file)]
    done = subprocess.run(
        [*command, str(POLICIES[policy]), str(LONG_CHARACTERS)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the long request on {folder} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def speed_rows(
    folders: dict[str, Path], sentences: list[str], paragraphs: list[str], rounds: int
) -> dict[str, Any]:
    """Each accelerated variant's single-document median and batch time under both
    policies, alternating round by round (in this process)."""
    import spacy

    pipelines = {variant: spacy.load(folder) for variant, folder in folders.items()}
    timings: dict[str, dict[str, dict[str, list[float]]]] = {
        variant: {policy: {} for policy in POLICIES} for variant in pipelines
    }
    for turn in range(rounds + 1):  # the first round warms up, untimed
        order = list(POLICIES) if turn % 2 == 0 else list(POLICIES)[::-1]
        for policy in order:
            working_memory.RELEASE_AFTER_PIECES = POLICIES[policy]
            for variant, nlp in pipelines.items():
                timed = _time(nlp, sentences, paragraphs)
                for name, value in timed.items():
                    if turn:
                        timings[variant][policy].setdefault(name, []).append(value)
    working_memory.RELEASE_AFTER_PIECES = POLICIES["release"]
    return {variant: _compared(rows) for variant, rows in timings.items()}


def _time(nlp: Any, sentences: list[str], paragraphs: list[str]) -> dict[str, float]:
    """The median ``nlp(text)`` over ``sentences`` (ms), and the wall time of ``nlp.pipe``
    over ``paragraphs`` at batch size 64 (runs under the release threshold) and at the
    pipeline's own batch size over four times as many (runs over it: every batch gives its
    memory back)."""
    seconds = []
    for text in sentences:
        started = time.perf_counter()
        nlp(text)
        seconds.append(time.perf_counter() - started)
    timed = {"single_ms": statistics.median(seconds) * 1e3}
    for name, texts, size in (
        ("batch_64_s", paragraphs, 64),
        (f"batch_{nlp.batch_size}_s", paragraphs * 4, nlp.batch_size),
    ):
        started = time.perf_counter()
        for _ in nlp.pipe(texts, batch_size=size):
            pass
        timed[name] = time.perf_counter() - started
    return timed


def _compared(rows: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    medians = {
        policy: {name: statistics.median(values) for name, values in row.items()}
        for policy, row in rows.items()
    }
    release, keep = medians["release"], medians["keep"]
    return medians | {
        "release_vs_keep": {name: release[name] / keep[name] for name in release},
    }


def long_request_rows(
    folders: dict[str, Path], plain: str, sentences: list[str], paragraphs: list[str], rounds: int
) -> dict[str, Any]:
    """The memory of every variant (``plain`` once, the others under both policies) and the
    accelerated variants' speed under both."""
    sentences_file = Path(tempfile.mkdtemp(prefix="long-request-")) / "sentences.json"
    sentences_file.write_text(json.dumps(sentences))
    memory: dict[str, Any] = {plain: memory_row(folders[plain], sentences_file, "keep")}
    for variant, folder in folders.items():
        if variant != plain:
            memory[variant] = {p: memory_row(folder, sentences_file, p) for p in POLICIES}
    accelerated = {variant: folder for variant, folder in folders.items() if variant != plain}
    speed = speed_rows(accelerated, sentences, paragraphs, rounds)
    return {"memory": memory, "speed": speed}
