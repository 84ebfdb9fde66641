"""A pickled proxy, and how it comes back: its verified cache entry reopened.

Sessions are never pickled, and neither are calibration texts (their digest finds the
entry). Pickled for the workers of ``nlp.pipe(n_process=N)``, a proxy carries their share
of threads. Parked weights are read back only to be serialised, and parked again at once
(:meth:`.ParkedWeights.pickled`): the module goes in the pickle as it is held, shapes only,
and the copy parks them too (:func:`.park_unpickled`), read back only where needed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import torch

from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.cache.root import resolve_cache_dir
from spacy_accelerate.cpu_budget import BUDGET, worker_torch_threads
from spacy_accelerate.errors import Advice, spelled
from spacy_accelerate.options.config import MissingCache, OptimizeConfig
from spacy_accelerate.provision.get_or_export import ExportedModel, reopen
from spacy_accelerate.runtime.providers import ResolvedProvider
from spacy_accelerate.runtime.session import Session, SessionLayout
from spacy_accelerate.serving.original_module import OriginalModule
from spacy_accelerate.serving.parked_weights import PickledWeights, park_unpickled
from spacy_accelerate.serving.served_model import ServedModel, worker_config
from spacy_accelerate.serving.weight_sources import return_freed_memory

logger = logging.getLogger("spacy_accelerate")


class Proxy(Protocol):
    """What pickling reads of a proxy."""

    spec: EncoderSpec
    served: ServedModel
    original: OriginalModule

    def rebuild_args(self) -> tuple[Any, ...]: ...


class ProxyType(Protocol):
    """How an unpickled proxy is made: ``(session, spec, original, exported, *extra)``."""

    def __call__(
        self,
        session: Session,
        spec: EncoderSpec,
        original: torch.nn.Module,
        exported: ExportedModel | None,
        *extra: Any,
    ) -> Any: ...


@dataclass(frozen=True)
class Made:
    """How an unpickled proxy is made: its type, the original module (as held), the spec,
    and the arguments after them (the proxy's ``rebuild_args``)."""

    proxy_type: ProxyType
    original: torch.nn.Module
    spec: EncoderSpec
    extra: tuple[Any, ...]


@dataclass(frozen=True)
class Served:
    """What served it: the cache entry, the provider, the config and the session's layout."""

    exported: ExportedModel
    provider: ResolvedProvider
    config: OptimizeConfig
    layout: SessionLayout


def reduce(proxy: Proxy) -> tuple[Any, ...]:
    """``__reduce__`` of ``proxy`` (see the module's docstring)."""
    session = proxy.served.session
    config = replace(worker_config(session.config), calibration_texts=None)
    served = Served(proxy.served.exported, session.provider, config, session.layout)
    proxy_type = cast(ProxyType, type(proxy))  # a proxy class: its constructor
    made = Made(proxy_type, proxy.original.shell, proxy.spec, proxy.rebuild_args())
    weights = proxy.original.pickled()
    return (unpickled, (made, served, BUDGET.workers > 1, weights))


def unpickled(
    made: Made,
    served: Served,
    in_worker: bool = False,
    weights: PickledWeights | None = None,
) -> torch.nn.Module:
    """An unpickled proxy: its cache entry reopened, or built again where it is gone; or,
    where ``missing_cache="pytorch"`` (or a lossy plan, which needs the whole pipeline to
    be judged), the PyTorch module itself, with a warning. ``in_worker``: pickled for a
    worker of ``nlp.pipe(n_process=N)``, whose torch then runs on the threads ``config``
    gives the runtime (at most). ``weights``: the state of an original pickled parked."""
    if in_worker:
        worker_torch_threads(served.config.intra_op_threads)
    parking = None
    if weights is not None:
        cache = resolve_cache_dir(served.config.cache_dir)
        parking = park_unpickled(made.original, weights, cache)
    original = OriginalModule(made.original, parking)
    reopened = reopen(
        served.exported, made.spec, original.read, served.provider, served.config, served.layout
    )
    if reopened is None:
        _warn_on_pytorch(served)
        return original.read()
    session, found = reopened
    proxy = made.proxy_type(session, made.spec, made.original, found, *made.extra)
    BUDGET.serve(proxy)  # in the unpickled pipeline's shim
    if parking is not None:
        proxy.original.parking = parking
        parking.park()  # again, where the entry was built from them
        return_freed_memory()
    return proxy  # type: ignore[no-any-return]


def _warn_on_pytorch(served: Served) -> None:
    config = served.config
    logger.warning(
        "spacy-accelerate: the cached %s model %s is not here and %s, so this "
        "pipeline runs on PyTorch. Call spacy_accelerate.optimize(nlp) on it to "
        "accelerate it again.",
        config.precision.value,
        served.exported.key[:12],
        "its lossy plan is judged on the whole pipeline, which an unpickled "
        "transformer does not have"
        if config.calibrated and config.missing_cache is not MissingCache.PYTORCH
        else spelled([Advice("missing_cache", "pytorch"), " says not to export it at load time"]),
    )
