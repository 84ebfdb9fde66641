"""The inference-only guard: training calls on an accelerated pipeline fail with a way out.

An ONNX Runtime session has no gradients, so ``nlp.update`` would either
fail deep inside thinc or, worse, train the heads against a frozen stand-in
while the saved PyTorch weights drift apart from what runs. The guard
replaces the pipeline's training entry points on this one ``nlp`` object
(instance attributes shadow the class's methods) until ``restore()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from spacy.language import Language

from .errors import InferenceOnlyError
from .proxy import RESTORE_HINT

#: ``Language`` methods that train or re-initialise the pipeline.
TRAINING_METHODS = ("update", "initialize", "begin_training", "resume_training", "rehearse")


@dataclass(frozen=True)
class TrainingGuard:
    """Stands in for one training method; a plain class, so the pipeline stays picklable."""

    method: str

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise InferenceOnlyError(
            f"nlp.{self.method}() cannot run on a pipeline whose transformer is accelerated by "
            f"spacy-accelerate (inference-only). {RESTORE_HINT}"
        )


def install_training_guards(nlp: Language) -> None:
    for method in TRAINING_METHODS:
        setattr(nlp, method, TrainingGuard(method))


def remove_training_guards(nlp: Language) -> None:
    for method in TRAINING_METHODS:
        if isinstance(nlp.__dict__.get(method), TrainingGuard):
            del nlp.__dict__[method]
