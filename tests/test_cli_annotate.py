"""``spacy-accelerate annotate``: a corpus through Ray Data into one Parquet or JSONL file.

One local Ray (two CPUs) serves the whole file: the command finds it running and leaves
it running. The mistakes a user can make are refused as one ``Error:`` line before Ray
is even imported, except a missing text column, which needs the input's schema.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import ray

# Importing ray.data configures its log handler, which keeps the sys.stderr of that moment
# (Ray 2.60's PlainRayHandler): here, at collection, that is pytest's session-long stream,
# not one test's capsys buffer, closed when that test ends.
import ray.data  # noqa: F401, E402
from spacy_accelerate_samples import ewt

from spacy_accelerate.cli import annotate as annotate_cli
from spacy_accelerate.cli import main

SENTENCES = 50
SUMMARY = re.compile(r"^(\d+) rows \((\d+) with errors\) in [\d.]+ s, [\d,.]+ rows/s -> (.+)$")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One Ray for the file; a Ray the caller started is the command's to reuse."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return [sentence.text for sentence in ewt.read_sentences("test")[:SENTENCES]]


@pytest.fixture()
def roberta(sample_path: Callable[[str], Path]) -> Path:
    return sample_path("roberta")


@pytest.fixture()
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the command gets as far as importing Ray."""

    def reached() -> None:
        raise AssertionError("the command reached Ray before refusing")

    monkeypatch.setattr(annotate_cli, "_import_ray", reached)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The console script on ``args``: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as exited:
        main(["annotate", *args])
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out, captured.err


def one_error(status: int, err: str, pattern: str) -> None:
    assert status == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("Error: ") and pattern in lines[0], lines[0]


def summary(out: str) -> tuple[int, int, str]:
    last = out.strip().splitlines()[-1]
    matched = SUMMARY.match(last)
    assert matched, out
    return int(matched[1]), int(matched[2]), matched[3]


def test_fields_known_to_the_command_are_the_librarys():
    from spacy_accelerate.ray import FIELDS

    assert tuple(annotate_cli.KNOWN_FIELDS) == tuple(FIELDS)


@pytest.mark.slow  # a local Ray instance
def test_a_jsonl_corpus_comes_back_as_one_parquet_file_every_row_once(
    local_ray: None,
    roberta: Path,
    sentences: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
):
    import pyarrow.parquet as pq

    source = tmp_path / "corpus.jsonl"
    rows = [{"id": i, "text": text, "source": f"ewt-{i}"} for i, text in enumerate(sentences)]
    rows.append({"id": SENTENCES, "text": None, "source": "empty"})  # a bad row, kept
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = tmp_path / "out" / "annotated.parquet"
    status, out, err = run(
        capsys,
        str(roberta),
        str(source),
        str(output),
        "--fields",
        "tags,entities",
        "--provider",
        "cpu",
        "--workers",
        "1",
        "--batch-size",
        "16",
    )
    assert status == 0, err
    assert summary(out) == (SENTENCES + 1, 1, str(output))
    table = pq.read_table(output).to_pylist()
    assert sorted(row["id"] for row in table) == list(range(SENTENCES + 1))
    by_id = {row["id"]: row for row in table}
    for given in rows:
        got = by_id[given["id"]]
        assert (got["text"], got["source"]) == (given["text"], given["source"])
        assert {"tags", "entities", "error"} <= got.keys()
        if given["text"] is None:
            assert got["error"] and not got["tags"]
        else:
            assert got["error"] is None and len(got["tags"]) >= 1
    assert not list(output.parent.glob(".*partial"))  # written beside it, then renamed


@pytest.mark.slow  # a local Ray instance
def test_a_text_file_comes_back_as_one_jsonl_file(
    local_ray: None,
    roberta: Path,
    sentences: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
):
    source = tmp_path / "corpus.txt"
    source.write_text("\n".join(sentences) + "\n")
    output = tmp_path / "annotated.jsonl"
    output.write_text("an older run\n")
    status, out, err = run(
        capsys,
        str(roberta),
        str(source),
        str(output),
        "--fields",
        "pos,sents",
        "--provider",
        "cpu",
        "--workers",
        "1",
        "--overwrite",
        "--quiet",
    )
    assert status == 0, err
    assert summary(out) == (SENTENCES, 0, str(output))
    got = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(row["text"] for row in got) == sorted(sentences)
    for row in got:
        assert row["error"] is None and row["pos"] and row["sents"]


@pytest.mark.slow  # a local Ray instance
def test_a_missing_text_column_is_one_error_line(
    local_ray: None, roberta: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    source = tmp_path / "corpus.jsonl"
    source.write_text(json.dumps({"body": "No text column here."}) + "\n")
    output = tmp_path / "out.parquet"
    status, _, err = run(capsys, str(roberta), str(source), str(output), "--quiet")
    one_error(status, err, "text")
    assert not output.exists()


@pytest.mark.parametrize(
    ("extra", "output_name", "pattern"),
    [
        (["--fields", "tags,colour"], "out.parquet", "unknown field(s) colour"),
        ([], "out.csv", ".parquet"),
        ([], "exists.parquet", "--overwrite"),
        (["--text-column", "body"], "out.parquet", "plain text INPUT has one column"),
    ],
    ids=["bad-field", "unknown-suffix", "existing-output", "text-column-of-plain-text"],
)
def test_mistakes_are_one_error_line_before_ray_starts(
    no_ray: None,
    roberta: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    output_name: str,
    pattern: str,
):
    source = tmp_path / "corpus.txt"
    source.write_text("One document.\n")
    (tmp_path / "exists.parquet").write_bytes(b"keep me")
    status, _, err = run(capsys, str(roberta), str(source), str(tmp_path / output_name), *extra)
    one_error(status, err, pattern)
    assert (tmp_path / "exists.parquet").read_bytes() == b"keep me"
    if output_name == "out.csv":
        assert ".jsonl" in err


def test_without_ray_the_error_says_what_to_install(
    roberta: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    source = tmp_path / "corpus.txt"
    source.write_text("One document.\n")
    status, _, err = run(capsys, str(roberta), str(source), str(tmp_path / "out.parquet"))
    one_error(status, err, "pip install 'spacy-accelerate[ray]'")
