"""Byte-level BPE and WordPiece vocabularies trained offline on EWT text.

RoBERTa- and BERT-style samples need piece vocabularies, and CI cannot download the real ones.
Training on EWT dev with ``tokenizers`` takes well under a second and gives pieces that look
like real ones on the EWT test text the suites annotate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from spacy_accelerate_samples import ewt
from spacy_accelerate_samples.config_text import loader_section_name, section

ROBERTA_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True)
class ByteBpeVocab:
    """GPT-2 style ``vocab.json`` + ``merges.txt`` for the RoBERTa piece encoder."""

    vocab_path: Path
    merges_path: Path

    def size(self) -> int:
        ids = json.loads(self.vocab_path.read_text(encoding="utf8")).values()
        return max(ids) + 1

    def loader_section(self, component: str = "transformer") -> str:
        return section(
            loader_section_name(component),
            {
                "@model_loaders": "spacy-curated-transformers.ByteBpeLoader.v1",
                "vocab_path": str(self.vocab_path),
                "merges_path": str(self.merges_path),
            },
        )


@dataclass(frozen=True)
class WordpieceVocab:
    """BERT ``vocab.txt`` (one piece per line, line number = id) and its normalisation."""

    path: Path
    lowercase: bool = False
    strip_accents: bool = False

    def size(self) -> int:
        return len(self.path.read_text(encoding="utf8").splitlines())

    def loader_section(self, component: str = "transformer") -> str:
        return section(
            loader_section_name(component),
            {
                "@model_loaders": "spacy-curated-transformers.WordpieceLoader.v1",
                "path": str(self.path),
                "lowercase": self.lowercase,
                "strip_accents": self.strip_accents,
            },
        )


def ewt_training_texts() -> list[str]:
    """EWT dev sentences: the piece vocabularies' training text (the suites annotate test)."""
    return [sentence.text for sentence in ewt.read_sentences("dev")]


def train_byte_bpe_vocab(output_dir: Path, *, vocab_size: int = 1000) -> ByteBpeVocab:
    """A RoBERTa-style byte-level BPE trained on EWT dev; specials get ids 0..4 as in RoBERTa."""
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        ewt_training_texts(),
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(ROBERTA_SPECIAL_TOKENS),
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_model(str(output_dir))
    return ByteBpeVocab(output_dir / "vocab.json", output_dir / "merges.txt")


def train_wordpiece_vocab(output_dir: Path, *, vocab_size: int = 1500) -> WordpieceVocab:
    """A cased BERT WordPiece vocab from EWT text, ``[PAD]`` first so its id is 0.

    Built by counting, not by ``tokenizers``' WordPiece trainer, whose hash-map tie-breaking
    made two builds differ in rare pieces: the samples (and so the tests) must be the same
    on every machine. The vocab is the special tokens, every character seen (word-initial
    and ``##`` continuation), then the most frequent words (count >= 2, ties by spelling);
    greedy longest-match WordPiece falls back to characters for any other word.
    """
    from collections import Counter

    from tokenizers.pre_tokenizers import BertPreTokenizer

    split = BertPreTokenizer()
    counts: Counter[str] = Counter()
    for text in ewt_training_texts():
        counts.update(word for word, _ in split.pre_tokenize_str(text))
    chars = sorted({char for word in counts for char in word})
    pieces = [*BERT_SPECIAL_TOKENS, *chars, *(f"##{char}" for char in chars)]
    known = set(pieces)
    frequent = sorted((w for w, n in counts.items() if n >= 2), key=lambda w: (-counts[w], w))
    pieces += [w for w in frequent if w not in known][: max(0, vocab_size - len(pieces))]
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "vocab.txt").write_text("".join(f"{piece}\n" for piece in pieces), "utf8")
    return WordpieceVocab(output_dir / "vocab.txt", lowercase=False, strip_accents=False)
