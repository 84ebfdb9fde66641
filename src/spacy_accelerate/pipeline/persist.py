"""Persistence: an optimized pipeline saved with ``to_disk`` comes back optimized.

``optimize()`` records itself in ``nlp.config`` as the pipeline's
``after_pipeline_creation`` callback (``spacy_accelerate.optimize.v2``, registered
in spaCy's registry by :mod:`spacy_accelerate.api` and found through an entry point), keeping
any callback that was there before as ``previous``. spaCy calls it right after
building the components, before their weights are loaded, so the callback
only arms a hook on ``from_disk``/``from_bytes``: once the weights are in, the
hook serves the models saved with the pipeline (its bundle, written by ``to_disk``
unless ``optimize(bundle=False)``: :mod:`spacy_accelerate.provision.bundle`) or runs
``optimize()`` with the recorded options, which finds its model in the cache. Besides
the bundle's verified model files and JSON, nothing is written: no sessions, no pickles,
and of calibration texts only their sha256 and count.

The saved pipeline is portable: the cache folder is resolved where it loads
(:mod:`~spacy_accelerate.cache.location`: an override given at load, then
``SPACY_ACCELERATE_CACHE``, then the recorded folder if it still works there, then the
default). Loading with ``config={"nlp": {"after_pipeline_creation": {"enabled": False}}}`` keeps a
saved pipeline on PyTorch, and the recorded options can be overridden the same way.

A load that fails never leaves a half-accelerated pipeline: it is accelerated again
with the weights it holds, or, where that fails too, left as :func:`restore` leaves it
(PyTorch, trainable, a plain config).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spacy.language import Language

from spacy_accelerate.options.request import OptimizeRequest
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.patch import unpatch
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.pipeline.training_guard import remove_training_guards
from spacy_accelerate.pipeline.workers import install_pipe, remove_pipe

logger = logging.getLogger("spacy_accelerate")

CALLBACK_NAME = "spacy_accelerate.optimize.v2"
#: The first version's name: pipelines saved with it still load.
CALLBACK_NAME_V1 = "spacy_accelerate.optimize.v1"
CALLBACK_KEY = "after_pipeline_creation"
LOAD_METHODS = ("from_disk", "from_bytes")
SAVE_METHOD = "to_disk"

#: Accelerates a loaded pipeline as recorded, from the folder it was loaded from (None:
#: from bytes) (``spacy_accelerate.api``'s; given to the hooks rather than imported,
#: since the API is built on this module).
Reapply = Callable[[Language, OptimizeRequest, Path | None], None]
#: Completes a save into the folder a pipeline was just saved to: its requirements, and
#: the served models with the request that chose them (or, with ``bundle=False``, no
#: bundle: one left there by an earlier save would serve models this pipeline no longer
#: runs, so it goes).
Saver = Callable[[Language, OptimizeRequest, Path], None]


def unpatch_all(nlp: Language) -> None:
    """Put every PyTorch transformer back, keeping the record of the acceleration."""
    for component in transformer_components(nlp):
        unpatch(find_shim(component))


def restore(nlp: Language) -> Language:
    """Undo ``optimize()``: the PyTorch transformers, training and a plain saved config
    come back. A no-op on a plain pipeline. The guard that makes swaps safe while other
    threads annotate stays on the transformer's layer (it changes no result), so a
    restored pipeline needs spacy-accelerate installed to be unpickled."""
    unpatch_all(nlp)
    remove_training_guards(nlp)
    remove_load_hooks(nlp)
    forget(nlp)
    return nlp


@dataclass(frozen=True)
class ReoptimizeAfterLoading:
    """Stands in for ``nlp.from_disk`` / ``nlp.from_bytes`` on an accelerated pipeline.

    The PyTorch modules are put back before the weights load (a proxy refuses
    new weights), and the pipeline is optimized again with the new weights. When the
    load or that optimization fails, the pipeline is optimized again with whatever
    weights it holds, or, failing that too, restored to plain PyTorch; the error is
    raised either way.
    """

    nlp: Language
    method: str
    request: OptimizeRequest
    reapply: Reapply

    def __call__(self, *args: Any, **kwargs: Any) -> Language:
        unpatch_all(self.nlp)
        try:
            loaded = getattr(type(self.nlp), self.method)(self.nlp, *args, **kwargs)
        except BaseException:
            self._settle()
            raise
        folder = Path(args[0]) if self.method == "from_disk" and args else None
        try:
            self.reapply(self.nlp, self.request, folder)
        except BaseException:
            restore(self.nlp)
            raise
        return loaded

    def _settle(self) -> None:
        """After a failed load: accelerated again as recorded, or plain."""
        try:
            self.reapply(self.nlp, self.request, None)
        except Exception as error:
            restore(self.nlp)
            logger.warning(
                "spacy-accelerate: after the failed nlp.%s() the pipeline could not be "
                "accelerated again (%s); it runs on PyTorch, as restore() leaves it.",
                self.method,
                error,
            )


@dataclass(frozen=True)
class SaveServed:
    """Stands in for ``nlp.to_disk`` on an accelerated pipeline: spaCy's files, then what
    the :data:`Saver` adds beside them."""

    nlp: Language
    request: OptimizeRequest
    saver: Saver

    def __call__(self, path: str | Path, *args: Any, **kwargs: Any) -> None:
        type(self.nlp).to_disk(self.nlp, path, *args, **kwargs)
        self.saver(self.nlp, self.request, Path(path))


def install_load_hooks(
    nlp: Language, request: OptimizeRequest, reapply: Reapply, saver: Saver
) -> None:
    """Stand in for ``nlp``'s load and save methods, and for ``pipe``
    (:class:`~spacy_accelerate.pipeline.workers.PipeInWorkers`)."""
    for method in LOAD_METHODS:
        setattr(nlp, method, ReoptimizeAfterLoading(nlp, method, request, reapply))
    setattr(nlp, SAVE_METHOD, SaveServed(nlp, request, saver))
    install_pipe(nlp)


def remove_load_hooks(nlp: Language) -> None:
    for method in (*LOAD_METHODS, SAVE_METHOD):
        if isinstance(nlp.__dict__.get(method), ReoptimizeAfterLoading | SaveServed):
            del nlp.__dict__[method]
    remove_pipe(nlp)


def _is_ours(section: Any) -> bool:
    return isinstance(section, dict) and section.get("@callbacks") in (
        CALLBACK_NAME,
        CALLBACK_NAME_V1,
    )


def record(nlp: Language, request: OptimizeRequest) -> None:
    """Write ``request`` into ``nlp.config`` as the after-creation callback."""
    section = nlp.config["nlp"].get(CALLBACK_KEY)
    previous = section.get("previous") if _is_ours(section) else section
    nlp.config["nlp"][CALLBACK_KEY] = {
        "@callbacks": CALLBACK_NAME,
        "enabled": True,
        **request.saved(),
        "previous": previous,
    }


def forget(nlp: Language) -> None:
    """Remove the record, putting back whatever callback was there before."""
    section = nlp.config["nlp"].get(CALLBACK_KEY)
    if _is_ours(section):
        nlp.config["nlp"][CALLBACK_KEY] = section.get("previous")


@dataclass(frozen=True)
class AfterCreation:
    """Runs the previous callback, then arms the load hooks (or does nothing if disabled)."""

    request: OptimizeRequest
    enabled: bool
    previous: Callable[[Language], Language] | None
    reapply: Reapply
    saver: Saver

    def __call__(self, nlp: Language) -> Language:
        if self.previous is not None:
            nlp = self.previous(nlp)
        if self.enabled:
            install_load_hooks(nlp, self.request, self.reapply, self.saver)
        return nlp
