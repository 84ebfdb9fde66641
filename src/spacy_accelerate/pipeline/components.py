"""Step 1: find the transformer components of a pipeline.

A component is recognised by its class, never by its name: pipelines call
their transformer anything, and may have several. spacy-transformers is
optional; without it, no pipeline can hold its components anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import singledispatch
from typing import Any

from spacy.language import Language
from spacy.pipeline import TrainablePipe
from spacy_curated_transformers.pipeline.transformer import (
    CuratedTransformer as CuratedTransformerPipe,
)

from spacy_accelerate.errors import NoTransformerError

try:
    from spacy_transformers.pipeline_component import Transformer as HFTransformerPipe
except ImportError:  # pragma: no cover - spacy-transformers is an optional extra
    HFTransformerPipe = None  # type: ignore[misc,assignment]

#: Factories whose components hold a PyTorch transformer.
CURATED_FACTORY = "curated_transformer"
SPACY_TRANSFORMERS_FACTORY = "transformer"

#: The component classes that hold a PyTorch transformer.
TRANSFORMER_PIPES: tuple[type[TrainablePipe], ...] = tuple(
    pipe for pipe in (CuratedTransformerPipe, HFTransformerPipe) if pipe is not None
)


@dataclass(frozen=True)
class TransformerComponent:
    """A transformer component of a pipeline, by name."""

    name: str
    pipe: TrainablePipe


def transformer_components(nlp: Language) -> list[TransformerComponent]:
    """The transformer components of ``nlp``, disabled ones included.

    Disabled components are included because ``nlp.enable_pipe`` may switch
    them on later, and they must not then run the slow (or a stale) model.
    """
    return [
        TransformerComponent(name=name, pipe=pipe)
        for name, pipe in nlp.components
        if isinstance(pipe, TRANSFORMER_PIPES)
    ]


def find_transformer_components(nlp: Language) -> list[TransformerComponent]:
    """Every transformer component of ``nlp``, or an error saying why there is none to use."""
    found = transformer_components(nlp)
    if not found:
        names = ", ".join(f"{n!r} ({nlp.get_pipe_meta(n).factory})" for n in nlp.component_names)
        raise NoTransformerError(
            "The pipeline has no transformer component to accelerate. Components found: "
            f"{names or 'none'}. spacy-accelerate needs a component made by the "
            f"{CURATED_FACTORY!r} factory (spacy-curated-transformers) or the "
            f"{SPACY_TRANSFORMERS_FACTORY!r} factory (spacy-transformers)."
        )
    return found


@singledispatch
def declared_special_ids(pipe: TrainablePipe) -> tuple[int, ...]:
    """The special ids a component's tokenizer declares (none for curated piece encoders,
    whose markers reach the check through :func:`record_probe`)."""
    return ()


if HFTransformerPipe is not None:

    @declared_special_ids.register
    def _(pipe: HFTransformerPipe) -> tuple[int, ...]:
        model: Any = pipe.model  # spacy-transformers sets .tokenizer on it; thinc types it not
        tokenizer = model.tokenizer
        return tuple(int(i) for i in tokenizer.all_special_ids)
