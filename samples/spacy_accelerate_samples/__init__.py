"""Real text and offline-built pipelines for tests, demos and benchmarks.

Importing this package also registers the sample-only ALBERT architecture (see
:mod:`.albert_architecture`) that the "albert" sample's config names.
"""

from spacy_accelerate_samples.curated import (
    build_albert_sample,
    build_camembert_sample,
    build_curated_pipeline,
    build_roberta_scalar_sample,
    build_roberta_two_sample,
    build_xlmr_sample,
    curated_torch_module,
)
from spacy_accelerate_samples.curated_config import TransformerComponent, render_pipeline_config
from spacy_accelerate_samples.ewt import (
    DEFAULT_DATA_DIR,
    Sentence,
    group_documents,
    load_documents,
    read_sentences,
    to_gold_doc,
)
from spacy_accelerate_samples.heads import scalar_weight_modules
from spacy_accelerate_samples.hf_models import HfSpec, write_tiny_hf_model
from spacy_accelerate_samples.pipelines import (
    CURATED_SAMPLE_NAMES,
    SAMPLE_NAMES,
    SPACY_TRANSFORMERS_SAMPLE_NAMES,
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
from spacy_accelerate_samples.sentencepiece_vocab import (
    FairseqSentencepieceVocab,
    SentencepieceVocab,
    train_albert_vocab,
    train_fairseq_vocab,
    train_sentencepiece_model,
    write_fairseq_tokenizer,
)
from spacy_accelerate_samples.spacy_transformers_pipelines import (
    SPACY_TRANSFORMERS_SPECS,
    SpacyTransformersSpec,
    build_spacy_transformers_pipeline,
    build_spacy_transformers_sample,
    hf_model_dir,
    set_hf_transformer_config,
)

__all__ = [
    "CURATED_SAMPLE_NAMES",
    "DEFAULT_DATA_DIR",
    "SAMPLE_NAMES",
    "SPACY_TRANSFORMERS_SAMPLE_NAMES",
    "SPACY_TRANSFORMERS_SPECS",
    "ByteBpeVocab",
    "CuratedSpec",
    "FairseqSentencepieceVocab",
    "HfSpec",
    "Sentence",
    "SentencepieceVocab",
    "SpacyTransformersSpec",
    "TransformerComponent",
    "WordpieceVocab",
    "build_albert_sample",
    "build_bert_sample",
    "build_camembert_sample",
    "build_curated_pipeline",
    "build_minilm_sample",
    "build_pipeline",
    "build_roberta_sample",
    "build_roberta_scalar_sample",
    "build_roberta_two_sample",
    "build_spacy_transformers_pipeline",
    "build_spacy_transformers_sample",
    "build_xlmr_sample",
    "curated_torch_module",
    "default_cache_root",
    "ensure_sample",
    "group_documents",
    "hf_model_dir",
    "load_documents",
    "load_sample",
    "read_sentences",
    "render_config",
    "render_pipeline_config",
    "scalar_weight_modules",
    "set_hf_transformer_config",
    "to_gold_doc",
    "train_albert_vocab",
    "train_fairseq_vocab",
    "train_sentencepiece_model",
    "write_fairseq_tokenizer",
    "write_tiny_hf_model",
]
