"""The EWT reader and the offline sample pipelines that the rest of the suite builds on."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy
import pytest
import spacy
from spacy.language import Language
from spacy.tokens import Doc
from spacy_accelerate_samples import (
    CURATED_SAMPLE_NAMES,
    SAMPLE_NAMES,
    SPACY_TRANSFORMERS_SAMPLE_NAMES,
    CuratedSpec,
    HfSpec,
    Sentence,
    TransformerComponent,
    WordpieceVocab,
    build_bert_sample,
    build_minilm_sample,
    build_roberta_sample,
    ensure_sample,
    group_documents,
    hf_model_dir,
    load_documents,
    load_sample,
    read_sentences,
    scalar_weight_modules,
    to_gold_doc,
)
from spacy_accelerate_samples.curated import ALBERT_SPEC, XLMR_SPEC
from spacy_accelerate_samples.pipelines import (
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


# --------------------------------------------------------------------------- more sample families

# name: (curated encoder class, width of doc._.trf_data, padding_idx, window of that transformer)
NEW_CURATED = {
    "xlmr": ("RobertaEncoder", 56, 1, 32),
    "camembert": ("RobertaEncoder", 44, 1, 36),
    "albert": ("AlbertEncoder", 40, 0, 32),
    "roberta-scalar": ("RobertaEncoder", 48, 1, 32),
    # Both encoders set doc._.trf_data; "transformer_ner" runs last.
    "roberta-two": ("RobertaEncoder", 40, 1, 24),
}
# name: (Hugging Face model class, takes token_type_ids, hidden width, window in tokens)
SPACY_TRANSFORMERS = {
    "st-bert": ("BertModel", True, 40, 32),
    "st-bert-hidden": ("BertModel", True, 40, 32),
    "st-roberta": ("RobertaModel", False, 48, 32),
    "st-xlmr": ("XLMRobertaModel", False, 56, 32),
    "st-distilbert": ("DistilBertModel", False, 48, 28),
    "st-electra": ("ElectraModel", True, 40, 32),
    "st-minilm": ("BertModel", True, 384, 48),
}
# One spaCy token each: the curated encoder encodes token by token, HF the whole string.
PIECE_PROBES = ["Argentina", "the", "unbelievable", "café", "Zürich", "2008", "GoogleOS"]


@pytest.fixture(scope="session")
def loaded(sample_path: Callable[[str], Path]) -> Callable[[str], Language]:
    """Each sample loaded once per session (built into the session's sample root)."""
    cache: dict[str, Language] = {}

    def load(name: str) -> Language:
        if name not in cache:
            cache[name] = spacy.load(sample_path(name))
        return cache[name]

    return load


def _long_texts_for(nlp: Language, texts: list[str], window: int, n: int = 8) -> list[str]:
    """Texts with more than two windows' worth of tokens (so at least as many pieces)."""
    chosen = [t for t in texts if len(nlp.make_doc(t)) > 2 * window][:n]
    assert len(chosen) == n
    return chosen


def test_registry_names_every_sample() -> None:
    old = {"roberta", "bert", "minilm", "trf-base"}
    assert set(SAMPLE_NAMES) == old | set(NEW_CURATED) | set(SPACY_TRANSFORMERS)
    assert set(CURATED_SAMPLE_NAMES) == old | set(NEW_CURATED)


@pytest.mark.slow
def test_trf_base_has_the_shape_of_en_core_web_trf(sample_path: Callable[[str], Path]) -> None:
    from spacy_accelerate.architectures import detect_architecture
    from spacy_accelerate.pipeline.components import find_transformer_components
    from spacy_accelerate.pipeline.shim import find_span_settings

    nlp = spacy.load(sample_path("trf-base"))
    assert nlp.pipe_names == ["transformer", "tagger", "parser", "ner"]
    component = find_transformer_components(nlp)[0]
    spec = detect_architecture(curated_torch_module(nlp)).spec
    shape = (spec.family, spec.num_hidden_layers, spec.hidden_width, spec.num_attention_heads)
    assert shape == ("roberta", 12, 768, 12)
    assert (spec.intermediate_width, spec.max_position_embeddings, spec.padding_idx) == (
        3072,
        514,
        1,
    )
    spans = find_span_settings(component)
    assert (spans.window, spans.stride) == (128, 96)
    assert len(nlp("The shape matters, not the weights.")) == 8
    assert set(SPACY_TRANSFORMERS_SAMPLE_NAMES) == set(SPACY_TRANSFORMERS)


@pytest.mark.parametrize("name", [*NEW_CURATED, *SPACY_TRANSFORMERS])
def test_new_sample_annotates_documents_longer_than_a_window(
    loaded: Callable[[str], Language], long_texts: list[str], name: str
) -> None:
    nlp = loaded(name)
    curated = name in NEW_CURATED
    if curated:
        _, width, _, window = NEW_CURATED[name]
    else:
        _, _, width, window = SPACY_TRANSFORMERS[name]
    texts = _long_texts_for(nlp, long_texts, window)
    docs = list(nlp.pipe(texts))
    tags = {t.tag_ for doc in docs for t in doc}
    assert len(tags) > 3, tags
    for doc in docs:
        assert all(t.tag_ for t in doc)
        assert doc.has_annotation("DEP") and doc.has_annotation("ENT_IOB")
        if curated:
            hidden = doc._.trf_data.last_hidden_layer_state
            assert len(hidden.lengths) == len(doc) and hidden.dataXd.shape[1] == width
        else:
            output = doc._.trf_data.model_output.last_hidden_state
            assert output.shape[0] > 1 and output.shape[-1] == width  # several strided spans
            assert len(doc._.trf_data.align.lengths) == len(doc)


@pytest.mark.parametrize("name", list(NEW_CURATED))
def test_new_curated_encoder_settings(loaded: Callable[[str], Language], name: str) -> None:
    nlp = loaded(name)
    encoder_class, _, padding_idx, _ = NEW_CURATED[name]
    for component in [n for n in nlp.pipe_names if n.startswith("transformer")]:
        encoder = curated_torch_module(nlp, component).curated_encoder
        assert type(encoder).__name__ == encoder_class
        assert encoder.padding_idx == padding_idx
        spans = next(
            m for m in nlp.get_pipe(component).model.walk() if m.name == "with_strided_spans"
        )
        assert (
            spans.attrs["window"]
            == nlp.config["components"][component]["model"]["with_spans"]["window"]
        )
    window = NEW_CURATED[name][3]
    last = [n for n in nlp.pipe_names if n.startswith("transformer")][-1]
    assert nlp.config["components"][last]["model"]["with_spans"]["window"] == window


@pytest.mark.parametrize(("name", "bos", "eos"), [("xlmr", 0, 2), ("camembert", 5, 6)])
def test_fairseq_piece_ids_match_the_hf_tokenizer(
    loaded: Callable[[str], Language],
    sample_path: Callable[[str], Path],
    name: str,
    bos: int,
    eos: int,
) -> None:
    """The curated adapters shift SentencePiece ids exactly as XLM-R/CamemBERT tokenizers do."""
    from transformers import AutoTokenizer

    nlp = loaded(name)
    tokenizer = AutoTokenizer.from_pretrained(sample_path(name) / PIECE_VOCAB_DIR / "hf_tokenizer")
    assert tokenizer.pad_token_id == 1
    encoder = nlp.get_pipe("transformer").model.get_ref("piece_encoder")
    for word in PIECE_PROBES:
        doc = nlp.make_doc(word)
        assert len(doc) == 1
        ids = encoder.predict([doc])[0].dataXd.tolist()
        assert ids == tokenizer(word)["input_ids"], word
        assert (ids[0], ids[-1]) == (bos, eos)
    embeddings = curated_torch_module(nlp).curated_encoder.embeddings.inner.word_embeddings
    assert embeddings.num_embeddings == len(tokenizer)


def test_albert_has_groups_inner_layers_and_factorised_embeddings(
    loaded: Callable[[str], Language],
) -> None:
    from spacy_accelerate_samples.albert_architecture import ALBERT_ARCHITECTURE

    nlp = loaded("albert")
    model_config = nlp.config["components"]["transformer"]["model"]
    assert model_config["@architectures"] == ALBERT_ARCHITECTURE
    assert (model_config["num_hidden_layers"], model_config["inner_group_num"]) == (4, 2)
    encoder = curated_torch_module(nlp).curated_encoder
    assert [len(group.group_layers) for group in encoder.groups] == [2, 2]
    assert encoder.embeddings.word_embeddings.embedding_dim == 24
    assert encoder.embeddings.projection.out_features == 40
    head_width = 40 // model_config["num_attention_heads"]
    assert head_width == 10 and model_config["intermediate_width"] != 4 * 40
    # Every group and every inner layer has its own parameters.
    first_ffn = [layer.ffn.intermediate.weight for g in encoder.groups for layer in g.group_layers]
    assert len({tuple(w.flatten()[:8].tolist()) for w in first_ffn}) == 4
    ids = nlp.get_pipe("transformer").model.get_ref("piece_encoder").predict([nlp("It is.")])
    pieces = ids[0].dataXd.tolist()
    assert (pieces[0], pieces[-1]) == (2, 3) and 0 not in pieces  # [CLS] ... [SEP], no <pad>


def test_roberta_scalar_listeners_weight_every_layer(
    loaded: Callable[[str], Language], sample_path: Callable[[str], Path]
) -> None:
    nlp = loaded("roberta-scalar")
    assert nlp.get_pipe("transformer").all_layer_outputs
    modules = scalar_weight_modules(nlp)
    assert set(modules) == {"tagger", "ner"}
    for module in modules.values():
        weights = module.layer_weights.detach().numpy()
        assert weights.shape == (3,)  # embeddings + 2 layers
        assert len(numpy.unique(weights.round(3))) == 3
    parser_nodes = {node.name for node in nlp.get_pipe("parser").model.walk()}
    assert "last_transformer_layer_listener" in parser_nodes
    doc = nlp("It is a place in Argentina lol.")
    assert doc._.trf_data.num_outputs == 3

    # The tagger's scores change when one layer's weight does: every layer is read.
    import torch

    fresh = spacy.load(sample_path("roberta-scalar"))
    docs = [fresh(text) for text in ("It is a place in Argentina lol.", "Send it by e-mail.")]
    tagger = fresh.get_pipe("tagger")
    before = [numpy.asarray(s) for s in tagger.model.predict(docs)]
    with torch.no_grad():
        scalar_weight_modules(fresh)["tagger"].layer_weights[0] += 3.0
    after = [numpy.asarray(s) for s in tagger.model.predict(docs)]
    assert max(numpy.abs(a - b).max() for a, b in zip(after, before, strict=True)) > 1e-3


def test_roberta_two_listeners_follow_their_own_transformer(
    loaded: Callable[[str], Language],
) -> None:
    nlp = loaded("roberta-two")
    assert nlp.pipe_names == ["transformer", "tagger", "parser", "transformer_ner", "ner"]
    widths = {
        name: nlp.config["components"][name]["model"]["hidden_width"]
        for name in ("transformer", "transformer_ner")
    }
    assert widths == {"transformer": 48, "transformer_ner": 40}
    for head, upstream in [
        ("tagger", "transformer"),
        ("parser", "transformer"),
        ("ner", "transformer_ner"),
    ]:
        listener = nlp.config["components"][head]["model"]["tok2vec"]
        assert (listener["upstream"], listener["width"]) == (upstream, widths[upstream])
        nodes = [n for n in nlp.get_pipe(head).model.walk() if "_upstream_name" in n.attrs]
        assert [n.attrs["_upstream_name"] for n in nodes] == [upstream]
    first = curated_torch_module(nlp, "transformer")
    second = curated_torch_module(nlp, "transformer_ner")
    assert first is not second
    assert first.curated_encoder.embeddings.inner.word_embeddings.embedding_dim == 48
    assert second.curated_encoder.embeddings.inner.word_embeddings.embedding_dim == 40


@pytest.mark.parametrize("name", list(SPACY_TRANSFORMERS))
def test_spacy_transformers_model_class_and_inputs(
    loaded: Callable[[str], Language], name: str
) -> None:
    from transformers import AutoModel

    model_class, takes_token_types, width, window = SPACY_TRANSFORMERS[name]
    nlp = loaded(name)
    model = nlp.get_pipe("transformer").model
    hf = model.transformer
    assert type(hf).__name__ == model_class
    assert ("token_type_ids" in model.tokenizer.model_input_names) == takes_token_types
    doc = nlp("It is a place in Argentina lol.")
    assert (doc._.trf_data.wordpieces.token_type_ids is not None) == takes_token_types
    assert nlp.config["components"]["transformer"]["model"]["get_spans"]["window"] == window
    assert hf.config.pad_token_id == model.tokenizer.pad_token_id
    if name in ("st-roberta", "st-xlmr"):
        assert hf.config.pad_token_id == 1
    if name == "st-electra":
        assert (hf.embeddings_project.in_features, hf.embeddings_project.out_features) == (24, 40)
    # The folder the pipeline names holds the same weights as the pipeline itself.
    reference = AutoModel.from_pretrained(hf_model_dir(nlp), local_files_only=True)
    ours, theirs = hf.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(numpy.array_equal(ours[k].numpy(), theirs[k].numpy()) for k in ours)
    assert len(ours) > 10 and next(iter(ours.values())).shape[-1] in (width, 24)


@pytest.mark.parametrize("name", ["st-bert", "st-xlmr"])
def test_spacy_transformers_sample_loads_without_its_hf_folder(tmp_path: Path, name: str) -> None:
    """The model and tokenizer are serialised into the pipeline, so the folder is not needed."""
    path = ensure_sample(name, cache_root=tmp_path)
    nlp = spacy.load(path)
    assert hf_model_dir(nlp) == path / "hf_model"
    texts = [
        "It is a place in Argentina lol.",
        "The café in Zürich hired Mary Jo Foley (again), or so we heard.",
    ]
    expected = [
        (doc._.trf_data.model_output.last_hidden_state, [t.tag_ for t in doc])
        for doc in nlp.pipe(texts)
    ]
    shutil.rmtree(path / "hf_model")
    reloaded = spacy.load(path)
    for doc, (hidden, tags) in zip(reloaded.pipe(texts), expected, strict=True):
        assert [t.tag_ for t in doc] == tags
        assert numpy.array_equal(doc._.trf_data.model_output.last_hidden_state, hidden)


def test_hidden_states_on_request(loaded: Callable[[str], Language], samples_root: Path) -> None:
    text = "It is a place in Argentina lol."
    built = loaded("st-bert-hidden")(text)._.trf_data.model_output
    assert len(built.hidden_states) == 3  # embeddings + 2 layers
    assert numpy.array_equal(built.hidden_states[-1], built.last_hidden_state)

    plain = loaded("st-bert")(text)._.trf_data.model_output
    assert "hidden_states" not in plain
    nlp = load_sample("st-bert", samples_root, transformer_config={"output_hidden_states": True})
    requested = nlp(text)._.trf_data.model_output
    assert len(requested.hidden_states) == 3
    assert numpy.array_equal(requested.last_hidden_state, plain.last_hidden_state)
    with pytest.raises(ValueError, match="spacy-transformers"):
        load_sample("roberta", samples_root, transformer_config={"output_hidden_states": True})


@pytest.mark.parametrize("name", ["xlmr", "st-bert"])
def test_sample_config_names_files_inside_the_sample(
    loaded: Callable[[str], Language], sample_path: Callable[[str], Path], name: str
) -> None:
    """Builds happen in a staging folder; the saved config must not point back there."""
    path = sample_path(name)
    nlp = loaded(name)
    if name == "xlmr":
        loader = nlp.config["initialize"]["components"]["transformer"]["piecer_loader"]
        named = Path(loader["name"])
    else:
        named = hf_model_dir(nlp)
    assert named.is_dir() and named.is_relative_to(path)


def test_spec_validation_rejects_mismatches(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ALBERT-only"):
        CuratedSpec(**{**asdict(BERT_SPEC), "embedding_width": 24})
    with pytest.raises(ValueError, match="divisible by num_hidden_groups"):
        CuratedSpec(**{**asdict(ALBERT_SPEC), "num_hidden_groups": 3})
    with pytest.raises(TypeError, match="xlmr encoders need"):
        TransformerComponent(XLMR_SPEC, WordpieceVocab(tmp_path / "vocab.txt"))
    with pytest.raises(ValueError, match="token types"):
        HfSpec("bert", 40, 5, 2, 72, type_vocab_size=0)
    with pytest.raises(ValueError, match="ELECTRA-only"):
        HfSpec("bert", 40, 5, 2, 72, embedding_width=24)
