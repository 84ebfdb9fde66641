"""Step 1: find the transformer components of a pipeline.

A component is recognised by its class (and, for the packages that are not
installed, by the factory that made it), never by its name: pipelines call
their transformer anything, and may have several.
"""

from __future__ import annotations

from dataclasses import dataclass

from spacy.language import Language
from spacy_curated_transformers.pipeline.transformer import (
    CuratedTransformer as CuratedTransformerPipe,
)

from .errors import NoTransformerError, UnsupportedArchitectureError

#: Factories whose components hold a PyTorch transformer.
CURATED_FACTORY = "curated_transformer"
SPACY_TRANSFORMERS_FACTORY = "transformer"


@dataclass(frozen=True)
class TransformerComponent:
    """A transformer component of a pipeline, by name."""

    name: str
    pipe: CuratedTransformerPipe


def transformer_components(nlp: Language) -> list[TransformerComponent]:
    """The curated transformer components of ``nlp``, disabled ones included.

    Disabled components are included because ``nlp.enable_pipe`` may switch
    them on later, and they must not then run the slow (or a stale) model.
    """
    return [
        TransformerComponent(name=name, pipe=pipe)
        for name, pipe in nlp.components
        if isinstance(pipe, CuratedTransformerPipe)
    ]


def find_transformer_components(nlp: Language) -> list[TransformerComponent]:
    """Every transformer component of ``nlp``, or an error saying why there is none to use."""
    for name in nlp.component_names:
        if nlp.get_pipe_meta(name).factory == SPACY_TRANSFORMERS_FACTORY:
            raise UnsupportedArchitectureError(
                f"Component {name!r} comes from spacy-transformers (factory "
                f"{SPACY_TRANSFORMERS_FACTORY!r}), which this release does not accelerate yet. "
                f"Supported: components made by the {CURATED_FACTORY!r} factory of "
                "spacy-curated-transformers (as in en_core_web_trf 3.7 and later)."
            )
    found = transformer_components(nlp)
    if not found:
        names = ", ".join(f"{n!r} ({nlp.get_pipe_meta(n).factory})" for n in nlp.component_names)
        raise NoTransformerError(
            "The pipeline has no transformer component to accelerate. Components found: "
            f"{names or 'none'}. spacy-accelerate needs a component made by the "
            f"{CURATED_FACTORY!r} factory (spacy-curated-transformers)."
        )
    return found
