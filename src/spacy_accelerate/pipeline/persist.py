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

The saved pipeline is portable, and a pipeline from someone else does not choose where
this machine writes: the cache folder comes from the caller only, where it loads (an
override given to ``spacy.load``'s ``config``, then ``SPACY_ACCELERATE_CACHE``, then the
default: :func:`callers_request`). A folder named in the saved ``config.cfg`` is ignored,
with one INFO line. Loading with
``config={"nlp": {"after_pipeline_creation": {"enabled": False}}}`` keeps a saved pipeline
on PyTorch, and the recorded options can be overridden the same way.

A load that fails never leaves a half-accelerated pipeline: it is accelerated again
with the weights it holds, or, where that fails too, left as :func:`restore` leaves it
(PyTorch, trainable, a plain config).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spacy.language import Language

from spacy_accelerate.cache.root import resolve_cache_dir
from spacy_accelerate.errors import WeightsUnavailableError
from spacy_accelerate.options.request import OptimizeRequest
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.parking import park_served_weights, read_back_weights
from spacy_accelerate.pipeline.patch import patch, served_transformers, unpatch
from spacy_accelerate.pipeline.pipe import install_pipe, remove_pipe
from spacy_accelerate.pipeline.shim import ShimLocation, find_shim
from spacy_accelerate.pipeline.swap import swap_module

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


@dataclass(frozen=True)
class ApiCalls:
    """What the hooks call back in the API built on this module (given to them rather than
    imported): accelerating a loaded pipeline again, completing a save, and ``restore()``
    (:mod:`.changes`), where a load leaves a pipeline that cannot be accelerated."""

    reapply: Reapply
    saver: Saver
    restore: Callable[[Language], Language]


def unpatch_all(nlp: Language) -> None:
    """Put every PyTorch transformer back, keeping the record of the acceleration."""
    for component in transformer_components(nlp):
        unpatch(find_shim(component))


def weights_folder(nlp: Language, folder: Path | None, kwargs: Mapping[str, Any]) -> Path | None:
    """``folder`` where ``from_disk``/``to_disk`` (called with ``kwargs``) read or wrote the
    transformers' weights there: not where ``exclude`` left a transformer out, whose file
    there holds other weights than the pipeline's."""
    return None if excludes_a_transformer(nlp, kwargs) else folder


def excludes_a_transformer(nlp: Language, kwargs: Mapping[str, Any]) -> bool:
    """Whether a load or save called with ``kwargs`` leaves a transformer of ``nlp`` out."""
    excluded = set(kwargs.get("exclude", ()))
    return bool(excluded & {component.name for component in transformer_components(nlp)})


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
    calls: ApiCalls
    #: Whether ``request`` was read from a saved config (a file from anywhere) rather than
    #: given to ``optimize()`` in this process: then only the caller chooses its cache.
    from_file: bool = False

    def __call__(self, *args: Any, **kwargs: Any) -> Language:
        unreadable = self._unpatch(kwargs)
        request = self.request
        if self.from_file:
            request = callers_request(request, kwargs.get("overrides"))
        try:
            loaded = getattr(type(self.nlp), self.method)(self.nlp, *args, **kwargs)
        except BaseException:
            if unreadable:  # their old weights are gone: they serve on, as before the call
                for location, proxy in unreadable:
                    patch(location, proxy)
            else:
                self._settle(request)
            raise
        folder = Path(args[0]) if self.method == "from_disk" and args else None
        folder = weights_folder(self.nlp, folder, kwargs)
        try:
            self.calls.reapply(self.nlp, request, folder)
        except BaseException:
            self.calls.restore(self.nlp)
            raise
        return loaded

    def _unpatch(self, kwargs: Mapping[str, Any]) -> list[tuple[ShimLocation, Any]]:
        """Put every PyTorch transformer back before the load. One whose parked weights
        can no longer be read back (their folder rewritten, as by saving another pipeline
        there) but which this load replaces gets uninitialised room for them instead: it
        is returned with its proxy, to be put back should the load fail."""
        replaced = not excludes_a_transformer(self.nlp, kwargs)
        unreadable = []
        for component in transformer_components(self.nlp):
            location = find_shim(component)
            try:
                unpatch(location)
            except WeightsUnavailableError:
                proxy = location.shim._model
                if not replaced or proxy.parking is None:
                    raise
                swap_module(location.layer, proxy.parking.room_for_a_load())
                unreadable.append((location, proxy))
        return unreadable

    def _settle(self, request: OptimizeRequest) -> None:
        """After a failed load: accelerated again as recorded, or plain."""
        try:
            self.calls.reapply(self.nlp, request, None)
        except Exception as error:
            self.calls.restore(self.nlp)
            logger.warning(
                "spacy-accelerate: after the failed nlp.%s() the pipeline could not be "
                "accelerated again (%s); it runs on PyTorch, as restore() leaves it.",
                self.method,
                error,
            )


#: Where ``spacy.load(path, config=...)`` puts the caller's cache folder among the overrides
#: it hands to ``from_disk`` (spaCy's dot notation).
CACHE_DIR_OVERRIDE = f"nlp.{CALLBACK_KEY}.cache_dir"


def callers_request(
    request: OptimizeRequest, overrides: Mapping[str, Any] | None
) -> OptimizeRequest:
    """``request`` (as the loaded config holds it) with the cache folder only the caller
    can give: an override given to ``spacy.load`` (``overrides``, which spaCy hands to
    ``from_disk``), else none (``SPACY_ACCELERATE_CACHE`` or the default). A folder the
    saved config names is input from whoever wrote the file, so it is ignored, said in one
    INFO line: a file from elsewhere does not choose where this machine writes."""
    given = (overrides or {}).get(CACHE_DIR_OVERRIDE)
    section = (overrides or {}).get(f"nlp.{CALLBACK_KEY}")
    if given is None and isinstance(section, Mapping):  # the whole section overridden
        given = section.get("cache_dir")
    caller = str(given) if given is not None else None
    named = {"cache_dir": request.cache_dir, "saved_cache_dir": request.saved_cache_dir}
    ignored = {
        name: value
        for name, value in named.items()
        if value is not None and not (name == "cache_dir" and str(value) == caller)
    }
    if ignored:
        logger.info(
            "spacy-accelerate: the pipeline's config.cfg names a cache folder (%s), which is "
            "ignored: a loaded pipeline does not choose where this machine writes. Its "
            "cache is %s; to choose another, set SPACY_ACCELERATE_CACHE or pass "
            "config={%r: PATH} to spacy.load.",
            ", ".join(f"{name}={value!r}" for name, value in ignored.items()),
            "the one given to spacy.load" if caller else "SPACY_ACCELERATE_CACHE or the default",
            CACHE_DIR_OVERRIDE,
        )
    return replace(request, cache_dir=caller, saved_cache_dir=None)


@dataclass(frozen=True)
class SaveServed:
    """Stands in for ``nlp.to_disk`` on an accelerated pipeline: spaCy's files, then what
    the :data:`Saver` adds beside them."""

    nlp: Language
    request: OptimizeRequest
    saver: Saver

    def __call__(self, path: str | Path, *args: Any, **kwargs: Any) -> None:
        # spaCy truncates each file before it writes it: parked weights are read back
        # first, as they may be read from the very folder being written (the saver parks
        # them again, with it).
        read_back_weights(self.nlp)
        type(self.nlp).to_disk(self.nlp, path, *args, **kwargs)
        self.saver(self.nlp, self.request, Path(path))
        folder = weights_folder(self.nlp, Path(path), kwargs)
        scratch = resolve_cache_dir(self.request.cache_dir)
        park_served_weights(served_transformers(self.nlp), folder, scratch)


def install_load_hooks(
    nlp: Language, request: OptimizeRequest, calls: ApiCalls, *, from_file: bool = False
) -> None:
    """Stand in for ``nlp``'s load and save methods, and for ``pipe``
    (:class:`~spacy_accelerate.pipeline.pipe.AcceleratedPipe`); ``from_file``: as
    :attr:`ReoptimizeAfterLoading.from_file`."""
    for method in LOAD_METHODS:
        hook = ReoptimizeAfterLoading(nlp, method, request, calls, from_file)
        setattr(nlp, method, hook)
    setattr(nlp, SAVE_METHOD, SaveServed(nlp, request, calls.saver))
    install_pipe(nlp, request.overlaps)


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
    """Remove the record, putting back whatever callback was there before (spaCy fills
    the key in every pipeline's config: ``null`` where there is none)."""
    section = nlp.config["nlp"].get(CALLBACK_KEY)
    if _is_ours(section):
        nlp.config["nlp"][CALLBACK_KEY] = section.get("previous")


@dataclass(frozen=True)
class AfterCreation:
    """Runs the previous callback, then arms the load hooks (or does nothing if disabled)."""

    request: OptimizeRequest
    enabled: bool
    previous: Callable[[Language], Language] | None
    calls: ApiCalls

    def __call__(self, nlp: Language) -> Language:
        if self.previous is not None:
            nlp = self.previous(nlp)
        if self.enabled:
            install_load_hooks(nlp, self.request, self.calls, from_file=True)
        return nlp
