"""SentencePiece models trained offline on EWT text, for ALBERT, XLM-R and CamemBERT samples.

Three id layouts matter, because the piece encoders of spacy-curated-transformers rewrite
SentencePiece ids differently:

* ALBERT (``SentencepieceEncoder.v1``) uses the raw ids, so the model itself reserves
  ``<pad>``=0, ``<unk>``=1, ``[CLS]``=2 (BOS), ``[SEP]``=3 (EOS) and ``[MASK]``=4.
* XLM-R (``XlmrSentencepieceEncoder.v1``) assumes SentencePiece's default ``<unk>``=0,
  ``<s>``=1, ``</s>``=2 and maps them to fairseq's ``<unk>``=3, ``<s>``=0, ``</s>``=2; every
  other piece moves up by one (fairseq's ``<pad>`` is 1).
* CamemBERT (``CamembertSentencepieceEncoder.v1``) maps ``<unk>`` to 3 and moves *every* other
  piece, BOS and EOS included, up by four (so ``<s>`` is 5 and ``</s>`` is 6).

The Hugging Face fast tokenizers (``XLMRobertaTokenizerFast``, ``CamembertTokenizerFast``) apply
the same shifts and append ``<mask>``, so a model's vocabulary is the piece count plus
:data:`FAIRSEQ_EXTRA_IDS`.  ``SentencepieceLoader.v1`` cannot initialise the XLM-R/CamemBERT
encoders (it stores the processor on the outer ``chain``, not on the inner SentencePiece layer
that reads it, so encoding fails with "Model is not initialized"); their samples therefore load
the pieces through ``HFPieceEncoderLoader.v1`` from a local tokenizer folder, which does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from spacy_accelerate_samples.config_text import loader_section_name, section
from spacy_accelerate_samples.piece_vocabs import ewt_training_texts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

FairseqLayout = Literal["xlmr", "camembert"]

SENTENCEPIECE_MODEL_FILE = "sentencepiece.model"
HF_TOKENIZER_DIR = "hf_tokenizer"
#: Ids a fairseq-style vocabulary has beyond the SentencePiece pieces (offset + ``<mask>``).
FAIRSEQ_EXTRA_IDS: dict[FairseqLayout, int] = {"xlmr": 2, "camembert": 5}


@dataclass(frozen=True)
class SentencepieceSpecials:
    """The reserved ids a SentencePiece model is trained with (-1 disables a piece)."""

    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    bos_piece: str = "<s>"
    eos_piece: str = "</s>"
    user_defined_symbols: tuple[str, ...] = ()


#: SentencePiece's defaults, which the XLM-R and CamemBERT adapters hard-code.
FAIRSEQ_SPECIALS = SentencepieceSpecials()
#: ALBERT's ``spiece.model`` layout; ``padding_idx`` 0 is ``<pad>``.
ALBERT_SPECIALS = SentencepieceSpecials(
    unk_id=1,
    bos_id=2,
    eos_id=3,
    pad_id=0,
    bos_piece="[CLS]",
    eos_piece="[SEP]",
    user_defined_symbols=("[MASK]",),
)


def _piece_count(path: Path) -> int:
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(path)).get_piece_size()


@dataclass(frozen=True)
class SentencepieceVocab:
    """A SentencePiece model whose ids the encoder uses as they are (ALBERT)."""

    path: Path

    def size(self) -> int:
        return _piece_count(self.path)

    def loader_section(self, component: str = "transformer") -> str:
        return section(
            loader_section_name(component),
            {
                "@model_loaders": "spacy-curated-transformers.SentencepieceLoader.v1",
                "path": str(self.path),
            },
        )


@dataclass(frozen=True)
class FairseqSentencepieceVocab:
    """A SentencePiece model plus the HF tokenizer folder that loads it (XLM-R, CamemBERT)."""

    path: Path
    tokenizer_dir: Path
    layout: FairseqLayout

    def size(self) -> int:
        return _piece_count(self.path) + FAIRSEQ_EXTRA_IDS[self.layout]

    def loader_section(self, component: str = "transformer") -> str:
        return section(
            loader_section_name(component),
            {
                "@model_loaders": "spacy-curated-transformers.HFPieceEncoderLoader.v1",
                "name": str(self.tokenizer_dir),
            },
        )


def train_sentencepiece_model(
    path: Path,
    *,
    vocab_size: int = 1000,
    model_type: Literal["unigram", "bpe"] = "unigram",
    specials: SentencepieceSpecials = FAIRSEQ_SPECIALS,
) -> Path:
    """Train a SentencePiece model on EWT dev and write it to ``path``.

    One thread keeps the result reproducible; ``hard_vocab_limit=False`` lets a small corpus
    yield slightly fewer pieces instead of failing.
    """
    import sentencepiece

    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = path.with_suffix("")
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(ewt_training_texts()),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        num_threads=1,
        hard_vocab_limit=False,
        minloglevel=2,
        unk_id=specials.unk_id,
        bos_id=specials.bos_id,
        eos_id=specials.eos_id,
        pad_id=specials.pad_id,
        bos_piece=specials.bos_piece,
        eos_piece=specials.eos_piece,
        user_defined_symbols=list(specials.user_defined_symbols),
    )
    prefix.with_suffix(".vocab").unlink()
    written = prefix.with_suffix(".model")
    if written != path:
        written.rename(path)
    return path


def fairseq_tokenizer(
    model_path: Path, layout: FairseqLayout, *, model_max_length: int = 512
) -> PreTrainedTokenizerFast:
    """The HF fast tokenizer of ``layout`` over a SentencePiece model, ids checked.

    The conversion to ``tokenizer.json`` needs ``protobuf``, which ``onnx`` already requires.
    """
    from transformers import CamembertTokenizerFast, XLMRobertaTokenizerFast

    tokenizer_cls = XLMRobertaTokenizerFast if layout == "xlmr" else CamembertTokenizerFast
    tokenizer = tokenizer_cls(vocab_file=str(model_path), model_max_length=model_max_length)
    expected = _piece_count(model_path) + FAIRSEQ_EXTRA_IDS[layout]
    if len(tokenizer) != expected:
        raise RuntimeError(f"{layout} tokenizer has {len(tokenizer)} ids, expected {expected}")
    return tokenizer


def write_fairseq_tokenizer(
    model_path: Path, output_dir: Path, layout: FairseqLayout, *, model_max_length: int = 512
) -> Path:
    """Save the HF fast tokenizer (``tokenizer.json`` + the SentencePiece file) for ``layout``."""
    tokenizer = fairseq_tokenizer(model_path, layout, model_max_length=model_max_length)
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(output_dir))
    return output_dir


def train_albert_vocab(output_dir: Path, *, vocab_size: int = 1000) -> SentencepieceVocab:
    """An ALBERT-layout unigram model (``<pad>``=0, ``[CLS]``/``[SEP]`` as BOS/EOS)."""
    path = output_dir / SENTENCEPIECE_MODEL_FILE
    train_sentencepiece_model(path, vocab_size=vocab_size, specials=ALBERT_SPECIALS)
    return SentencepieceVocab(path)


def train_fairseq_vocab(
    output_dir: Path,
    layout: FairseqLayout,
    *,
    vocab_size: int = 1000,
    model_type: Literal["unigram", "bpe"] = "unigram",
) -> FairseqSentencepieceVocab:
    """A SentencePiece model with default specials and its HF tokenizer folder next to it."""
    path = output_dir / SENTENCEPIECE_MODEL_FILE
    train_sentencepiece_model(path, vocab_size=vocab_size, model_type=model_type)
    tokenizer_dir = write_fairseq_tokenizer(path, output_dir / HF_TOKENIZER_DIR, layout)
    return FairseqSentencepieceVocab(path, tokenizer_dir, layout)
