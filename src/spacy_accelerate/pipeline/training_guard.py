"""The inference-only guard: training calls on an accelerated pipeline fail with a way out.

A runtime's session (ONNX Runtime, OpenVINO) has no gradients, so ``nlp.update`` would either
fail deep inside thinc or, worse, train the heads against a frozen stand-in
while the saved PyTorch weights drift apart from what runs. The guard
replaces the pipeline's training entry points on this one ``nlp`` object
(instance attributes shadow the class's methods) until ``restore()``.

It refuses only while a transformer of the pipeline actually runs accelerated:
a pipeline that ended up on PyTorch by another way (unpickled where its cache
entry was gone, with ``missing_cache="pytorch"``) trains as a plain one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spacy.language import Language

from spacy_accelerate.errors import InferenceOnlyError
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.patch import is_patched
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.serving.proxy import RESTORE_HINT

#: ``Language`` methods that train or re-initialise the pipeline.
TRAINING_METHODS = ("update", "initialize", "begin_training", "resume_training", "rehearse")


def runs_accelerated(nlp: Language) -> bool:
    """Whether any transformer of ``nlp`` runs accelerated now."""
    return any(is_patched(find_shim(component)) for component in transformer_components(nlp))


@dataclass(frozen=True)
class TrainingGuard:
    """Stands in for one training method; a plain class, so the pipeline stays picklable."""

    method: str
    nlp: Language = field(repr=False, compare=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not runs_accelerated(self.nlp):
            return getattr(type(self.nlp), self.method)(self.nlp, *args, **kwargs)
        raise InferenceOnlyError(
            f"nlp.{self.method}() cannot run on a pipeline whose transformer is accelerated by "
            f"spacy-accelerate (inference-only). {RESTORE_HINT}"
        )


def install_training_guards(nlp: Language) -> None:
    for method in TRAINING_METHODS:
        setattr(nlp, method, TrainingGuard(method, nlp))


def remove_training_guards(nlp: Language) -> None:
    for method in TRAINING_METHODS:
        if isinstance(nlp.__dict__.get(method), TrainingGuard):
            del nlp.__dict__[method]
