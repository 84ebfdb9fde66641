"""The tagger, parser and NER heads every sample puts behind its transformer listeners.

The heads are initialised on EWT labels but never trained (see
:func:`~spacy_accelerate_samples.curated.build_curated_pipeline`), so two things are needed to
make their output depend on the encoder: random tagger output weights and, for scalar-weighting
listeners, non-uniform layer weights.  Both live here, next to the heads' config.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import numpy
import torch
from spacy.language import Language
from spacy.tokens import Doc
from spacy.training import Example

from spacy_accelerate_samples.config_text import section

HeadName = Literal["tagger", "parser", "ner"]
HEADS: tuple[HeadName, ...] = ("tagger", "parser", "ner")
MEAN_POOLING = {"@layers": "reduce_mean.v1"}


def tok2vec_section_name(head: str) -> str:
    return f"components.{head}.model.tok2vec"


def head_sections(
    head: HeadName,
    listener: Sequence[str],
    *,
    hidden_width: int = 64,
    maxout_pieces: int = 2,
) -> list[str]:
    """Config of one head; ``listener`` renders ``components.<head>.model.tok2vec``.

    ``hidden_width`` and ``maxout_pieces`` only shape the transition-based parser and NER.
    """
    if head == "tagger":
        model = {"@architectures": "spacy.Tagger.v2", "nO": None, "normalize": False}
    else:
        model = {
            "@architectures": "spacy.TransitionBasedParser.v2",
            "state_type": head,
            "extra_state_tokens": False,
            "hidden_width": hidden_width,
            "maxout_pieces": maxout_pieces,
            "use_upper": False,
            "nO": None,
        }
    return [
        section(f"components.{head}", {"factory": head}),
        section(f"components.{head}.model", model),
        *listener,
    ]


def gold_examples(nlp: Language, train_docs: Iterable[Doc]) -> list[Example]:
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


def randomize_tagger_output(nlp: Language, seed: int, tagger: str = "tagger") -> None:
    """Give the tagger's zero-initialised softmax random weights.

    Untrained, every tag score would be equal and the tagger would emit its first label
    whatever the encoder says, so a tagging comparison between runtimes would pass vacuously.
    Random weights make each tag depend on the transformer output.  (The parser and NER
    layers are already randomly initialised.)
    """
    output_layer = nlp.get_pipe(tagger).model.get_ref("output_layer")
    n_out, n_in = output_layer.get_dim("nO"), output_layer.get_dim("nI")
    weights = numpy.random.default_rng(seed).normal(0.0, n_in**-0.5, size=(n_out, n_in))
    output_layer.set_param("W", output_layer.ops.asarray2f(weights.astype("float32")))


def scalar_weight_modules(nlp: Language) -> dict[str, torch.nn.Module]:
    """The curated ``ScalarWeight`` torch modules of ``nlp``'s listeners, by head name."""
    modules = {}
    for name, pipe in nlp.pipeline:
        model = getattr(pipe, "model", None)
        if model is None:
            continue
        for node in model.walk():
            if node.name == "scalar_weighting_listener":
                modules[name] = node.layers[0].shims[0]._model
    return modules


def randomize_scalar_weights(nlp: Language, seed: int) -> None:
    """Replace the zero (uniform after softmax) layer weights of every scalar-weighting listener.

    Uniform weights would make a listener's input the plain mean of the layers, so a runtime
    that swapped or dropped a layer could still match; distinct weights make every layer count.
    """
    rng = numpy.random.default_rng(seed)
    for module in scalar_weight_modules(nlp).values():
        weights = module.layer_weights
        values = rng.normal(0.0, 1.0, size=tuple(weights.shape)).astype("float32")
        with torch.no_grad():
            weights.copy_(torch.from_numpy(values))
