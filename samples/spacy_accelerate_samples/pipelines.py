"""The named sample pipelines and their on-disk cache.

Tests, demos and benchmarks ask for a pipeline by name (:data:`SAMPLE_NAMES`) and get a folder
``spacy.load`` can read, built offline on first use and reused afterwards:

* curated (``curated_transformer``), see :mod:`.curated`: "roberta", "bert", "minilm" (real
  all-MiniLM-L6-v2 weights), "xlmr", "camembert", "albert", "roberta-scalar" (scalar-weighted
  listeners over all layers) and "roberta-two" (two transformer components);
* spacy-transformers (``transformer``), see :mod:`.spacy_transformers_pipelines`: "st-bert",
  "st-bert-hidden" (with per-layer hidden states), "st-roberta", "st-xlmr", "st-distilbert",
  "st-electra" and "st-minilm".

Builders and specs live in those modules; this one only names them and caches their output.
The builder functions and specs of the first samples stay importable from here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from importlib import metadata
from pathlib import Path

import spacy
from filelock import FileLock
from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate_samples import ewt
from spacy_accelerate_samples.curated import (
    ALBERT_SPEC,
    BERT_SPEC,
    CAMEMBERT_SPEC,
    PIECE_VOCAB_DIR,
    ROBERTA_NER_SPEC,
    ROBERTA_SCALAR_HEADS,
    ROBERTA_SPEC,
    TRF_BASE_SPEC,
    TRF_BASE_VOCAB_SIZE,
    XLMR_SPEC,
    build_albert_sample,
    build_bert_sample,
    build_camembert_sample,
    build_curated_pipeline,
    build_minilm_sample,
    build_pipeline,
    build_roberta_sample,
    build_roberta_scalar_sample,
    build_roberta_two_sample,
    build_trf_base_sample,
    build_xlmr_sample,
    curated_torch_module,
    load_hf_encoder_weights,
    minilm_model_path,
    minilm_spec,
)
from spacy_accelerate_samples.curated_config import CuratedSpec, Family, PieceVocab, render_config
from spacy_accelerate_samples.piece_vocabs import (
    BERT_SPECIAL_TOKENS,
    ROBERTA_SPECIAL_TOKENS,
    ByteBpeVocab,
    WordpieceVocab,
    train_byte_bpe_vocab,
    train_wordpiece_vocab,
)
from spacy_accelerate_samples.spacy_transformers_pipelines import (
    SPACY_TRANSFORMERS_SPECS,
    build_spacy_transformers_sample,
    set_hf_transformer_config,
)

SAMPLES_ENV_VAR = "SPACY_ACCELERATE_SAMPLES"
# Bump whenever a builder changes what it writes, so stale caches are never reused.
# 2: config.cfg paths point at the cached folder instead of the build's staging folder.
BUILDER_VERSION = "3"
SAMPLE_TRAIN_SENTENCES = 300

SampleBuilder = Callable[..., Path]

_CURATED_DISTS = ("spacy", "spacy-curated-transformers", "curated-transformers", "tokenizers")
_SENTENCEPIECE_DISTS = (*_CURATED_DISTS, "sentencepiece", "transformers")
_SPACY_TRANSFORMERS_DISTS = (
    "spacy",
    "spacy-transformers",
    "transformers",
    "torch",
    "tokenizers",
    "sentencepiece",
)


@dataclass(frozen=True)
class SampleRecipe:
    """How to build one named sample, and what (besides this code) its files depend on.

    ``describe`` returns the JSON-able settings that go into the cache fingerprint; ``dists``
    are the distributions whose versions do.
    """

    build: SampleBuilder
    describe: Callable[[], object]
    dists: tuple[str, ...] = _CURATED_DISTS


def _spec(spec: CuratedSpec) -> Callable[[], object]:
    return lambda: asdict(spec)


def _spacy_transformers_recipe(name: str) -> SampleRecipe:
    spec = SPACY_TRANSFORMERS_SPECS[name]
    return SampleRecipe(
        partial(build_spacy_transformers_sample, spec),
        lambda: asdict(spec),
        _SPACY_TRANSFORMERS_DISTS,
    )


_RECIPES: dict[str, SampleRecipe] = {
    "roberta": SampleRecipe(build_roberta_sample, _spec(ROBERTA_SPEC)),
    "bert": SampleRecipe(build_bert_sample, _spec(BERT_SPEC)),
    "trf-base": SampleRecipe(
        build_trf_base_sample,
        lambda: {"spec": asdict(TRF_BASE_SPEC), "vocab_size": TRF_BASE_VOCAB_SIZE},
    ),
    "minilm": SampleRecipe(build_minilm_sample, lambda: asdict(minilm_spec())),
    "xlmr": SampleRecipe(build_xlmr_sample, _spec(XLMR_SPEC), _SENTENCEPIECE_DISTS),
    "camembert": SampleRecipe(build_camembert_sample, _spec(CAMEMBERT_SPEC), _SENTENCEPIECE_DISTS),
    "albert": SampleRecipe(build_albert_sample, _spec(ALBERT_SPEC), _SENTENCEPIECE_DISTS),
    "roberta-scalar": SampleRecipe(
        build_roberta_scalar_sample,
        lambda: {"spec": asdict(ROBERTA_SPEC), "scalar_heads": ROBERTA_SCALAR_HEADS},
    ),
    "roberta-two": SampleRecipe(
        build_roberta_two_sample,
        lambda: {"transformer": asdict(ROBERTA_SPEC), "transformer_ner": asdict(ROBERTA_NER_SPEC)},
    ),
    **{name: _spacy_transformers_recipe(name) for name in SPACY_TRANSFORMERS_SPECS},
}

SAMPLE_NAMES: tuple[str, ...] = tuple(_RECIPES)
CURATED_SAMPLE_NAMES: tuple[str, ...] = tuple(
    name for name in SAMPLE_NAMES if name not in SPACY_TRANSFORMERS_SPECS
)
SPACY_TRANSFORMERS_SAMPLE_NAMES: tuple[str, ...] = tuple(SPACY_TRANSFORMERS_SPECS)


def default_cache_root() -> Path:
    override = os.environ.get(SAMPLES_ENV_VAR)
    if override:
        return Path(override)
    return Path.home() / ".cache" / "spacy-accelerate-samples"


def _fingerprint(name: str) -> str:
    """Changes whenever anything that determines the saved files could have changed."""
    recipe = _RECIPES[name]
    payload = {
        "builder": BUILDER_VERSION,
        "name": name,
        "spec": recipe.describe(),
        "train_sentences": SAMPLE_TRAIN_SENTENCES,
        "versions": {dist: metadata.version(dist) for dist in recipe.dists},
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf8"))
    return digest.hexdigest()[:12]


def sample_train_docs() -> list[Doc]:
    """Gold docs whose labels the sample heads are initialised with."""
    return ewt.load_documents("dev", limit_sentences=SAMPLE_TRAIN_SENTENCES)


def _relocate_config(folder: Path, old: Path, new: Path) -> None:
    """Point the paths in ``config.cfg`` (piece vocabularies, HF model) at the final folder.

    Builders write into a staging folder that is renamed afterwards; without this, the
    config would name files that no longer exist and the pipeline could not be re-initialised.
    """
    config = folder / "config.cfg"
    text = config.read_text(encoding="utf8")
    config.write_text(text.replace(str(old), str(new)), encoding="utf8")


def build_cached(target: Path, build: Callable[[Path], object]) -> Path:
    """``target``, built by ``build(staging)`` on first use.

    The build goes into a sibling temp dir that is renamed into place, so readers never see a
    half-written sample, and a file lock serialises builders across processes (e.g.
    pytest-xdist workers).
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if target.is_dir():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(staging)
            _relocate_config(staging, staging, target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


def _build_recipe(name: str, staging: Path) -> None:
    started = time.perf_counter()
    _RECIPES[name].build(staging, train_docs=sample_train_docs())
    info = {"name": name, "build_seconds": round(time.perf_counter() - started, 2)}
    (staging / "sample.json").write_text(json.dumps(info, indent=2), encoding="utf8")


def ensure_sample(name: str, cache_root: Path | None = None) -> Path:
    """Path of a cached sample pipeline (``spacy.load``-able), building it on first use."""
    if name not in _RECIPES:
        raise ValueError(f"Unknown sample {name!r}; expected one of {SAMPLE_NAMES}")
    root = cache_root if cache_root is not None else default_cache_root()
    return build_cached(root / f"{name}-{_fingerprint(name)}", partial(_build_recipe, name))


def load_sample(
    name: str,
    cache_root: Path | None = None,
    *,
    transformer_config: Mapping[str, object] | None = None,
) -> Language:
    """``spacy.load`` of :func:`ensure_sample`.

    ``transformer_config`` (spacy-transformers samples only) updates the Hugging Face model
    config after loading, e.g. ``{"output_hidden_states": True}`` to get every layer's hidden
    state in ``doc._.trf_data.model_output.hidden_states``; see
    :func:`~.spacy_transformers_pipelines.set_hf_transformer_config` for why this is not done
    through ``spacy.load``'s config overrides.
    """
    if transformer_config and name not in SPACY_TRANSFORMERS_SPECS:
        raise ValueError(f"transformer_config applies to spacy-transformers samples, not {name!r}")
    nlp = spacy.load(ensure_sample(name, cache_root))
    if transformer_config:
        set_hf_transformer_config(nlp, transformer_config)
    return nlp


__all__ = [
    "BERT_SPECIAL_TOKENS",
    "BERT_SPEC",
    "BUILDER_VERSION",
    "CURATED_SAMPLE_NAMES",
    "PIECE_VOCAB_DIR",
    "ROBERTA_SPECIAL_TOKENS",
    "ROBERTA_SPEC",
    "SAMPLES_ENV_VAR",
    "SAMPLE_NAMES",
    "SAMPLE_TRAIN_SENTENCES",
    "SPACY_TRANSFORMERS_SAMPLE_NAMES",
    "ByteBpeVocab",
    "CuratedSpec",
    "Family",
    "PieceVocab",
    "SampleRecipe",
    "WordpieceVocab",
    "build_bert_sample",
    "build_curated_pipeline",
    "build_minilm_sample",
    "build_pipeline",
    "build_roberta_sample",
    "curated_torch_module",
    "default_cache_root",
    "ensure_sample",
    "load_hf_encoder_weights",
    "load_sample",
    "minilm_model_path",
    "minilm_spec",
    "render_config",
    "sample_train_docs",
    "train_byte_bpe_vocab",
    "train_wordpiece_vocab",
]
