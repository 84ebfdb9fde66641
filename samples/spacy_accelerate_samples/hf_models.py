"""Tiny random Hugging Face encoders with locally trained tokenizers, saved as model folders.

spacy-transformers pipelines are initialised from a Hugging Face model *name*; a local folder
with ``config.json``, ``model.safetensors`` and the tokenizer files is a name that
``AutoTokenizer``/``AutoModel.from_pretrained`` resolve offline.  Each family keeps what makes
it different for an exporter: RoBERTa/XLM-R position ids offset by the padding index,
DistilBERT without token types, ELECTRA's embedding projection, BERT's pooler.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from spacy_accelerate_samples.piece_vocabs import train_byte_bpe_vocab, train_wordpiece_vocab
from spacy_accelerate_samples.sentencepiece_vocab import (
    FAIRSEQ_SPECIALS,
    fairseq_tokenizer,
    train_sentencepiece_model,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerFast

HfFamily = Literal["bert", "roberta", "xlmr", "distilbert", "electra"]

#: Families whose position ids start after the padding index (fairseq style).
_OFFSET_POSITIONS = ("roberta", "xlmr")


@dataclass(frozen=True)
class HfSpec:
    """A tiny random encoder: its family, shapes and the size of its trained vocabulary.

    ``type_vocab_size`` 0 means the model has no token types (DistilBERT), so its tokenizer
    returns no ``token_type_ids``; ``embedding_width`` is ELECTRA's factorised embedding width.
    """

    family: HfFamily
    hidden_width: int
    num_attention_heads: int
    num_hidden_layers: int
    intermediate_width: int
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    embedding_width: int | None = None
    vocab_size: int = 1000
    model_max_length: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden_width % self.num_attention_heads:
            raise ValueError("hidden_width must be divisible by num_attention_heads")
        if (self.type_vocab_size == 0) != (self.family == "distilbert"):
            raise ValueError("only DistilBERT (and every DistilBERT) has no token types")
        if self.embedding_width is not None and self.family != "electra":
            raise ValueError("embedding_width is an ELECTRA-only setting")
        offset = 2 if self.family in _OFFSET_POSITIONS else 0
        if self.max_position_embeddings < self.model_max_length + offset:
            raise ValueError("max_position_embeddings too small for model_max_length")


def _wordpiece_tokenizer(spec: HfSpec, workdir: Path) -> PreTrainedTokenizerFast:
    from transformers import BertTokenizerFast, DistilBertTokenizerFast, ElectraTokenizerFast

    classes = {
        "bert": BertTokenizerFast,
        "distilbert": DistilBertTokenizerFast,
        "electra": ElectraTokenizerFast,
    }
    vocab = train_wordpiece_vocab(workdir, vocab_size=spec.vocab_size)
    return classes[spec.family](
        vocab_file=str(vocab.path),
        do_lower_case=False,
        strip_accents=False,
        model_max_length=spec.model_max_length,
    )


def train_hf_tokenizer(spec: HfSpec, workdir: Path) -> PreTrainedTokenizerFast:
    """The family's fast tokenizer over pieces trained on EWT dev (files under ``workdir``)."""
    if spec.family == "roberta":
        from transformers import RobertaTokenizerFast

        bpe = train_byte_bpe_vocab(workdir, vocab_size=spec.vocab_size)
        return RobertaTokenizerFast(
            vocab_file=str(bpe.vocab_path),
            merges_file=str(bpe.merges_path),
            model_max_length=spec.model_max_length,
        )
    if spec.family == "xlmr":
        model_path = workdir / "sentencepiece.model"
        train_sentencepiece_model(model_path, vocab_size=spec.vocab_size, specials=FAIRSEQ_SPECIALS)
        return fairseq_tokenizer(model_path, "xlmr", model_max_length=spec.model_max_length)
    return _wordpiece_tokenizer(spec, workdir)


def hf_config(spec: HfSpec, tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    """The family's config for ``spec``, sized to the tokenizer and padded with its pad id."""
    from transformers import (
        BertConfig,
        DistilBertConfig,
        ElectraConfig,
        RobertaConfig,
        XLMRobertaConfig,
    )

    common = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}
    if spec.family == "distilbert":
        return DistilBertConfig(
            dim=spec.hidden_width,
            n_layers=spec.num_hidden_layers,
            n_heads=spec.num_attention_heads,
            hidden_dim=spec.intermediate_width,
            activation=spec.hidden_act,
            max_position_embeddings=spec.max_position_embeddings,
            **common,
        )
    bert_like = {
        "hidden_size": spec.hidden_width,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "intermediate_size": spec.intermediate_width,
        "hidden_act": spec.hidden_act,
        "layer_norm_eps": spec.layer_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings,
        "type_vocab_size": spec.type_vocab_size,
        **common,
    }
    if spec.family == "electra":
        return ElectraConfig(embedding_size=spec.embedding_width or spec.hidden_width, **bert_like)
    if spec.family in _OFFSET_POSITIONS:
        config_cls = RobertaConfig if spec.family == "roberta" else XLMRobertaConfig
        return config_cls(
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **bert_like
        )
    return BertConfig(**bert_like)


def write_tiny_hf_model(spec: HfSpec, output_dir: Path) -> Path:
    """Save a random ``spec`` encoder and its tokenizer to ``output_dir``; returns the folder.

    The weights come from the family's own initialiser under ``torch.manual_seed(spec.seed)``.
    """
    from transformers import AutoModel

    with tempfile.TemporaryDirectory() as workdir:
        tokenizer = train_hf_tokenizer(spec, Path(workdir))
        output_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(str(output_dir))
    torch.manual_seed(spec.seed)
    model = AutoModel.from_config(hf_config(spec, tokenizer))
    model.save_pretrained(str(output_dir), safe_serialization=True)
    return output_dir
