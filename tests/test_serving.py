"""Serving one document per call: ``workload="documents"`` says so, is kept when the
pipeline is saved, and ``precision="auto"`` times its candidates that way; a single
document is annotated as ``nlp.pipe`` annotates it; the runtime's threads leave the CPUs
to the caller between two runs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import spacy
from annotations import disagreements
from spacy.language import Language

import spacy_accelerate
from spacy_accelerate import InvalidOptionError
from spacy_accelerate.pipeline.persist import CALLBACK_KEY
from spacy_accelerate.planning import auto_precision, auto_search


def test_the_workload_round_trips_through_to_disk_and_load(
    roberta: Language, cache_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    with caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        spacy_accelerate.optimize(roberta, provider="cpu", workload="documents")
    assert "overlap off (single documents (workload='documents'))" in caplog.text
    assert roberta.config["nlp"][CALLBACK_KEY]["workload"] == "documents"
    roberta.to_disk(tmp_path / "saved")
    loaded = spacy.load(tmp_path / "saved")
    assert spacy_accelerate.is_optimized(loaded)
    assert loaded.config["nlp"][CALLBACK_KEY]["workload"] == "documents"
    assert not loaded.config["nlp"][CALLBACK_KEY]["overlap_plan"]["overlap"]
    loaded.to_disk(tmp_path / "again")
    assert spacy.load(tmp_path / "again").config["nlp"][CALLBACK_KEY]["workload"] == "documents"


def test_an_unknown_workload_names_the_choices(roberta: Language):
    with pytest.raises(InvalidOptionError, match="'batches', 'documents'"):
        spacy_accelerate.optimize(roberta, provider="cpu", workload="requests")


def test_single_documents_are_annotated_as_nlp_pipe_annotates_them(
    roberta: Language, cache_dir: Path, ewt_texts: list[str]
):
    spacy_accelerate.optimize(roberta, provider="cpu", workload="documents")
    texts = ewt_texts[:24]
    one_by_one = [roberta(text) for text in texts]
    assert disagreements(list(roberta.pipe(texts, batch_size=8)), one_by_one, roberta) == []


def test_auto_times_a_documents_workload_one_document_per_call(
    bert: Language, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    calls: list[str] = []
    single = Language.__call__

    def counted(nlp: Language, text: str, *args: object, **kwargs: object) -> object:
        calls.append(text)
        return single(nlp, text, *args, **kwargs)

    monkeypatch.setattr(Language, "__call__", counted)
    spacy_accelerate.optimize(bert, "cpu", "auto", workload="batches")
    in_batches = len(calls)
    spacy_accelerate.optimize(bert, "cpu", "auto", workload="documents")  # another choice
    timed = auto_search.timed_texts(auto_search.builtin_texts())
    # every passing plan at least its first turn, one call per timed text
    assert len(calls) - in_batches >= len(timed)
    choices = [
        json.loads((entry.path / auto_precision.CHOICE_FILE).read_text())
        for entry in spacy_accelerate.list_cached(cache_dir)
        if (entry.path / auto_precision.CHOICE_FILE).exists()
    ]
    assert sorted(choice["workload"] for choice in choices) == ["batches", "documents"]
    proxy = spacy_accelerate.accelerated_components(bert)["transformer"]
    assert proxy.exported.auto_choice is not None
    assert "one document per call" in proxy.exported.auto_choice


def test_onnx_runtimes_threads_sleep_between_runs(roberta: Language, cache_dir: Path):
    spacy_accelerate.optimize(roberta, provider="cpu")
    session = spacy_accelerate.accelerated_components(roberta)["transformer"].session
    options = session._session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
