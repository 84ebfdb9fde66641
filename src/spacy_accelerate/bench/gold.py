"""Accuracy against gold annotations, next to the agreement with PyTorch.

Agreement says how often the accelerated pipeline annotates like PyTorch; accuracy against
a gold corpus (CoNLL-U, or a ``.spacy`` DocBin) says what a difference costs. The gold
documents keep their own tokenization: the pipeline annotates their texts
(:func:`gold_texts`) and spaCy's :class:`~spacy.training.Example` aligns its tokens with
the gold ones, so the scores are those ``spacy evaluate`` would report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from spacy.scorer import Scorer, get_ner_prf
from spacy.tokens import Doc, DocBin, Token
from spacy.training import Example
from spacy.vocab import Vocab

from spacy_accelerate.errors import InvalidOptionError

#: Sentences per gold document read from CoNLL-U (what ``spacy convert`` groups by default).
SENTENCES_PER_DOC = 10

#: Every score :func:`score` may report, in the order it reports them.
SCORES = (
    "tag_acc",
    "pos_acc",
    "morph_acc",
    "lemma_acc",
    "dep_uas",
    "dep_las",
    "ents_f",
    "sents_f",
)

_FORMATS = "a CoNLL-U file (.conllu) or a DocBin (.spacy, as `spacy convert` writes it)"


def read_gold(path: Path, vocab: Vocab) -> list[Doc]:
    """The gold documents in ``path``, in ``vocab`` (the pipeline's).

    A ``.conllu`` file is read with spaCy's own converter, ten sentences a document; a
    ``.spacy`` file is a :class:`~spacy.tokens.DocBin`. Raises
    :class:`~spacy_accelerate.errors.InvalidOptionError` for any other file, or one that
    cannot be read or holds no document.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".conllu", ".spacy"):
        raise InvalidOptionError(f"Cannot read gold annotations from {path}: give {_FORMATS}.")
    if not path.is_file():
        raise InvalidOptionError(f"No gold file at {path}: give {_FORMATS}.")
    try:
        docs = _read_conllu(path, vocab) if suffix == ".conllu" else _read_docbin(path, vocab)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
        detail = " ".join(str(error).split()) or type(error).__name__
        raise InvalidOptionError(
            f"Cannot read gold annotations from {path} ({detail}): give {_FORMATS}."
        ) from error
    docs = [doc for doc in docs if len(doc)]
    if not docs:
        raise InvalidOptionError(f"{path} holds no annotated document: give {_FORMATS}.")
    return docs


def gold_texts(gold: Iterable[Doc]) -> list[str]:
    """The texts to annotate so that the predictions line up with ``gold``."""
    return [doc.text for doc in gold]


def score(predicted: Sequence[Doc], gold: Sequence[Doc]) -> dict[str, float | None]:
    """spaCy's scores of ``predicted`` (one doc per gold doc, e.g. ``nlp.pipe(gold_texts(
    gold))``) against ``gold``: those of :data:`SCORES` the gold has annotation for, each in
    [0, 1] (``None`` where spaCy has nothing to count, e.g. ``ents_f`` with no entity on
    either side). The tokenizations may differ: :class:`~spacy.training.Example` aligns them.
    """
    if len(predicted) != len(gold):
        raise InvalidOptionError(
            f"score() needs one predicted doc per gold doc: got {len(predicted)} predicted "
            f"and {len(gold)} gold docs."
        )
    examples = [Example(p, g) for p, g in zip(predicted, gold, strict=True)]

    def annotated(attribute: str) -> bool:
        return any(doc.has_annotation(attribute) for doc in gold)

    found: dict[str, Any] = {}
    if annotated("TAG"):
        found.update(Scorer.score_token_attr(examples, "tag"))
    if annotated("POS"):
        found.update(Scorer.score_token_attr(examples, "pos"))
    if annotated("MORPH"):
        found.update(Scorer.score_token_attr(examples, "morph", getter=_features))
    if annotated("LEMMA"):
        found.update(Scorer.score_token_attr(examples, "lemma"))
    if annotated("DEP"):
        # as spaCy's parser scores itself: labels lowercased, punctuation left out of LAS
        found.update(
            Scorer.score_deps(examples, "dep", getter=_dep_label, ignore_labels=("p", "punct"))
        )
    if annotated("ENT_IOB"):
        found.update(get_ner_prf(examples))
    if annotated("SENT_START") or annotated("DEP"):
        found.update(
            Scorer.score_spans(examples, "sents", getter=_sentences, has_annotation=_has_sentences)
        )
    return {key: _number(found[key]) for key in SCORES if key in found}


def _read_conllu(path: Path, vocab: Vocab) -> list[Doc]:
    from spacy.training.converters import conllu_to_docs

    text = path.read_text(encoding="utf8")
    if not text.strip():
        return []
    sentences = [_rebuild(vocab, doc) for doc in conllu_to_docs(text, n_sents=1, no_print=True)]
    return [
        Doc.from_docs(sentences[start : start + SENTENCES_PER_DOC])
        for start in range(0, len(sentences), SENTENCES_PER_DOC)
        if any(len(doc) for doc in sentences[start : start + SENTENCES_PER_DOC])
    ]


def _rebuild(vocab: Vocab, sentence: Doc) -> Doc:
    """One CoNLL-U sentence, read by spaCy's converter into a private vocab, in ``vocab``;
    a column that is ``_`` throughout (no annotation) is left unset, not scored."""

    def column(values: list[str]) -> list[str] | None:
        return values if any(value not in ("", "_") for value in values) else None

    deps = column([token.dep_ for token in sentence])
    ents = None
    if sentence.has_annotation("ENT_IOB"):
        ents = [
            f"{token.ent_iob_}-{token.ent_type_}" if token.ent_iob_ in ("B", "I") else "O"
            for token in sentence
        ]
    return Doc(
        vocab,
        words=[token.text for token in sentence],
        spaces=[bool(token.whitespace_) for token in sentence],
        tags=column([token.tag_ for token in sentence]),
        pos=column([token.pos_ for token in sentence]),
        morphs=column([str(token.morph) for token in sentence]),
        lemmas=column([token.lemma_ for token in sentence]),
        heads=[token.head.i for token in sentence] if deps else None,
        deps=deps,
        # without a tree, the sentence is still one: CoNLL-U marks its boundaries
        sent_starts=None if deps else [token.i == 0 for token in sentence],
        ents=ents,
    )


def _read_docbin(path: Path, vocab: Vocab) -> list[Doc]:
    return list(DocBin().from_disk(path).get_docs(vocab))


def _features(token: Token, attribute: str) -> str:
    """The token's features in their canonical UD form ("" where it has none: not scored)."""
    return str(token.morph)


def _dep_label(token: Token, attribute: str) -> str:
    return token.dep_.lower()


def _has_sentences(doc: Doc) -> bool:
    return bool(doc.has_annotation("SENT_START"))


def _sentences(doc: Doc, attribute: str) -> Iterable[Any]:
    """A doc's sentences; one that nothing segmented (no parser or senter) is one sentence."""
    return doc.sents if _has_sentences(doc) else [doc[:]]


def _number(value: Any) -> float | None:
    return None if value is None else float(value)
