"""Build the built-in calibration sample: ~9,000 spaCy tokens of mixed-genre English.

    python benchmarks/build_calibration_sample.py [--data-dir DIR] [--check]

int8 and bf16 plans are calibrated, and gated on their agreement with PyTorch, over the
built-in sample when no ``calibration_texts`` are given. A sample of one genre (the old
``calibration_ewt_dev.txt`` is mostly news-like weblog text) leaves the activations of
other registers unseen, so this one mixes six genres in roughly equal token shares:

* five from the UD English-EWT **dev** split (never test: test is the held-out
  evaluation), by ``# sent_id`` prefix: weblog, newsgroup, email, answers, reviews;
* one technical genre: prose paragraphs of the Python documentation shipped inside
  CPython (``pydoc_data.topics``), without code, grammar, tables, lists or notes.

Each line of ``src/spacy_accelerate/data/calibration_sample.txt`` is one document: up to
four consecutive sentences of one source document (an EWT ``# newdoc id``, or one
paragraph of a documentation topic). Per genre, the candidate documents are taken in
source order and an evenly spaced subset is kept whose token count comes closest to the
genre's share, so the sample spreads over the whole source. Documents that contain a
sentence of the EWT test split are never candidates (and the result is checked for
that). Each genre's lines are spread evenly over the file, so any prefix of it is mixed too. The
sidecar ``calibration_sample.genres`` names each line's genre.

There is no randomness: rerunning gives the same files byte for byte. The Python genre
depends on the interpreter's ``pydoc_data`` (built with CPython 3.11.7; another version
warns and will differ). ``--check`` rebuilds in memory and fails if the shipped files
differ. Token counts use ``spacy.blank("en")``'s tokenizer.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import spacy

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_DIR = ROOT / "src" / "spacy_accelerate" / "data"
SAMPLE_NAME = "calibration_sample.txt"
GENRES_NAME = "calibration_sample.genres"

#: Where the EWT splits live unless ``--data-dir`` says otherwise (the repository's
#: ``data/`` folder, or ``$SPACY_ACCELERATE_DATA`` like the test suite).
DATA_ENV_VAR = "SPACY_ACCELERATE_DATA"

#: The CPython whose ``pydoc_data.topics`` the shipped sample was built from.
BUILT_WITH_PYTHON = (3, 11, 7)

EWT_GENRES = ("weblog", "newsgroup", "email", "answers", "reviews")
PYTHON_DOCS_GENRE = "python_docs"
GENRES = (*EWT_GENRES, PYTHON_DOCS_GENRE)

#: Target tokens per genre: six genres, ~9,000 tokens in all.
TOKENS_PER_GENRE = 1500
MAX_SENTENCES = 4

#: EWT test sentences shorter than this (in characters) are not looked for in the sample:
#: "Thanks!" or "Hi John," occur inside any English text.
MIN_TEST_SENTENCE_CHARS = 25

#: Python-docs paragraphs with fewer words are headings, captions or fragments.
MIN_PARAGRAPH_WORDS = 8


@dataclass(frozen=True)
class Document:
    genre: str
    text: str


def default_data_dir() -> Path:
    override = os.environ.get(DATA_ENV_VAR)
    return Path(override) if override else ROOT / "data"


def _normalize(text: str) -> str:
    return " ".join(text.split())


# --- UD English-EWT -------------------------------------------------------------------


def _ewt_sentences(path: Path) -> Iterator[tuple[str, str]]:
    """``(newdoc id, text)`` of each sentence, in file order."""
    doc_id = ""
    with path.open(encoding="utf8") as lines:
        for line in lines:
            if line.startswith("# newdoc id = "):
                doc_id = line[len("# newdoc id = ") :].strip()
            elif line.startswith("# text = "):
                yield doc_id, line[len("# text = ") :].strip()


def ewt_test_sentences(data_dir: Path) -> list[str]:
    """The EWT test sentences long enough to look for in the sample (whitespace-normalized)."""
    path = data_dir / "ud_english_ewt" / "en_ewt-ud-test.conllu"
    texts = {_normalize(text) for _doc, text in _ewt_sentences(path)}
    return sorted(text for text in texts if len(text) >= MIN_TEST_SENTENCE_CHARS)


def ewt_candidates(data_dir: Path) -> dict[str, list[str]]:
    """Per EWT genre, its dev documents of up to four consecutive sentences, in file order."""
    path = data_dir / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
    groups: list[tuple[str, list[str]]] = []
    for doc_id, text in _ewt_sentences(path):
        if groups and groups[-1][0] == doc_id and len(groups[-1][1]) < MAX_SENTENCES:
            groups[-1][1].append(text)
        else:
            groups.append((doc_id, [text]))
    candidates: dict[str, list[str]] = {genre: [] for genre in EWT_GENRES}
    for doc_id, texts in groups:
        genre = doc_id.split("-", 1)[0]
        if genre not in candidates:
            raise ValueError(f"unknown EWT genre in newdoc id {doc_id!r}")
        candidates[genre].append(" ".join(texts))
    return candidates


# --- Python documentation -------------------------------------------------------------

_UNDERLINE = re.compile(r"^([*=\-~^\"'`#+])\1{2,}$")
_ROLE = re.compile(r":(?:[\w-]+:)?[\w-]+:`(?:~|!)?([^`<]*?)(?:\s*<[^`>]*>)?`")
_EMPHASIS = re.compile(r"(?<![\w\"*])\*{1,2}(\S(?:[^*]*?\S)?)\*{1,2}(?![\w\"*])")
_FOOTNOTE = re.compile(r"\s*\[\d+\]")
_NON_PROSE_START = re.compile(r"^(>>>|\.\.\.|\.\. |[*+\-|\[(#]|\d+\.\s|[a-z]\)\s|-\[)")
_NON_PROSE_PARAGRAPH = (
    "Note:",
    "See also:",
    "Warning:",
    "New in version",
    "Changed in version",
    "Deprecated since version",
    "Added in version",
    "For example:",
)
_ABBREVIATIONS = ("e.g.", "i.e.", "cf.", "vs.", "etc.", "Mr.", "Dr.", "No.")
_BOUNDARY = re.compile(r"(?<=[.!?])([\"”')]?)\s+(?=[A-Z\"“(])")


def _clean_markup(text: str) -> str:
    text = _ROLE.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = _FOOTNOTE.sub("", text)
    return _normalize(text)


def _join_lines(rows: Iterable[str]) -> str:
    """One paragraph's wrapped lines as one line: ``built-`` + ``in`` is ``built-in``."""
    text = ""
    for row in rows:
        glue = "" if not text or re.search(r"\w-$", text) else " "
        text += glue + row
    return text


def _prose_paragraphs(topic: str) -> Iterator[str]:
    """Paragraphs of plain prose: every line flush left, not a heading, list item, code,
    table, grammar rule, note or footnote, ending with a full stop."""
    lines = topic.splitlines()
    paragraph: list[str] = []
    for index, line in enumerate([*lines, ""]):
        if line.strip():
            paragraph.append(line)
            continue
        block, paragraph = paragraph, []
        if not block:
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if any(_UNDERLINE.match(row.strip()) for row in block) or _UNDERLINE.match(following):
            continue  # a heading
        if any(row[0].isspace() for row in block) or _NON_PROSE_START.match(block[0]):
            continue  # code, quoted blocks, list items, tables, footnotes
        text = _join_lines(row.strip() for row in block)
        if text.startswith(_NON_PROSE_PARAGRAPH) or "::=" in text or ">>>" in text:
            continue
        text = _clean_markup(text)
        if not text.endswith(".") or len(text.split()) < MIN_PARAGRAPH_WORDS:
            continue
        yield text


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of one prose paragraph (full stop, question or exclamation mark followed
    by a capital or an opening quote; not after a common abbreviation)."""
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(paragraph):
        end = match.start() + len(match.group(1))
        if paragraph[start:end].endswith(_ABBREVIATIONS):
            continue
        sentences.append(paragraph[start:end].strip())
        start = match.end()
    sentences.append(paragraph[start:].strip())
    return [sentence for sentence in sentences if sentence]


def python_docs_candidates() -> list[str]:
    """Documents of up to four consecutive sentences of one prose paragraph of the
    documentation topics, in ``pydoc_data.topics`` order."""
    from pydoc_data.topics import topics

    candidates: list[str] = []
    for name in topics:
        for paragraph in _prose_paragraphs(topics[name]):
            sentences = split_sentences(paragraph)
            for first in range(0, len(sentences), MAX_SENTENCES):
                candidates.append(" ".join(sentences[first : first + MAX_SENTENCES]))
    return candidates


# --- selection ------------------------------------------------------------------------


def spread(texts: Sequence[str], counts: Sequence[int], target: int) -> list[int]:
    """Indices of ``n`` evenly spaced texts (the middles of ``n`` equal stretches), for the
    ``n`` whose token count comes closest to ``target`` (the smaller ``n`` on a tie)."""
    best: tuple[int, list[int]] | None = None
    for n in range(1, len(texts) + 1):
        picked = [(2 * j + 1) * len(texts) // (2 * n) for j in range(n)]
        miss = abs(sum(counts[i] for i in picked) - target)
        if best is None or miss < best[0]:
            best = (miss, picked)
    return [] if best is None else best[1]


def _usable(texts: Sequence[str], test_sentences: Sequence[str]) -> list[str]:
    """Texts in order, without repeats and without any that hold an EWT test sentence."""
    seen: set[str] = set()
    kept: list[str] = []
    for text in texts:
        flat = _normalize(text)
        if flat in seen or any(sentence in flat for sentence in test_sentences):
            continue
        seen.add(flat)
        kept.append(text)
    return kept


def interleave(chosen: dict[str, list[str]]) -> list[Document]:
    """All genres' documents, each genre spread evenly over the file: a genre's ``i``-th of
    ``n`` documents sits at ``(i + 1/2) / n`` (ties in :data:`GENRES` order)."""
    placed = [
        ((2 * i + 1) / (2 * len(texts)), GENRES.index(genre), Document(genre, text))
        for genre, texts in chosen.items()
        for i, text in enumerate(texts)
    ]
    return [document for _position, _genre, document in sorted(placed, key=lambda p: p[:2])]


def build(
    data_dir: Path | None = None, count_tokens: Callable[[str], int] | None = None
) -> list[Document]:
    """The sample's documents, in file order."""
    data_dir = default_data_dir() if data_dir is None else data_dir
    if count_tokens is None:
        tokenizer = spacy.blank("en").tokenizer
        count_tokens = lambda text: len(tokenizer(text))  # noqa: E731
    test_sentences = ewt_test_sentences(data_dir)
    candidates = {**ewt_candidates(data_dir), PYTHON_DOCS_GENRE: python_docs_candidates()}
    chosen: dict[str, list[str]] = {}
    for genre in GENRES:
        texts = _usable(candidates[genre], test_sentences)
        counts = [count_tokens(text) for text in texts]
        chosen[genre] = [texts[i] for i in spread(texts, counts, TOKENS_PER_GENRE)]
    documents = interleave(chosen)
    for document in documents:
        flat = _normalize(document.text)
        assert "\n" not in document.text and flat == document.text.strip(), document
        leaked = [sentence for sentence in test_sentences if sentence in flat]
        assert not leaked, f"EWT test sentences in the sample: {leaked}"
    return documents


def render(documents: Sequence[Document]) -> tuple[str, str]:
    """The sample file's text and the genres sidecar's text."""
    sample = "".join(f"{document.text}\n" for document in documents)
    genres = "".join(f"{document.genre}\n" for document in documents)
    return sample, genres


def genre_tokens(documents: Sequence[Document]) -> Counter[str]:
    tokenizer = spacy.blank("en").tokenizer
    tokens: Counter[str] = Counter()
    for document in documents:
        tokens[document.genre] += len(tokenizer(document.text))
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None, help="holds ud_english_ewt/")
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR)
    parser.add_argument(
        "--check", action="store_true", help="rebuild in memory; fail if the files differ"
    )
    args = parser.parse_args()
    if sys.version_info[:3] != BUILT_WITH_PYTHON:
        print(
            f"warning: the shipped sample was built with Python "
            f"{'.'.join(map(str, BUILT_WITH_PYTHON))}; this Python's pydoc_data differs",
            file=sys.stderr,
        )
    documents = build(args.data_dir)
    sample, genres = render(documents)
    tokens = genre_tokens(documents)
    lines = Counter(document.genre for document in documents)
    for genre in GENRES:
        print(f"{genre:12} {lines[genre]:4d} lines {tokens[genre]:6,d} tokens")
    print(f"{'total':12} {len(documents):4d} lines {sum(tokens.values()):6,d} tokens")
    sample_path = args.output_dir / SAMPLE_NAME
    genres_path = args.output_dir / GENRES_NAME
    if args.check:
        same = (
            sample_path.read_text(encoding="utf8") == sample
            and genres_path.read_text(encoding="utf8") == genres
        )
        print("shipped files match" if same else "shipped files DIFFER")
        raise SystemExit(0 if same else 1)
    sample_path.write_text(sample, encoding="utf8", newline="\n")
    genres_path.write_text(genres, encoding="utf8", newline="\n")
    print(f"wrote {sample_path} and {genres_path}")


if __name__ == "__main__":
    main()
