"""Config text of ``curated_transformer`` pipelines: encoder specs, transformers and listeners.

A pipeline is one or more :class:`TransformerComponent` objects, each a curated transformer
plus the heads that listen to it.  Keeping the layout declarative lets the samples cover the
shapes real pipelines take (one shared encoder, scalar-weighted layers, two encoders) without a
builder per shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from spacy_accelerate_samples.albert_architecture import ALBERT_ARCHITECTURE
from spacy_accelerate_samples.config_text import section
from spacy_accelerate_samples.heads import (
    HEADS,
    MEAN_POOLING,
    HeadName,
    head_sections,
    tok2vec_section_name,
)
from spacy_accelerate_samples.piece_vocabs import ByteBpeVocab, WordpieceVocab
from spacy_accelerate_samples.sentencepiece_vocab import (
    FairseqSentencepieceVocab,
    SentencepieceVocab,
)

Family = Literal["roberta", "bert", "xlmr", "camembert", "albert"]

PieceVocab = ByteBpeVocab | WordpieceVocab | SentencepieceVocab | FairseqSentencepieceVocab

_CURATED = "spacy-curated-transformers"
#: Model architecture and piece encoder of each family.
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "roberta": (f"{_CURATED}.RobertaTransformer.v1", f"{_CURATED}.ByteBpeEncoder.v1"),
    "bert": (f"{_CURATED}.BertTransformer.v1", f"{_CURATED}.BertWordpieceEncoder.v1"),
    "xlmr": (f"{_CURATED}.XlmrTransformer.v1", f"{_CURATED}.XlmrSentencepieceEncoder.v1"),
    "camembert": (
        f"{_CURATED}.CamembertTransformer.v1",
        f"{_CURATED}.CamembertSentencepieceEncoder.v1",
    ),
    "albert": (f"{_CURATED}.AlbertTransformer.v1", f"{_CURATED}.SentencepieceEncoder.v1"),
}
LAST_LAYER_LISTENER = f"{_CURATED}.LastTransformerLayerListener.v1"
SCALAR_WEIGHTING_LISTENER = f"{_CURATED}.ScalarWeightingListener.v1"


@dataclass(frozen=True)
class CuratedSpec:
    """Encoder hyper-parameters plus the few head/span settings that shape the pipeline.

    ``embedding_width``, ``num_hidden_groups`` and ``inner_group_num`` are ALBERT's: the width
    of the factorised embeddings (``None``: the hidden width), how many parameter-sharing
    layer groups there are and how many distinct layers each group holds.
    """

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
    embedding_width: int | None = None
    num_hidden_groups: int = 1
    inner_group_num: int = 1

    def __post_init__(self) -> None:
        if self.family not in ARCHITECTURES:
            raise ValueError(f"Unknown encoder family {self.family!r}")
        if self.hidden_width % self.num_attention_heads:
            raise ValueError("hidden_width must be divisible by num_attention_heads")
        if not self.window // 2 <= self.stride <= self.window:
            raise ValueError("stride must lie in [window // 2, window] (WithStridedSpans.v1)")
        if self.window > self.model_max_length:
            raise ValueError("window must not exceed model_max_length")
        albert_only = (self.embedding_width, self.num_hidden_groups, self.inner_group_num)
        if self.family != "albert" and albert_only != (None, 1, 1):
            raise ValueError("embedding_width and layer groups are ALBERT-only settings")
        if self.num_hidden_layers % self.num_hidden_groups:
            raise ValueError("num_hidden_layers must be divisible by num_hidden_groups")

    def model_architecture(self) -> str:
        """Upstream architecture, except ALBERT with inner groups (see albert_architecture)."""
        if self.family == "albert" and self.inner_group_num > 1:
            return ALBERT_ARCHITECTURE
        return ARCHITECTURES[self.family][0]


@dataclass(frozen=True)
class TransformerComponent:
    """One ``curated_transformer`` component and the heads listening to it.

    Heads in ``scalar_heads`` listen through ``ScalarWeightingListener.v1`` (a learned mix of
    the embedding output and every layer), the others to the last layer; any scalar head makes
    the component return all layer outputs.
    """

    spec: CuratedSpec
    piece_vocab: PieceVocab
    name: str = "transformer"
    heads: tuple[HeadName, ...] = HEADS
    scalar_heads: tuple[HeadName, ...] = ()

    def __post_init__(self) -> None:
        if not set(self.scalar_heads) <= set(self.heads):
            raise ValueError("scalar_heads must be a subset of heads")
        if not isinstance(self.piece_vocab, _VOCAB_TYPES[self.spec.family]):
            expected = _VOCAB_TYPES[self.spec.family].__name__
            raise TypeError(f"{self.spec.family} encoders need a {expected}")
        if isinstance(self.piece_vocab, FairseqSentencepieceVocab) and (
            self.piece_vocab.layout != self.spec.family
        ):
            raise TypeError(f"{self.spec.family} encoders need a {self.spec.family} vocabulary")

    @property
    def all_layer_outputs(self) -> bool:
        return bool(self.scalar_heads)


_VOCAB_TYPES: dict[str, type] = {
    "roberta": ByteBpeVocab,
    "bert": WordpieceVocab,
    "xlmr": FairseqSentencepieceVocab,
    "camembert": FairseqSentencepieceVocab,
    "albert": SentencepieceVocab,
}


def _model_values(spec: CuratedSpec, vocab_size: int) -> dict[str, object]:
    values: dict[str, object] = {
        "@architectures": spec.model_architecture(),
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
    if spec.family == "albert":
        values["embedding_width"] = spec.embedding_width or spec.hidden_width
        values["num_hidden_groups"] = spec.num_hidden_groups
        if spec.inner_group_num > 1:
            values["inner_group_num"] = spec.inner_group_num
    return values


def transformer_sections(component: TransformerComponent) -> list[str]:
    spec, name = component.spec, component.name
    spans = {
        "@architectures": "spacy-curated-transformers.WithStridedSpans.v1",
        "window": spec.window,
        "stride": spec.stride,
    }
    settings = {
        "factory": "curated_transformer",
        "all_layer_outputs": component.all_layer_outputs,
        "frozen": False,
    }
    encoder = {"@architectures": ARCHITECTURES[spec.family][1]}
    return [
        section(f"components.{name}", settings),
        section(f"components.{name}.model", _model_values(spec, component.piece_vocab.size())),
        section(f"components.{name}.model.piece_encoder", encoder),
        section(f"components.{name}.model.with_spans", spans),
    ]


def listener_sections(component: TransformerComponent, head: HeadName) -> list[str]:
    """The head's ``tok2vec``: a listener bound to ``component`` by name."""
    spec = component.spec
    scalar = head in component.scalar_heads
    listener = {
        "@architectures": SCALAR_WEIGHTING_LISTENER if scalar else LAST_LAYER_LISTENER,
        "width": spec.hidden_width,
        "pooling": MEAN_POOLING,
        "upstream": component.name,
        "grad_factor": 1.0,
    }
    sections = [section(tok2vec_section_name(head), listener)]
    if scalar:
        weighting = {
            "@architectures": "spacy-curated-transformers.ScalarWeight.v1",
            "num_layers": spec.num_hidden_layers,
            "dropout_prob": 0.1,
        }
        sections.append(section(f"{tok2vec_section_name(head)}.weighting", weighting))
    return sections


def _component_sections(component: TransformerComponent) -> list[str]:
    spec = component.spec
    sections = transformer_sections(component)
    for head in component.heads:
        hidden = spec.parser_hidden_width if head == "parser" else spec.ner_hidden_width
        sections += head_sections(
            head,
            listener_sections(component, head),
            hidden_width=hidden,
            maxout_pieces=spec.maxout_pieces,
        )
    return sections


def render_pipeline_config(components: Sequence[TransformerComponent]) -> str:
    """Config text for transformers each followed by their heads.

    The training seed is the first component's; a pipeline is initialised in one go, so the
    later components' seeds are not used.
    """
    if not components:
        raise ValueError("a pipeline needs at least one transformer component")
    names = [c.name for c in components]
    heads = [h for c in components for h in c.heads]
    if len(set(names + heads)) != len(names) + len(heads):
        raise ValueError(f"component names must be unique: {names + heads}")
    pipeline = [name for c in components for name in (c.name, *c.heads)]
    sections = [section("nlp", {"lang": "en", "pipeline": pipeline}), "[components]"]
    for component in components:
        sections += _component_sections(component)
    sections += [
        section("training", {"seed": components[0].spec.seed}),
        "[initialize]",
        "[initialize.components]",
    ]
    for component in components:
        sections.append(f"[initialize.components.{component.name}]")
        sections.append(component.piece_vocab.loader_section(component.name))
    return "\n\n".join(sections) + "\n"


def render_config(spec: CuratedSpec, piece_vocab: PieceVocab) -> str:
    """The full spaCy config text for ``spec``; kept as text so it can be read and diffed."""
    return render_pipeline_config([TransformerComponent(spec, piece_vocab)])
