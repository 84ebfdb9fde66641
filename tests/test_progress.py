"""What the library says while it works (:mod:`spacy_accelerate.progress`): its own steps
as INFO lines (a bar on a terminal), nothing when quiet, and no third-party chatter
(NNCF's bars and tables) below verbose."""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import spacy

import spacy_accelerate
from spacy_accelerate import progress
from spacy_accelerate.progress import Verbosity

#: What NNCF writes on stdout while it quantizes: rich progress bars and INFO tables.
NNCF_MARKS = ("Statistics collection", "Applying", "━", "INFO:nncf")


@pytest.fixture(autouse=True)
def normal_verbosity() -> Iterator[None]:
    progress.set_verbosity(Verbosity.NORMAL)
    yield
    progress.set_verbosity(Verbosity.NORMAL)


@pytest.fixture()
def said(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The library's INFO lines so far."""
    caplog.set_level(logging.INFO, logger="spacy_accelerate")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "spacy_accelerate"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_step_is_info_lines_where_stderr_is_no_terminal(said, capfd):
    with progress.step("quantizing", total=2) as advance:
        advance()
        progress.note("plan 2 of 5")
        advance()
    lines = said()
    assert lines[0] == "spacy-accelerate: quantizing (0 of 2)"
    assert "spacy-accelerate: quantizing: plan 2 of 5" in lines
    assert lines[-1].startswith("spacy-accelerate: quantizing: finished (2 of 2, ")
    assert capfd.readouterr().err == ""  # no bar where stderr is no terminal


def test_steps_nest_and_notes_go_to_the_innermost(said):
    with progress.step("searching plans"):
        with progress.step("annotating", total=3):
            progress.note("inner")
        progress.note("outer")
        assert list(progress.track([1, 2], "measuring")) == [1, 2]
    progress.note("no step open")
    lines = said()
    assert "spacy-accelerate: annotating: inner" in lines
    assert "spacy-accelerate: searching plans: outer" in lines
    assert any(line.startswith("spacy-accelerate: measuring: finished (2 of 2") for line in lines)
    assert lines[-1] == "spacy-accelerate: no step open"


def test_nothing_is_said_when_quiet_or_when_there_is_nothing_to_do(said, capfd, monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Terminal())
    with progress.step("nothing to do", total=0) as advance:
        advance(0)
    assert said() == [] and sys.stderr.getvalue() == ""
    progress.set_verbosity(Verbosity.QUIET)
    with progress.step("quantizing", total=3) as advance:
        advance()
        progress.note("plan 1")
    progress.note("alone")
    assert said() == [] and sys.stderr.getvalue() == ""


def test_a_step_is_a_bar_on_a_terminal(said, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress.step("calibrating", total=4) as advance:
        advance(2)
        progress.note("plan 1: all layers int8")
    drawn = terminal.getvalue()
    assert "calibrating" in drawn and "2/4" in drawn and "plan 1: all layers int8" in drawn
    assert said() == []  # a bar, not log lines as well


def test_third_party_output_is_dropped_below_verbose(capfd):
    nncf_like = logging.getLogger("spacy_accelerate_test.third_party")
    nncf_like.propagate = False
    handler = logging.StreamHandler(sys.stdout)
    nncf_like.addHandler(handler)
    nncf_like.setLevel(logging.INFO)
    others_line = threading.Event()

    def other_thread() -> None:  # running before the block: its output is its own
        others_line.wait()
        print("other thread", flush=True)

    other = threading.Thread(target=other_thread)
    other.start()
    try:
        with progress.third_party_output("spacy_accelerate_test.third_party"):
            assert not sys.stdout.isatty()  # progress libraries draw nothing meanwhile
            print("bar of this thread")
            nncf_like.info("table")
            started = threading.Thread(target=print, args=("bar of a thread it started",))
            started.start()
            started.join()
            others_line.set()
            other.join()
        assert nncf_like.level == logging.INFO
        print("after")
        out = capfd.readouterr().out
        assert "other thread" in out and "after" in out
        assert "bar of" not in out and "table" not in out
        progress.set_verbosity(Verbosity.VERBOSE)
        with progress.third_party_output("spacy_accelerate_test.third_party"):
            print("bar of this thread")
        assert "bar of this thread" in capfd.readouterr().out
    finally:
        others_line.set()
        other.join()
        nncf_like.removeHandler(handler)


def test_a_packages_records_on_the_root_logger_are_dropped_below_verbose(caplog):
    """ONNX Runtime's quantizer logs a line per tensor on the root logger."""
    caplog.set_level(logging.INFO)
    path = os.path.join(os.sep, "site-packages", "onnxruntime", "quantization", "q.py")

    def chatter(level: int = logging.INFO) -> None:
        record = logging.LogRecord("root", level, path, 1, "ort chatter", None, None)
        logging.getLogger().handle(record)

    with progress.third_party_output(root_records_of=["onnxruntime"]):
        chatter()
        chatter(logging.WARNING)  # warnings still reach the user
        logging.getLogger().info("our own line")
    assert [r.getMessage() for r in caplog.records] == ["ort chatter", "our own line"]
    assert caplog.records[0].levelno == logging.WARNING
    chatter()
    assert len(caplog.records) == 3


def _int8(nlp: spacy.Language, texts: list[str], cache: Path) -> None:
    spacy_accelerate.optimize(
        nlp, "openvino", "int8", cache_dir=cache, min_agreement=0.95, calibration_texts=texts
    )


#: The step OpenVINO's int8 search is said as.
SEARCHING = "OpenVINO int8: quantizing with NNCF, racing and judging plans"


@pytest.mark.slow
def test_openvino_int8_says_its_steps_and_keeps_nncf_quiet_unless_verbose(
    sample_path: Callable[[str], Path],
    ewt_texts: list[str],
    tmp_path: Path,
    said: Callable[[], list[str]],
    capfd: pytest.CaptureFixture[str],
):
    texts = ewt_texts[:20]  # over 1,000 tokens: the fewest calibration texts allowed
    nlp = spacy.load(sample_path("roberta"))
    _int8(nlp, texts, tmp_path / "normal")
    out = capfd.readouterr().out
    assert not [mark for mark in NNCF_MARKS if mark in out], out
    lines = said()
    for step in (
        "spacy-accelerate: exporting the roberta encoder to ONNX",
        "spacy-accelerate: calibrating: PyTorch fp32 annotates the texts",
        f"spacy-accelerate: {SEARCHING}",
        f"spacy-accelerate: {SEARCHING}: plan 1: all layers int8",
        f"spacy-accelerate: {SEARCHING}: NNCF post-training quantization",
        f"spacy-accelerate: {SEARCHING}: racing all layers int8",
        "spacy-accelerate: judging the plan: the pipeline annotates the calibration texts",
    ):
        assert any(line.startswith(step) for line in lines), (step, lines)

    progress.set_verbosity(Verbosity.VERBOSE)
    _int8(spacy.load(sample_path("roberta")), texts, tmp_path / "verbose")
    assert "Statistics collection" in capfd.readouterr().out  # NNCF's own bar, as asked


def test_a_quiet_optimize_says_nothing_of_its_steps(
    sample_path: Callable[[str], Path], cache_dir: Path, said: Callable[[], list[str]]
):
    progress.set_verbosity(Verbosity.QUIET)
    spacy_accelerate.optimize(spacy.load(sample_path("roberta")), "cpu", "fp32")
    assert not [line for line in said() if "exporting" in line or "finished (" in line]
    progress.set_verbosity(Verbosity.NORMAL)
    spacy_accelerate.optimize(spacy.load(sample_path("roberta")), "cpu", "fp32")
    assert any("checking the cached model against PyTorch" in line for line in said())
