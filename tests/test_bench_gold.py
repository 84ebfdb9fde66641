"""``bench --gold``: accuracy against gold annotations (CoNLL-U or DocBin) next to agreement."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import spacy
from spacy.language import Language
from spacy.scorer import Scorer
from spacy.tokens import Doc, DocBin
from spacy.training import Example
from typer.testing import CliRunner, Result

from spacy_accelerate.bench.gold import SCORES, gold_texts, read_gold, score
from spacy_accelerate.cli import app
from spacy_accelerate.errors import InvalidOptionError

runner = CliRunner()

#: Two sentences with every column CoNLL-U has, entities in MISC as ``spacy convert`` reads them.
FULL_CONLLU = """\
# sent_id = 1
# text = Alice saw Bob.
1\tAlice\tAlice\tPROPN\tNNP\tNumber=Sing\t2\tnsubj\t_\tname=B-PERSON
2\tsaw\tsee\tVERB\tVBD\tMood=Ind|Tense=Past\t0\troot\t_\tname=O
3\tBob\tBob\tPROPN\tNNP\tNumber=Sing\t2\tobj\t_\tname=B-PERSON|SpaceAfter=No
4\t.\t.\tPUNCT\t.\t_\t2\tpunct\t_\tname=O

# sent_id = 2
1\tHe\the\tPRON\tPRP\tCase=Nom\t2\tnsubj\t_\tname=O
2\tleft\tleave\tVERB\tVBD\tTense=Past\t0\troot\t_\tname=O|SpaceAfter=No
3\t.\t.\tPUNCT\t.\t_\t2\tpunct\t_\tname=O|SpaceAfter=No
"""


def invoke(*args: str) -> Result:
    return runner.invoke(app, list(args))


def assert_one_line_error(result: Result, *patterns: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: "), lines[0]
    for pattern in patterns:
        assert pattern in lines[0], lines[0]


@pytest.fixture(scope="module")
def bert_path(sample_path: Callable[[str], Path]) -> Path:
    return sample_path("bert")


@pytest.fixture(scope="module")
def nlp(bert_path: Path) -> Language:
    return spacy.load(bert_path)


@pytest.fixture(scope="module")
def texts(ewt_texts: list[str]) -> list[str]:
    return [" ".join(text.split()) for text in ewt_texts[:6]]


def copies(docs: Iterable[Doc]) -> list[Doc]:
    return [Doc(doc.vocab).from_bytes(doc.to_bytes()) for doc in docs]


def to_conllu(docs: Iterable[Doc], tag: Callable[[str], str] = lambda tag: tag) -> str:
    """``docs``' words, tags and trees as CoNLL-U (lemma, UPOS and features left out: ``_``)."""
    blocks = []
    for doc in docs:
        for sent in doc.sents:
            lines = []
            for token in sent:
                head = 0 if token.head.i == token.i else token.head.i - sent.start + 1
                misc = "_" if token.whitespace_ else "SpaceAfter=No"
                columns = [str(token.i - sent.start + 1), token.text, "_", "_"]
                columns += [tag(token.tag_), "_", str(head), token.dep_, "_", misc]
                lines.append("\t".join(columns))
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def write_docbin(docs: Iterable[Doc], path: Path) -> Path:
    DocBin(docs=docs).to_disk(path)
    return path


def direct_scores(nlp: Language, predicted: list[Doc], gold: list[Doc]) -> dict:
    return Scorer(nlp).score([Example(p, g) for p, g in zip(predicted, gold, strict=True)])


def test_conllu_keeps_every_column_and_scores_itself_perfectly(tmp_path: Path):
    path = tmp_path / "gold.conllu"
    path.write_text(FULL_CONLLU)
    nlp = spacy.blank("en")
    docs = read_gold(path, nlp.vocab)
    assert len(docs) == 1 and docs[0].vocab is nlp.vocab
    (doc,) = docs
    assert gold_texts(docs) == ["Alice saw Bob. He left."]
    assert [t.text for t in doc] == ["Alice", "saw", "Bob", ".", "He", "left", "."]
    assert [t.tag_ for t in doc][:3] == ["NNP", "VBD", "NNP"]
    assert [t.pos_ for t in doc][:2] == ["PROPN", "VERB"] and doc[1].lemma_ == "see"
    assert str(doc[1].morph) == "Mood=Ind|Tense=Past" and doc[0].head.i == 1
    assert [s.text for s in doc.sents] == ["Alice saw Bob.", "He left."]
    assert [(e.text, e.label_) for e in doc.ents] == [("Alice", "PERSON"), ("Bob", "PERSON")]

    assert score(copies(docs), docs) == dict.fromkeys(SCORES, 1.0)
    untagged = score([nlp.make_doc(text) for text in gold_texts(docs)], docs)
    assert set(untagged) == set(SCORES)
    assert untagged["tag_acc"] == 0.0 and untagged["ents_f"] == 0.0
    assert untagged["sents_f"] == 0.0  # one unsegmented doc against two gold sentences


def test_conllu_without_a_column_scores_only_what_it_annotates(tmp_path: Path):
    path = tmp_path / "words.conllu"
    lines = []
    for line in FULL_CONLLU.splitlines():
        parts = line.split("\t")
        if len(parts) == 10:  # words, XPOS and spacing (with the entities) only
            parts = [*parts[:2], "_", "_", parts[4], "_", "_", "_", "_", parts[9]]
        lines.append("\t".join(parts))
    path.write_text("\n".join(lines) + "\n")
    (doc,) = read_gold(path, spacy.blank("en").vocab)
    assert not doc.has_annotation("DEP") and not doc.has_annotation("LEMMA")
    assert [s.text for s in doc.sents] == ["Alice saw Bob.", "He left."]
    scores = score(copies([doc]), [doc])
    assert scores == {"tag_acc": 1.0, "ents_f": 1.0, "sents_f": 1.0}


def test_pipeline_scores_equal_spacys_scorer_and_fall_with_a_corrupted_gold(
    nlp: Language, texts: list[str], tmp_path: Path
):
    predicted = list(nlp.pipe(texts))
    (tmp_path / "gold.conllu").write_text(to_conllu(predicted))
    (tmp_path / "bad.conllu").write_text(to_conllu(predicted, tag=lambda _: "NOT-A-TAG"))
    gold = read_gold(tmp_path / "gold.conllu", nlp.vocab)
    assert len(gold) >= 1 and all(doc.has_annotation("DEP") for doc in gold)
    annotated = list(nlp.pipe(gold_texts(gold)))
    scores = score(annotated, gold)
    assert set(scores) == {"tag_acc", "dep_uas", "dep_las", "sents_f"}
    expected = direct_scores(nlp, annotated, gold)
    for key, value in scores.items():
        assert value is not None and 0.0 <= value <= 1.0
        assert value == pytest.approx(expected[key]), key

    corrupted = read_gold(tmp_path / "bad.conllu", nlp.vocab)
    assert gold_texts(corrupted) == gold_texts(gold)
    worse = score(annotated, corrupted)
    assert worse["tag_acc"] == 0.0 and scores["tag_acc"] is not None
    assert scores["tag_acc"] > worse["tag_acc"]
    assert worse["dep_las"] == scores["dep_las"]


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        ("gold.txt", "Alice saw Bob.\n", "Cannot read gold annotations"),
        ("gold.json", "[]", "Cannot read gold annotations"),
        ("missing.conllu", None, "No gold file at"),
        ("empty.conllu", "\n\n", "holds no annotated document"),
        ("broken.conllu", "1\tAlice\n", "Cannot read gold annotations"),
        ("broken.spacy", "not a docbin", "Cannot read gold annotations"),
    ],
)
def test_unreadable_gold_is_refused_naming_the_formats(
    tmp_path: Path, name: str, content: str | None, pattern: str
):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(InvalidOptionError, match=pattern) as raised:
        read_gold(path, spacy.blank("en").vocab)
    assert ".conllu" in str(raised.value) and ".spacy" in str(raised.value)


def test_score_needs_one_predicted_doc_per_gold_doc():
    nlp = spacy.blank("en")
    with pytest.raises(InvalidOptionError, match="one predicted doc per gold doc"):
        score([nlp("a")], [])


def test_bench_with_gold_reports_accuracy_next_to_agreement(
    bert_path: Path, nlp: Language, texts: list[str], cache_dir: Path, tmp_path: Path
):
    predicted = list(nlp.pipe(texts, batch_size=64))
    gold_docs = []
    for doc in predicted:  # the pipeline's own tags, tree and entities, one of them wrong
        gold_doc = Doc(doc.vocab).from_bytes(doc.to_bytes())
        gold_doc[0].tag_ = "NOT-A-TAG"
        gold_docs.append(gold_doc)
    gold_path = write_docbin(gold_docs, tmp_path / "gold.spacy")
    report = tmp_path / "bench.json"
    result = invoke(
        "bench", str(bert_path), "--gold", str(gold_path), "--repeats", "1", "--output", str(report)
    )
    assert result.exit_code == 0, result.output
    assert f"{len(texts)} texts" in result.output
    lines = result.output.splitlines()
    pytorch = next(line for line in lines if "PyTorch fp32" in line)
    fp32 = next(line for line in lines if "cpu fp32" in line)
    assert "gold: tag_acc" in pytorch and "dep_las" in pytorch and "ents_f" in pytorch
    assert "agreement: tag" in fp32 and "gold: tag_acc" in fp32

    written = json.loads(report.read_text())
    assert written["gold"] == {"file": str(gold_path), "documents": len(texts)}
    reference = read_gold(gold_path, nlp.vocab)
    expected = score(predicted, reference)
    assert set(expected) == {"tag_acc", "dep_uas", "dep_las", "ents_f", "sents_f"}
    assert written["pytorch"]["gold"] == pytest.approx(expected)
    direct = direct_scores(nlp, predicted, reference)
    for key in ("tag_acc", "dep_uas", "dep_las", "ents_f", "sents_f"):
        assert written["pytorch"]["gold"][key] == pytest.approx(direct[key]), key
    words = sum(len(doc) for doc in predicted)
    assert written["pytorch"]["gold"]["tag_acc"] == pytest.approx(1 - len(texts) / words)
    assert written["pytorch"]["gold"]["dep_las"] == 1.0
    variant = written["variants"]["fp32"]
    assert variant["agreement"]["tag"] == 1.0
    assert variant["gold"] == pytest.approx(written["pytorch"]["gold"])
    for value in variant["gold"].values():
        assert value is None or 0.0 <= value <= 1.0


def test_bench_takes_texts_or_gold_but_not_both(bert_path: Path, tmp_path: Path):
    texts_file = tmp_path / "texts.txt"
    texts_file.write_text("Alice saw Bob.\n")
    gold = tmp_path / "gold.conllu"
    gold.write_text(FULL_CONLLU)
    both = invoke("bench", str(bert_path), str(texts_file), "--gold", str(gold))
    assert_one_line_error(both, "TEXTS_FILE or --gold, not both")
    assert_one_line_error(invoke("bench", str(bert_path)), "TEXTS_FILE", "--gold")


def test_bench_with_a_text_file_as_gold_is_one_line(bert_path: Path, tmp_path: Path):
    gold = tmp_path / "gold.txt"
    gold.write_text("Alice saw Bob.\n")
    result = invoke("bench", str(bert_path), "--gold", str(gold))
    assert_one_line_error(result, "gold.txt", ".conllu", ".spacy")
