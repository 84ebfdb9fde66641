"""Ray Data scale-out (:mod:`spacy_accelerate.ray`): one local Ray instance for the module,
over UD-EWT test sentences and the tiny RoBERTa sample.

The actors import a ``code`` file written here: it logs each actor's start (which process,
and whether its model was a cache hit or an export) to a file the test reads back, and
registers ``test_markers``, a component that raises on one marker text and kills its own
process (once, guarded by a file created atomically) on another, and ``test_barrier``, which
holds an actor's first document until every actor has started.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

# Importing ray.data configures its log handler, which keeps the sys.stderr of that moment
# (Ray 2.60's PlainRayHandler): here, at collection, that is pytest's session-long stream,
# not one test's capsys buffer, closed when that test ends.
import ray.data  # noqa: F401, E402
import spacy
from at_once import start_local_ray
from spacy.tokens import DocBin
from spacy.util import import_file
from spacy_accelerate_samples import ewt

import spacy_accelerate
from spacy_accelerate.errors import InvalidOptionError, ProviderUnavailableError
from spacy_accelerate.ray import FIELDS, annotate

#: Rows of the acceptance test (the issue asks for >= 2,000 UD-EWT test sentences).
ACCEPTANCE_ROWS = 2000
RAISE = "RAISE-MARKER"
#: The actors' ``optimize()`` options: the same model as a default call (no warm-up or
#: re-check at start, which the test's time budget cannot spare).
OPTIONS = {"provider": "cpu", "warmup": False, "verify": False}
KILL = "KILL-MARKER"

CODE = '''
"""Loaded by each actor (annotate's ``code``): a start log and the marker component."""
import logging
import os
import time
from pathlib import Path

from spacy.language import Language

LOG = Path(__file__).with_name("actors.log")


class _Starts(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if message.startswith("ray actor:"):
            with LOG.open("a") as log:
                log.write(f"{os.getpid()} {message}\\n")


_logger = logging.getLogger("spacy_accelerate")
_logger.setLevel(logging.INFO)
_logger.addHandler(_Starts())


@Language.factory("test_markers", default_config={"guard": ""})
def make_markers(nlp, name, guard):
    def markers(doc):
        if "RAISE-MARKER" in doc.text:
            raise ValueError("the marker component refuses this text")
        if "KILL-MARKER" in doc.text and guard:
            try:
                os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return doc  # killed once already: annotate as usual
            os.kill(os.getpid(), 9)  # SIGKILL: the worker process dies mid-batch
        return doc

    return markers


@Language.factory("test_barrier", default_config={"lines": 0})
def make_barrier(nlp, name, lines):
    """Holds each actor's first document until ``lines`` actor starts are logged (60 s at
    most), so that every actor of the pool has loaded before any batch finishes."""
    waited = []

    def barrier(doc):
        if not waited:
            deadline = time.monotonic() + 60
            while len(_lines()) < lines and time.monotonic() < deadline:
                time.sleep(0.05)
            waited.append(True)
        return doc

    return barrier


def _lines():
    return LOG.read_text().splitlines() if LOG.is_file() else []
'''


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """One local Ray instance for the module (two CPUs, as the issue asks)."""
    start_local_ray()
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def sentences() -> list[Any]:
    found = ewt.read_sentences("test")
    assert len(found) >= ACCEPTANCE_ROWS
    return found


@pytest.fixture(scope="module")
def code_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ray-code")
    path = folder / "markers.py"
    path.write_text(CODE)
    import_file("python_code", path)  # the factory, for the pipeline saved here
    return path


def _starts(code_file: Path) -> list[str]:
    log = code_file.with_name("actors.log")
    return log.read_text().splitlines() if log.is_file() else []


@pytest.fixture(scope="module")
def marked_pipeline(
    sample_path: Callable[[str], Path], code_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The RoBERTa sample with ``test_markers`` last, saved where the actors load it."""
    folder = tmp_path_factory.mktemp("ray-pipeline")
    nlp = spacy.load(sample_path("roberta"))
    nlp.add_pipe("test_markers", config={"guard": str(folder / "killed-once")})
    nlp.to_disk(folder / "pipeline")
    return folder / "pipeline"


def _rows(sentences: list[Any], count: int) -> list[dict[str, Any]]:
    return [
        {"id": index, "sent_id": sentence.sent_id, "text": sentence.text}
        for index, sentence in enumerate(sentences[:count])
    ]


def _by_id(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for row in rows:
        assert row["id"] not in found, f"row {row['id']} came out twice"
        found[row["id"]] = row
    return found


def _reference(pipeline: Path, cache: Path, texts: list[str]) -> list[dict[str, Any]]:
    """Single-process ``nlp.pipe`` of the same accelerated pipeline (same cache)."""
    nlp = spacy_accelerate.optimize(spacy.load(pipeline), **OPTIONS, cache_dir=cache)
    assert all(p.exported.cache_hit for p in spacy_accelerate.accelerated_components(nlp).values())
    return [
        {
            "tags": [token.tag_ for token in doc],
            "deps": [token.dep_ for token in doc],
            "heads": [token.head.i for token in doc],
            "entities": [
                {"start_char": ent.start_char, "end_char": ent.end_char, "label": ent.label_}
                for ent in doc.ents
            ],
            "sents": [[sent.start_char, sent.end_char] for sent in doc.sents],
        }
        for doc in nlp.pipe(texts, batch_size=64)
    ]


@pytest.mark.slow
def test_two_actors_annotate_every_row_once_as_one_process_does(
    local_ray: Any,
    sentences: list[Any],
    sample_path: Callable[[str], Path],
    code_file: Path,
    tmp_path: Path,
):
    rows = _rows(sentences, ACCEPTANCE_ROWS)
    cache = tmp_path / "model-cache"
    before = len(_starts(code_file))
    dataset = local_ray.data.from_items(rows)
    annotated = annotate(
        dataset,
        sample_path("roberta"),
        optimize_options={**OPTIONS, "cache_dir": cache},
        fields=("tags", "deps", "heads", "entities", "sents", "docbin"),
        batch_size=64,
        concurrency=2,
        num_cpus=1,
        code=code_file,
    )
    out = _by_id(annotated.take_all())

    assert sorted(out) == list(range(len(rows)))
    for row in rows:  # each row's own columns, intact
        got = out[row["id"]]
        assert (got["sent_id"], got["text"]) == (row["sent_id"], row["text"])
        assert got["error"] is None
    reference = _reference(sample_path("roberta"), cache, [row["text"] for row in rows])
    for row, expected in zip(rows, reference, strict=True):
        got = out[row["id"]]
        assert {key: got[key] for key in expected} == expected, row["text"]
    first = DocBin().from_bytes(out[0]["docbin"]).get_docs(spacy.blank("en").vocab)
    assert [token.tag_ for token in next(first)] == out[0]["tags"]

    # Two actors, one export: one cache entry, one actor exported it, the other hit.
    assert len(spacy_accelerate.list_cached(cache)) == 1
    starts = _starts(code_file)[before:]
    assert len(starts) == 2, starts
    assert len({line.split()[0] for line in starts}) == 2, starts  # two processes
    assert sum(", exported," in line for line in starts) == 1, starts
    assert sum(", cache hit," in line for line in starts) == 1, starts


@pytest.mark.slow
def test_a_killed_actor_loses_no_row_and_repeats_none(
    local_ray: Any, sentences: list[Any], marked_pipeline: Path, code_file: Path, tmp_path: Path
):
    rows = _rows(sentences, 400)
    rows[250]["text"] = f"{KILL} {rows[250]['text']}"
    guard = marked_pipeline.parent / "killed-once"
    before = len(_starts(code_file))
    annotated = annotate(
        local_ray.data.from_items(rows),
        marked_pipeline,
        optimize_options={**OPTIONS, "cache_dir": tmp_path / "model-cache"},
        fields=("entities",),
        batch_size=25,
        concurrency=2,
        code=code_file,
    )
    out = _by_id(annotated.take_all())

    assert guard.is_file()  # the marker row was reached, and its actor killed itself
    assert sorted(out) == list(range(len(rows)))
    assert all(out[row["id"]]["text"] == row["text"] for row in rows)
    assert all(row["error"] is None for row in out.values())
    assert len(_starts(code_file)[before:]) >= 3  # two actors, and the restart of one


@pytest.mark.slow
def test_bad_rows_are_kept_with_their_error(
    local_ray: Any, sentences: list[Any], marked_pipeline: Path, code_file: Path, tmp_path: Path
):
    rows: list[dict[str, Any]] = _rows(sentences, 40)
    rows[3]["text"] = None
    rows[4]["text"] = 42
    rows[5]["text"] = f"{RAISE} {rows[5]['text']}"
    cache = tmp_path / "model-cache"
    annotated = annotate(
        local_ray.data.from_items(rows, override_num_blocks=1),  # one batch: bad and good
        marked_pipeline,
        optimize_options={**OPTIONS, "cache_dir": cache},
        fields=("tags", "entities", "docbin"),
        batch_size=64,
        code=code_file,
    )
    out = _by_id(annotated.take_all())

    assert sorted(out) == list(range(len(rows)))
    assert "null" in out[3]["error"]
    assert "int" in out[4]["error"] and "not a string" in out[4]["error"]
    assert "ValueError" in out[5]["error"] and "refuses" in out[5]["error"]
    for bad in (3, 4, 5):
        assert (out[bad]["tags"], out[bad]["entities"], out[bad]["docbin"]) == ([], [], None)
    good = [row for row in rows if row["id"] not in (3, 4, 5)]
    reference = _reference(marked_pipeline, cache, [row["text"] for row in good])
    for row, expected in zip(good, reference, strict=True):
        got = out[row["id"]]
        assert got["error"] is None
        assert (got["tags"], got["entities"]) == (expected["tags"], expected["entities"])
        assert got["docbin"]


def test_a_bad_field_or_text_column_is_refused_before_any_work(
    local_ray: Any, sample_path: Callable[[str], Path], tmp_path: Path
):
    dataset = local_ray.data.from_items([{"id": 1, "body": "Hello there."}])
    cache = tmp_path / "model-cache"
    options = {"provider": "cpu", "cache_dir": cache}
    with pytest.raises(InvalidOptionError, match="'nouns'") as bad_field:
        annotate(
            dataset,
            sample_path("roberta"),
            text_column="body",
            fields=("tags", "nouns"),
            optimize_options=options,
        )
    assert all(name in str(bad_field.value) for name in FIELDS)
    with pytest.raises(InvalidOptionError, match="no column 'text'") as missing:
        annotate(dataset, sample_path("roberta"), optimize_options=options)
    assert "'id'" in str(missing.value) and "'body'" in str(missing.value)
    with pytest.raises(InvalidOptionError, match="precisoin"):
        annotate(
            dataset,
            sample_path("roberta"),
            text_column="body",
            optimize_options={"precisoin": "fp16"},
        )
    assert not cache.exists()  # no actor started, nothing exported


def test_without_ray_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ProviderUnavailableError, match=r"pip install 'spacy-accelerate\[ray\]'"):
        annotate(None, "unused")  # type: ignore[arg-type]


def test_importing_the_library_does_not_import_ray():
    script = textwrap.dedent(
        """
        import sys
        import spacy_accelerate
        assert "ray" not in sys.modules, "ray imported"
        assert not any(name.startswith("spacy_accelerate.ray") for name in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_a_bundled_pipeline_is_served_from_its_bundle_in_every_actor(
    local_ray: Any,
    sentences: list[Any],
    sample_path: Callable[[str], Path],
    code_file: Path,
    tmp_path: Path,
):
    cache = tmp_path / "model-cache"
    nlp = spacy_accelerate.optimize(spacy.load(sample_path("roberta")), **OPTIONS, cache_dir=cache)
    rows = _rows(sentences, 60)
    expected = [[t.tag_ for t in doc] for doc in nlp.pipe([row["text"] for row in rows])]
    before = len(_starts(code_file))
    nlp.add_pipe("test_barrier", config={"lines": before + 2})  # both actors load first
    nlp.to_disk(tmp_path / "bundled")
    shutil.rmtree(cache)  # the cache the saved options name: gone, and never written again
    annotated = annotate(
        local_ray.data.from_items(rows),
        tmp_path / "bundled",
        fields=("tags",),
        batch_size=20,
        concurrency=2,
        code=code_file,
    )
    out = _by_id(annotated.take_all())

    assert [out[row["id"]]["tags"] for row in rows] == expected
    starts = _starts(code_file)[before:]
    assert len(starts) == 2 and all(", bundled," in line for line in starts), starts
    assert not cache.exists()  # no export, no cache entry, no lock file
