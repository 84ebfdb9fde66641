"""Gold-annotated English Web Treebank text (UD English-EWT + Universal NER).

The accelerated pipelines must annotate exactly like the PyTorch ones on *real* text, with
realistic sentence lengths, punctuation and casing; synthetic strings hide tokenizer and
windowing edge cases.  This module turns the CoNLL-U / IOB2 files shipped in ``data/`` into
spaCy ``Doc`` objects carrying tags, parses and entities.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import spacy
from spacy.language import Language
from spacy.tokens import Doc
from spacy.vocab import Vocab

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.pipeline.components import find_transformer_components
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.planning.recording import record_calls

DATA_ENV_VAR = "SPACY_ACCELERATE_DATA"
SPLITS = ("train", "dev", "test")


def _default_data_dir() -> Path:
    """The repository's ``data/`` folder, unless the environment points elsewhere.

    An installed (non-editable) package has no repository next to it, so the environment
    variable is the escape hatch.
    """
    override = os.environ.get(DATA_ENV_VAR)
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "data"


DEFAULT_DATA_DIR: Path = _default_data_dir()


@dataclass(frozen=True)
class Sentence:
    """One UD sentence with its (optional) Universal NER tags.

    ``heads`` are 0-based indices within the sentence and the root points to itself, which is
    what ``Doc(heads=...)`` expects once offset by the sentence start.  ``ner`` is ``None``
    when UNER has no usable annotation for the sentence (missing or tokenised differently).
    """

    sent_id: str
    doc_id: str
    text: str
    words: tuple[str, ...]
    spaces: tuple[bool, ...]
    upos: tuple[str, ...]
    xpos: tuple[str, ...]
    heads: tuple[int, ...]
    deps: tuple[str, ...]
    ner: tuple[str, ...] | None

    def __len__(self) -> int:
        return len(self.words)

    def reconstructed_text(self) -> str:
        """The sentence text implied by ``words``/``spaces`` (trailing space dropped)."""
        pairs = zip(self.words, self.spaces, strict=True)
        return "".join(w + (" " if sp else "") for w, sp in pairs).rstrip(" ")


@dataclass(frozen=True)
class _Block:
    """The raw comment metadata and word rows of one CoNLL-style sentence block."""

    sent_id: str
    text: str
    newdoc_id: str | None
    rows: tuple[tuple[str, ...], ...]


def _split_path(data_dir: Path, folder: str, split: str, suffix: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"Unknown EWT split {split!r}; expected one of {SPLITS}")
    return data_dir / folder / f"en_ewt-ud-{split}.{suffix}"


def _iter_blocks(path: Path) -> Iterator[_Block]:
    """Yield sentence blocks; shared by CoNLL-U and the CoNLL-like UNER IOB2 files."""
    meta: dict[str, str] = {}
    rows: list[tuple[str, ...]] = []
    with path.open(encoding="utf8") as handle:
        for raw in handle:
            line = raw.rstrip("\n")
            if line.startswith("#"):
                key, sep, value = line[1:].partition("=")
                if sep:
                    meta[key.strip()] = value.strip()
            elif line.strip():
                rows.append(tuple(line.split("\t")))
            elif rows:
                yield _make_block(meta, rows)
                meta, rows = {}, []
    if rows:
        yield _make_block(meta, rows)


def _make_block(meta: dict[str, str], rows: list[tuple[str, ...]]) -> _Block:
    return _Block(
        sent_id=meta.get("sent_id", ""),
        text=meta.get("text", ""),
        newdoc_id=meta.get("newdoc id"),
        rows=tuple(rows),
    )


def _space_after(misc: str) -> bool:
    return "SpaceAfter=No" not in misc.split("|")


def _multiword_ranges(rows: Sequence[tuple[str, ...]]) -> dict[int, tuple[int, bool]]:
    """Map each multiword token's last word id to (first id, space after the token).

    UD puts ``SpaceAfter`` of a contraction like "we've" on its range line, while the words
    inside the range are never separated by whitespace.
    """
    ranges: dict[int, tuple[int, bool]] = {}
    for row in rows:
        if "-" in row[0]:
            start, end = (int(part) for part in row[0].split("-"))
            ranges[end] = (start, _space_after(row[9]))
    return ranges


def _word_spaces(rows: Sequence[tuple[str, ...]]) -> list[bool]:
    ranges = _multiword_ranges(rows)
    inside = {i for end, (start, _) in ranges.items() for i in range(start, end)}
    spaces: list[bool] = []
    for row in rows:
        if not row[0].isdigit():
            continue
        word_id = int(row[0])
        if word_id in ranges:
            spaces.append(ranges[word_id][1])
        elif word_id in inside:
            spaces.append(False)
        else:
            spaces.append(_space_after(row[9]))
    return spaces


def _parse_ud_block(block: _Block, doc_id: str, ner: tuple[str, ...] | None) -> Sentence:
    # Multiword range lines ("1-2") and empty nodes ("8.1") are not syntactic words.
    words = [row for row in block.rows if row[0].isdigit()]
    heads = [int(row[6]) - 1 if row[6] != "0" else i for i, row in enumerate(words)]
    # spaCy's own CoNLL-U converter renames the UD root label the same way.
    deps = ["ROOT" if row[7] == "root" else row[7] for row in words]
    forms = tuple(row[1] for row in words)
    return Sentence(
        sent_id=block.sent_id,
        doc_id=doc_id,
        text=block.text,
        words=forms,
        spaces=tuple(_word_spaces(block.rows)),
        upos=tuple(row[3] for row in words),
        xpos=tuple(row[4] for row in words),
        heads=tuple(heads),
        deps=tuple(deps),
        ner=ner if ner is not None and len(ner) == len(forms) else None,
    )


def _read_uner(path: Path) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """sent_id -> (tokens, IOB2 tags); empty when the UNER file is absent."""
    if not path.exists():
        return {}
    table: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for block in _iter_blocks(path):
        rows = [row for row in block.rows if len(row) >= 3 and row[0].isdigit()]
        table[block.sent_id] = (tuple(r[1] for r in rows), tuple(r[2] for r in rows))
    return table


def _aligned_ner(
    block: _Block, uner: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]
) -> tuple[str, ...] | None:
    """UNER tags for a UD sentence, or ``None`` when its tokens don't match the UD words.

    A mismatch means we cannot tell which word an entity covers; marking the sentence as
    unannotated is safer than guessing.
    """
    entry = uner.get(block.sent_id)
    if entry is None:
        return None
    tokens, tags = entry
    words = tuple(row[1] for row in block.rows if row[0].isdigit())
    return tags if tokens == words else None


def read_sentences(split: str = "test", data_dir: Path | None = None) -> list[Sentence]:
    """All sentences of an EWT split, in file order, with UNER tags where they line up."""
    root = data_dir if data_dir is not None else DEFAULT_DATA_DIR
    ud_path = _split_path(root, "ud_english_ewt", split, "conllu")
    uner = _read_uner(_split_path(root, "uner_english_ewt", split, "iob2"))
    sentences: list[Sentence] = []
    doc_id = ""
    for block in _iter_blocks(ud_path):
        doc_id = block.newdoc_id if block.newdoc_id is not None else doc_id
        sentences.append(_parse_ud_block(block, doc_id, _aligned_ner(block, uner)))
    return sentences


def group_documents(sentences: Iterable[Sentence], max_sentences: int) -> list[list[Sentence]]:
    """Consecutive sentences of one source document, at most ``max_sentences`` per group.

    Multi-sentence groups give the transformer inputs longer than one window, which is where
    strided-span bugs show up.
    """
    if max_sentences < 1:
        raise ValueError("max_sentences must be at least 1")
    groups: list[list[Sentence]] = []
    for sentence in sentences:
        last = groups[-1] if groups else None
        if last and last[-1].doc_id == sentence.doc_id and len(last) < max_sentences:
            last.append(sentence)
        else:
            groups.append([sentence])
    return groups


def _doc_ents(sentences: Sequence[Sentence]) -> list[str | None] | None:
    if all(s.ner is None for s in sentences):
        return None
    ents: list[str | None] = []
    for sentence in sentences:
        ents.extend(sentence.ner if sentence.ner is not None else [None] * len(sentence))
    return ents


def to_gold_doc(vocab: Vocab, sentences: Sequence[Sentence]) -> Doc:
    """One gold ``Doc`` for consecutive sentences; sentence boundaries come from the trees.

    Tokens of sentences without NER keep a missing entity IOB, so they neither count as
    "outside" in evaluation nor teach the NER that they are.
    """
    if not sentences:
        raise ValueError("to_gold_doc needs at least one sentence")
    words: list[str] = []
    spaces: list[bool] = []
    heads: list[int] = []
    for sentence in sentences:
        offset = len(words)
        words.extend(sentence.words)
        spaces.extend(sentence.spaces)
        heads.extend(offset + head for head in sentence.heads)
    spaces[-1] = False
    return Doc(
        vocab,
        words=words,
        spaces=spaces,
        tags=[t for s in sentences for t in s.xpos],
        pos=[p for s in sentences for p in s.upos],
        heads=heads,
        deps=[d for s in sentences for d in s.deps],
        ents=_doc_ents(sentences),
    )


def load_documents(
    split: str = "test",
    *,
    max_sentences: int = 8,
    limit_sentences: int | None = None,
    data_dir: Path | None = None,
    vocab: Vocab | None = None,
) -> list[Doc]:
    """Gold docs of up to ``max_sentences`` sentences from the first ``limit_sentences``."""
    sentences = read_sentences(split, data_dir)
    if limit_sentences is not None:
        sentences = sentences[:limit_sentences]
    shared_vocab = vocab if vocab is not None else spacy.blank("en").vocab
    return [to_gold_doc(shared_vocab, g) for g in group_documents(sentences, max_sentences)]


def document_texts(split: str = "test", *, sentences: int, max_sentences: int = 8) -> list[str]:
    """The texts of :func:`load_documents`'s documents over the first ``sentences``."""
    docs = load_documents(split, max_sentences=max_sentences, limit_sentences=sentences)
    return [doc.text for doc in docs]


def recorded_test_batches(nlp: Language, spec: EncoderSpec, sentences: int) -> list[EncoderInputs]:
    """The batches spaCy hands ``nlp``'s first transformer (run on PyTorch) over the first
    ``sentences`` UD-EWT test sentences: strided spans padded to the longest, exactly as
    served, for the benchmarks that time the encoder alone."""
    location = find_shim(find_transformer_components(nlp)[0])
    calls, _ = record_calls(nlp, location, spec, document_texts("test", sentences=sentences))
    return calls
