"""Real text and offline-built pipelines for tests, demos and benchmarks."""

from .ewt import (
    DEFAULT_DATA_DIR,
    Sentence,
    group_documents,
    load_documents,
    read_sentences,
    to_gold_doc,
)
from .pipelines import (
    SAMPLE_NAMES,
    ByteBpeVocab,
    CuratedSpec,
    WordpieceVocab,
    build_bert_sample,
    build_minilm_sample,
    build_pipeline,
    build_roberta_sample,
    default_cache_root,
    ensure_sample,
    load_sample,
    render_config,
)

__all__ = [
    "DEFAULT_DATA_DIR",
    "SAMPLE_NAMES",
    "ByteBpeVocab",
    "CuratedSpec",
    "Sentence",
    "WordpieceVocab",
    "build_bert_sample",
    "build_minilm_sample",
    "build_pipeline",
    "build_roberta_sample",
    "default_cache_root",
    "ensure_sample",
    "group_documents",
    "load_documents",
    "load_sample",
    "read_sentences",
    "render_config",
    "to_gold_doc",
]
