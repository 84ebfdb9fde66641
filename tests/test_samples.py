"""The EWT reader and the offline sample pipelines that the rest of the suite builds on."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy
import pytest
import spacy
from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate.samples import (
    Sentence,
    build_bert_sample,
    build_minilm_sample,
    build_roberta_sample,
    ensure_sample,
    group_documents,
    load_documents,
    read_sentences,
    to_gold_doc,
)
from spacy_accelerate.samples.pipelines import (
    BERT_SPEC,
    PIECE_VOCAB_DIR,
    ROBERTA_SPEC,
    curated_torch_module,
    minilm_model_path,
    minilm_spec,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ARGENTINA_SENT = "answers-20080426140040AA4YiX5_ans-0002"
PIPE_NAMES = ["transformer", "tagger", "parser", "ner"]
# Measured on UD_English-EWT @ 15d613d8 / UNER_English-EWT @ 8ed072de.
SENTENCE_COUNTS = {"test": 2077, "dev": 2001}
UNALIGNED_NER = {"test": 3, "dev": 3}


# --------------------------------------------------------------------------- EWT reader


@pytest.fixture(scope="module", params=["test", "dev"])
def split_sentences(request: pytest.FixtureRequest) -> tuple[str, list[Sentence]]:
    return request.param, read_sentences(request.param)


@pytest.fixture(scope="module")
def test_sentences() -> list[Sentence]:
    return read_sentences("test")


def test_sentence_counts(split_sentences: tuple[str, list[Sentence]]) -> None:
    split, sentences = split_sentences
    assert len(sentences) == SENTENCE_COUNTS[split]
    assert len({s.sent_id for s in sentences}) == len(sentences)


def test_sentence_fields_line_up(split_sentences: tuple[str, list[Sentence]]) -> None:
    _, sentences = split_sentences
    for s in sentences:
        n = len(s.words)
        assert len(s.spaces) == len(s.upos) == len(s.xpos) == len(s.deps) == n
        assert all(0 <= h < n for h in s.heads)
        assert [i for i, h in enumerate(s.heads) if s.deps[i] == "ROOT"] == [
            i for i, h in enumerate(s.heads) if h == i
        ]


def test_sentence_text_round_trips(split_sentences: tuple[str, list[Sentence]]) -> None:
    _, sentences = split_sentences
    mismatched = [s for s in sentences if s.reconstructed_text() != s.text]
    # spaCy spaces are booleans, so a "SpacesAfter=\u00a0" becomes a plain space.
    assert all(s.reconstructed_text() == s.text.replace("\xa0", " ") for s in mismatched)
    assert len(mismatched) <= 1


def test_unaligned_ner_is_missing_not_outside(
    split_sentences: tuple[str, list[Sentence]],
) -> None:
    split, sentences = split_sentences
    missing = [s for s in sentences if s.ner is None]
    assert len(missing) == UNALIGNED_NER[split]
    doc = to_gold_doc(spacy.blank("en").vocab, missing[:1])
    assert {t.ent_iob_ for t in doc} == {""}


def test_multiword_token_has_no_inner_space(test_sentences: list[Sentence]) -> None:
    sentence = next(s for s in test_sentences if "we've" in s.text)
    i = sentence.words.index("'ve")
    assert sentence.words[i - 1].lower() == "we"
    assert sentence.spaces[i - 1] is False


def test_argentina_is_a_location(test_sentences: list[Sentence]) -> None:
    sentence = next(s for s in test_sentences if s.sent_id == ARGENTINA_SENT)
    doc = to_gold_doc(spacy.blank("en").vocab, [sentence])
    assert [(e.text, e.label_) for e in doc.ents] == [("Argentina", "LOC")]
    assert doc.text == "It is a place in Argentina lol"
    assert doc[3].dep_ == "ROOT" and doc[3].pos_ == "NOUN" and doc[3].tag_ == "NN"


def test_group_documents_respects_doc_boundaries(test_sentences: list[Sentence]) -> None:
    groups = group_documents(test_sentences, max_sentences=5)
    assert [s for g in groups for s in g] == test_sentences
    assert all(1 <= len(g) <= 5 and len({s.doc_id for s in g}) == 1 for g in groups)
    # A group is only cut short by the size limit or a new document.
    for left, right in zip(groups, groups[1:], strict=False):
        assert len(left) == 5 or left[-1].doc_id != right[0].doc_id


def test_gold_docs_keep_text_sentences_and_entities() -> None:
    sentences = read_sentences("test")[:200]
    docs = load_documents("test", max_sentences=4, limit_sentences=200)
    assert sum(len(list(d.sents)) for d in docs) == 200
    flat = iter(sentences)
    for doc in docs:
        for span in doc.sents:
            sentence = next(flat)
            assert span.text == sentence.reconstructed_text()
            assert [t.tag_ for t in span] == list(sentence.xpos)
            assert [t.head.i - span.start for t in span] == list(sentence.heads)
        assert not doc[-1].whitespace_
    n_ents = sum(len(d.ents) for d in docs)
    gold_b = sum(t.startswith("B-") for s in sentences for t in s.ner or ())
    assert n_ents == gold_b > 0


def test_doc_text_joins_sentences() -> None:
    sentences = read_sentences("test")[:8]
    doc = to_gold_doc(spacy.blank("en").vocab, sentences)
    expected = "".join(
        s.text + (" " if s.spaces[-1] and i < len(sentences) - 1 else "")
        for i, s in enumerate(sentences)
    )
    assert doc.text == expected


# --------------------------------------------------------------------------- sample pipelines


def _timed_build(builder: Callable[..., Path], folder: Path, train_docs: list[Doc]) -> Path:
    started = time.perf_counter()
    path = builder(folder, train_docs=train_docs)
    print(f"{builder.__name__}: {time.perf_counter() - started:.2f}s")
    return path


@pytest.fixture(scope="session")
def train_docs() -> list[Doc]:
    return load_documents("dev", limit_sentences=300)


@pytest.fixture(scope="session")
def sample_paths(
    tmp_path_factory: pytest.TempPathFactory, train_docs: list[Doc]
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("samples")
    builders = {
        "roberta": build_roberta_sample,
        "bert": build_bert_sample,
        "minilm": build_minilm_sample,
    }
    return {name: _timed_build(b, root / name, train_docs) for name, b in builders.items()}


@pytest.fixture(scope="session")
def samples(sample_paths: dict[str, Path]) -> dict[str, Language]:
    return {name: spacy.load(path) for name, path in sample_paths.items()}


@pytest.fixture(scope="session")
def long_texts() -> list[str]:
    return [d.text for d in load_documents("test", max_sentences=8, limit_sentences=400)]


def _piece_count(nlp: Language, doc: Doc) -> int:
    encoder = nlp.get_pipe("transformer").model.get_ref("piece_encoder")
    return int(encoder.predict([doc])[0].dataXd.shape[0])


SAMPLE_WIDTHS = {"roberta": 48, "bert": 40, "minilm": 384}
SAMPLE_PADDING = {"roberta": 1, "bert": 0, "minilm": 0}
SAMPLE_WINDOWS = {"roberta": 32, "bert": 48, "minilm": 128}


@pytest.mark.parametrize("name", list(SAMPLE_WIDTHS))
def test_sample_loads_and_annotates(samples: dict[str, Language], name: str) -> None:
    nlp = samples[name]
    assert nlp.pipe_names == PIPE_NAMES
    doc = nlp("Some text. It is a place in Argentina.")
    assert all(t.tag_ and t.dep_ for t in doc)
    assert doc._.trf_data.last_hidden_layer_state.dataXd.shape == (
        _piece_count(nlp, doc) - 2,
        SAMPLE_WIDTHS[name],
    )
    assert set(nlp.get_pipe("ner").labels) == {"PER", "ORG", "LOC"}
    assert len(nlp.get_pipe("tagger").labels) > 30


@pytest.mark.parametrize("name", list(SAMPLE_WIDTHS))
def test_sample_encoder_settings(samples: dict[str, Language], name: str) -> None:
    nlp = samples[name]
    assert curated_torch_module(nlp).curated_encoder.padding_idx == SAMPLE_PADDING[name]
    model = nlp.get_pipe("transformer").model
    spans = next(m for m in model.walk() if m.name == "with_strided_spans")
    assert spans.attrs["window"] == SAMPLE_WINDOWS[name]
    assert nlp.config["components"]["transformer"]["model"]["hidden_width"] == (SAMPLE_WIDTHS[name])


def test_tiny_specs_have_unusual_shapes() -> None:
    assert ROBERTA_SPEC.hidden_width // ROBERTA_SPEC.num_attention_heads == 16
    assert BERT_SPEC.hidden_width // BERT_SPEC.num_attention_heads == 8
    for spec in (ROBERTA_SPEC, BERT_SPEC):
        assert spec.intermediate_width != 4 * spec.hidden_width
    spec = minilm_spec()
    assert (spec.num_hidden_layers, spec.hidden_width, spec.num_attention_heads) == (6, 384, 12)


def test_piece_vocab_special_ids(sample_paths: dict[str, Path]) -> None:
    bpe = json.loads((sample_paths["roberta"] / PIECE_VOCAB_DIR / "vocab.json").read_text())
    assert [bpe[t] for t in ("<s>", "<pad>", "</s>", "<unk>")] == [0, 1, 2, 3]
    wordpiece = (sample_paths["bert"] / PIECE_VOCAB_DIR / "vocab.txt").read_text().splitlines()
    assert wordpiece[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_tagger_depends_on_the_encoder(samples: dict[str, Language], long_texts: list[str]) -> None:
    """Untrained heads must still vary with the input, or runtime comparisons mean nothing."""
    for nlp in samples.values():
        tags = {t.tag_ for doc in nlp.pipe(long_texts[:10]) for t in doc}
        assert len(tags) > 5


@pytest.mark.parametrize("name", list(SAMPLE_WIDTHS))
def test_pipe_over_documents_longer_than_a_window(
    samples: dict[str, Language], long_texts: list[str], name: str
) -> None:
    nlp = samples[name]
    window = SAMPLE_WINDOWS[name]
    docs = [nlp.make_doc(text) for text in long_texts]
    long_docs = [d for d in docs if _piece_count(nlp, d) > window][:20]
    assert len(long_docs) == 20
    annotated = list(nlp.pipe(d.text for d in long_docs))
    for doc in annotated:
        assert doc._.trf_data.last_hidden_layer_state.dataXd.shape[1] == SAMPLE_WIDTHS[name]
        assert all(t.tag_ for t in doc)
        assert doc.has_annotation("DEP") and doc.has_annotation("ENT_IOB")


def test_minilm_matches_hugging_face(samples: dict[str, Language]) -> None:
    import torch
    from transformers import BertModel, BertTokenizerFast

    nlp = samples["minilm"]
    # No contractions: spaCy splits "didn't" as did|n't, BERT as didn|'|t.
    text = "The café in Zürich hired Mary Jo Foley (again), or so we heard."
    doc = nlp(text)
    curated_ids = nlp.get_pipe("transformer").model.get_ref("piece_encoder").predict([doc])
    ids = curated_ids[0].dataXd.tolist()
    tokenizer = BertTokenizerFast.from_pretrained(minilm_model_path(), local_files_only=True)
    assert ids == tokenizer(text)["input_ids"]

    hf = BertModel.from_pretrained(minilm_model_path(), local_files_only=True).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).last_hidden_state[0, 1:-1].numpy()
    actual = numpy.asarray(doc._.trf_data.last_hidden_layer_state.dataXd)
    assert actual.shape == expected.shape
    assert numpy.abs(actual - expected).max() < 1e-4


def test_ensure_sample_builds_once(tmp_path: Path) -> None:
    first = ensure_sample("bert", cache_root=tmp_path)
    assert first.parent == tmp_path and first.name.startswith("bert-")
    assert json.loads((first / "sample.json").read_text())["name"] == "bert"
    marker = first / "meta.json"
    mtime = marker.stat().st_mtime_ns
    assert ensure_sample("bert", cache_root=tmp_path) == first
    assert marker.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [first.name]
    assert spacy.load(first).pipe_names == PIPE_NAMES


def test_ensure_sample_rejects_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Unknown sample"):
        ensure_sample("gpt", cache_root=tmp_path)
