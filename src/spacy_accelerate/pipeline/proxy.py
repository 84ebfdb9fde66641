"""Step 7: the torch module that stands in for the PyTorch transformer.

spaCy's thinc wrapper calls the shim's module and reads its output; each
proxy keeps the contract of the module it replaces exactly, so the span
striding, tokenization, unpadding and listeners around it run unchanged:

- :class:`AcceleratedEncoder` for spacy-curated-transformers: padded
  ``input_ids`` in, ``PyTorchTransformerOutput`` out;
- :class:`AcceleratedHFModel` for spacy-transformers: a Hugging Face model's
  keyword inputs in, the same ``ModelOutput`` class with the same fields out
  (``last_hidden_state``, ``pooler_output`` where the model has a pooler,
  ``hidden_states`` where the config asks for them).
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import singledispatch
from typing import Any, ClassVar, cast

import torch
from curated_transformers.models.attention import AttentionMask
from curated_transformers.models.curated_transformer import CuratedTransformer
from curated_transformers.models.output import PyTorchTransformerOutput
from transformers import PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import POOLER_OUTPUT, EncoderSpec
from spacy_accelerate.cache.root import resolve_cache_dir
from spacy_accelerate.cpu_budget import BUDGET, on_fork_in_child, worker_torch_threads
from spacy_accelerate.errors import (
    Advice,
    CacheError,
    InferenceOnlyError,
    UnsupportedArchitectureError,
    spelled,
)
from spacy_accelerate.options.config import MissingCache, OptimizeConfig
from spacy_accelerate.pipeline.parked_weights import (
    ParkedWeights,
    PickledWeights,
    WeightsSource,
    park_unpickled,
    return_freed_memory,
)
from spacy_accelerate.provision.get_or_export import ExportedModel, reopen
from spacy_accelerate.runtime.cancellation import check as check_cancelled
from spacy_accelerate.runtime.providers import ResolvedProvider
from spacy_accelerate.runtime.session import Session, SessionLayout
from spacy_accelerate.runtime.shared_calls import SharedCalls

logger = logging.getLogger("spacy_accelerate")

#: Keyword the patched ``convert_inputs`` adds: whether every layer is read.
ALL_LAYERS_KWARG = "all_layer_outputs"

RESTORE_HINT = (
    "Call spacy_accelerate.restore(nlp) to put the PyTorch transformer back first, "
    "then optimize() again after training."
)


#: Sessions a forked process inherited from its parent. They are never run there (their
#: thread pools' workers stayed in the parent) and never destroyed there either: tearing
#: one down joins thread handles that belong to the parent, which can crash the child
#: (onnxruntime PR #31961). The fork itself ends, with ``os._exit``, without freeing them.
_INHERITED: list[Session] = []
_FORK_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    # A lock a parent's thread held at the fork stays held in the child: start afresh.
    global _FORK_LOCK
    _FORK_LOCK = threading.Lock()


on_fork_in_child(_after_fork_in_child)


def _unrequested() -> torch.Tensor:
    # Stands where a layer that was not computed would be. Any use of it as a
    # (batch, sequence, width) tensor fails loudly instead of reading a copy
    # of another layer.
    return torch.empty(0)


class AcceleratedModule(torch.nn.Module):
    """What both proxies share: the session, the original module, and their lifecycle."""

    _shell: torch.nn.Module
    #: Whether the original's weights may be parked while this serves
    #: (:mod:`~spacy_accelerate.pipeline.parking`).
    parks_weights: ClassVar[bool] = True

    def __init__(
        self,
        session: Session,
        spec: EncoderSpec,
        original: torch.nn.Module,
        exported: ExportedModel | None,
    ) -> None:
        super().__init__()
        self.session = session
        self.spec = spec
        #: The verified model served, or None for a candidate plan (:func:`candidate_proxy`).
        self.provenance = exported
        #: The process whose runtime opened ``session`` (see :meth:`_own_session`).
        self.opened_in = os.getpid()
        BUDGET.serving = True  # forked children run torch on one thread (cpu_budget)
        # Kept outside torch's module registry: the original is not part of
        # this module's parameters, only what restore() puts back.
        object.__setattr__(self, "_shell", original)
        #: Where the original's weights are while they are parked (:meth:`park`).
        self.parking: ParkedWeights | None = None
        #: Concurrent calls, run together while the runtime is busy.
        self.shared_calls = SharedCalls(spec.padding_idx)

    @property
    def original(self) -> torch.nn.Module:
        """The PyTorch module this one stands in for (what ``restore()`` puts back), with
        its weights: read back, and kept, where they were parked."""
        return self.parking.resident() if self.parking is not None else self._shell

    @property
    def shell(self) -> torch.nn.Module:
        """The PyTorch module as it is held: its structure and config, its weights only
        where they are not parked (no reading back)."""
        return self._shell

    def park(self, source: WeightsSource) -> None:
        """Let the original's weights go from memory while ``source`` can give them back
        (:mod:`~spacy_accelerate.pipeline.parked_weights`)."""
        original = self.original  # read back first where parked with another source
        self.parking = ParkedWeights(original, source)
        self.parking.park()

    @property
    def exported(self) -> ExportedModel:
        """The verified model served: its cache entry (what a fork, a thread split or an
        unpickled copy reopens), how it was built and checked. A candidate plan, still
        being judged, has none: it is in no cache entry yet, and it runs only scoped to
        the thread judging it, where nothing reopens or pickles it."""
        if self.provenance is None:
            raise CacheError(
                "A candidate plan being judged is in no cache entry yet: it cannot be "
                "reopened or pickled; please report this."
            )
        return self.provenance

    def _check_inference(self) -> None:
        if self.training and torch.is_grad_enabled():
            raise InferenceOnlyError(
                "This transformer has been accelerated by spacy-accelerate and is inference-only; "
                f"it cannot be trained. {RESTORE_HINT}"
            )

    def served_outputs(self, all_layers: bool) -> tuple[str, ...]:
        """The graph outputs one call reads: every layer or the last one (and the pooled
        output, where the module returns it)."""
        hidden = self.spec.hidden_state_names
        return hidden if all_layers else hidden[-1:]

    def _run(self, feeds: dict[str, torch.Tensor], names: Sequence[str]) -> list[torch.Tensor]:
        """The outputs ``names`` for int64 ``(batch, length)`` feeds, on the feeds' device."""
        ids = feeds["input_ids"]
        if ids.numel() == 0:
            width = self.spec.hidden_width
            return [
                ids.new_zeros(
                    (ids.shape[0], width) if name == POOLER_OUTPUT else (*ids.shape, width),
                    dtype=torch.float32,
                )
                for name in names
            ]
        self.spec.check_length(ids.shape[1])
        check_cancelled()  # an overlapped pipe's helper told to stop (.cancellation)
        # Concurrent callers' calls run together while the runtime is busy (.shared_calls),
        # where each row's outputs are its own whatever the others (not dynamic int8).
        session = self._own_session()
        if session.rows_independent:
            outputs = self.shared_calls.run(session.run_tensors, feeds, names)
        else:
            outputs = session.run_tensors(feeds, names)
        return [tensor.to(ids.device) for tensor in outputs]

    def _own_session(self) -> Session:
        """The session, opened in this process. A forked worker (spaCy's ``n_process``
        on Linux, gunicorn's preload) inherits the parent's session, whose runtime
        threads did not survive the fork; it opens the same verified cache entry once,
        as an unpickled proxy does, on its share of the parent's threads
        (:mod:`spacy_accelerate.cpu_budget`)."""
        if self.opened_in == os.getpid():
            return self.session
        with _FORK_LOCK:
            if self.opened_in != os.getpid():
                _INHERITED.append(self.session)
                self._reopen_with(_worker_config(self.session.config))
                self.opened_in = os.getpid()
        return self.session

    def serve_on(self, threads: int) -> None:
        """Serve from a session of the same verified model on ``threads`` runtime threads
        (the split of the CPUs under overlap, :mod:`.overlap_plan`)."""
        if threads != self.session.config.intra_op_threads:
            self._reopen_with(replace(self.session.config, intra_op_threads=threads))

    def serving(self) -> tuple[Session, ExportedModel | None]:
        """What serves now (to put back with :meth:`serve`)."""
        return self.session, self.provenance

    def serve(self, served: tuple[Session, ExportedModel | None]) -> None:
        """Serve from a session :meth:`serving` returned (of the same model)."""
        self.session, self.provenance = served

    def _reopen_with(self, config: OptimizeConfig) -> None:
        reopened = reopen(
            self.exported,
            self.spec,
            lambda: self.original,
            self.session.provider,
            config,
            self.session.layout,
        )
        if reopened is None:
            raise CacheError(
                f"The cached {config.precision.value} model {self.exported.key[:12]} is no "
                "longer in the cache. Call spacy_accelerate.optimize(nlp) again (before "
                "starting workers), and do not clear the cache while the pipeline runs."
            )
        self.session, self.provenance = reopened

    # thinc serialises the shim's module through these: saving writes the
    # original PyTorch weights (a faithful pipeline); loading new weights into a
    # running session would leave it stale, so that is refused.
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        if self.parking is None:
            return self._shell.state_dict(*args, **kwargs)
        with self.parking.briefly_resident() as original:  # read once, parked again
            return original.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        raise InferenceOnlyError(
            "Cannot load new weights (from_disk, from_bytes or training) into an accelerated "
            f"transformer. {RESTORE_HINT}"
        )

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        # Device and dtype moves (nlp.to_gpu, shim.to_device) reach the original,
        # so that restore() hands back a module where the pipeline expects it.
        self.original._apply(fn)
        return self

    def _rebuild_args(self) -> tuple[Any, ...]:
        """Constructor arguments after ``(session, spec, original, exported)``."""
        return ()

    def __deepcopy__(self, memo: dict[int, Any]) -> AcceleratedModule:
        # The session is immutable and thread-safe: copies share it. Parked weights stay
        # parked in the copy, their source shared.
        parking = self.parking.deep_copy(memo) if self.parking is not None else None
        shell = parking.module if parking is not None else copy.deepcopy(self._shell, memo)
        clone = type(self)(self.session, self.spec, shell, self.provenance, *self._rebuild_args())
        clone.parking = parking
        clone.opened_in = self.opened_in  # a copy made in a fork still holds the parent's
        clone.train(self.training)
        memo[id(self)] = clone
        return clone

    def __reduce__(self) -> tuple[Any, ...]:
        # A pickled proxy reopens its verified cache entry; sessions are never pickled,
        # and neither are calibration texts (their digest finds the entry). Pickled for
        # the workers of ``nlp.pipe(n_process=N)``, it carries their share of threads.
        # Parked weights are read back only to be serialised, and parked again at once
        # (ParkedWeights.pickled): the module goes in the pickle as it is held, shapes only.
        config = replace(_worker_config(self.session.config), calibration_texts=None)
        served = (self.exported, self.session.provider, config, self.session.layout)
        weights = self.parking.pickled() if self.parking is not None else None
        made = (type(self), self._shell, self.spec, self._rebuild_args())
        return (_reopen, (made, served, BUDGET.workers > 1, weights))

    def extra_repr(self) -> str:
        # What serves it, as optimize() logged it (ExportedModel.summary; a model pickled
        # by an earlier release does not record its provider and precision).
        exported = self.provenance
        if exported is None:
            return f"candidate plan being judged, not cached; family={self.spec.family}"
        if exported.provider is None:
            served = self.session.provider.provider.value, self.session.config.precision.value
            exported = replace(exported, provider=served[0], precision=served[1])
        return (
            f"{exported.summary}; family={self.spec.family}, layers={self.spec.num_hidden_layers}"
        )


class AcceleratedEncoder(AcceleratedModule):
    """A ``CuratedTransformer`` look-alike backed by a runtime's session (ONNX Runtime,
    OpenVINO)."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: AttentionMask | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        all_layer_outputs: bool = True,
    ) -> PyTorchTransformerOutput:
        self._check_inference()
        ids = input_ids.detach().long()
        if attention_mask is not None:
            mask = attention_mask.bool_mask.detach().reshape(ids.shape).long()
        else:
            mask = (ids != self.spec.padding_idx).long()
        types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids.detach().long()
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        tensors = self._run(feeds, self.served_outputs(all_layer_outputs))
        if all_layer_outputs:
            return PyTorchTransformerOutput(
                embedding_output=tensors[0], layer_hidden_states=tensors[1:]
            )
        skipped = [_unrequested() for _ in range(self.spec.num_hidden_layers - 1)]
        return PyTorchTransformerOutput(
            embedding_output=_unrequested(), layer_hidden_states=[*skipped, tensors[-1]]
        )


class AcceleratedHFModel(AcceleratedModule):
    """A Hugging Face ``PreTrainedModel`` look-alike backed by a runtime's session (ONNX
    Runtime, OpenVINO)."""

    #: spacy-transformers puts each batch's inputs on the device of the Hugging Face model
    #: it holds itself (``HFObjects.transformer.device``): parked, that would be ``meta``.
    parks_weights: ClassVar[bool] = False

    def __init__(
        self,
        session: Session,
        spec: EncoderSpec,
        original: torch.nn.Module,
        exported: ExportedModel | None,
        output_type: type[ModelOutput],
    ) -> None:
        super().__init__(session, spec, original, exported)
        self.output_type = output_type

    @property
    def config(self) -> PretrainedConfig:
        return self._hf_config()

    def _hf_config(self) -> PretrainedConfig:
        """The Hugging Face model's config (the original is held as a plain torch module)."""
        return cast(PreTrainedModel, self.shell).config

    def _rebuild_args(self) -> tuple[Any, ...]:
        return (self.output_type,)

    def served_outputs(self, all_layers: bool) -> tuple[str, ...]:
        pooled = (POOLER_OUTPUT,) if self.spec.has_pooler else ()
        return (*super().served_outputs(all_layers), *pooled)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
    ) -> ModelOutput | tuple[Any, ...]:
        self._check_inference()
        config = self._hf_config()
        if output_attentions or (output_attentions is None and config.output_attentions):
            raise UnsupportedArchitectureError(
                "The accelerated transformer cannot return attention weights (they are computed "
                "in fused kernels). Call it without output_attentions, or restore() the pipeline."
            )
        ids = input_ids.detach().long()
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask.detach().long()
        types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids.detach().long()
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        all_hidden = (
            config.output_hidden_states
            if output_hidden_states is None
            else bool(output_hidden_states)
        )
        hidden = self.spec.hidden_state_names
        names = self.served_outputs(all_hidden)
        tensors = dict(zip(names, self._run(feeds, names), strict=True))
        fields: dict[str, Any] = {"last_hidden_state": tensors[hidden[-1]]}
        if self.spec.has_pooler:
            fields[POOLER_OUTPUT] = tensors[POOLER_OUTPUT]
        if all_hidden:
            fields["hidden_states"] = tuple(tensors[name] for name in hidden)
        output = self.output_type(**fields)
        use_dict = config.use_return_dict if return_dict is None else return_dict
        return output if use_dict else output.to_tuple()


def _worker_config(config: OptimizeConfig) -> OptimizeConfig:
    """``config`` on this process's share of its threads (all of them outside a
    ``pipe`` call with workers)."""
    return replace(config, intra_op_threads=BUDGET.threads_each(config.intra_op_threads))


#: How an unpickled proxy is made: its type, the original module, the spec, and the
#: arguments after them (:meth:`AcceleratedModule._rebuild_args`).
_Made = tuple[type[AcceleratedModule], torch.nn.Module, EncoderSpec, tuple[Any, ...]]
#: What served it: the cache entry, the provider, the config and the session's layout.
_Served = tuple[ExportedModel, ResolvedProvider, OptimizeConfig, SessionLayout]


def _reopen(
    made: _Made,
    served: _Served,
    in_worker: bool = False,
    weights: PickledWeights | None = None,
) -> torch.nn.Module:
    """An unpickled proxy: its cache entry reopened, or built again where it is gone; or,
    where ``missing_cache="pytorch"`` (or a lossy plan, which needs the whole pipeline to
    be judged), the PyTorch module itself, with a warning. ``in_worker``: pickled for a
    worker of ``nlp.pipe(n_process=N)``, whose torch then runs on the threads ``config``
    gives the runtime (at most). ``weights``: the state of an original pickled parked,
    parked in the copy too (:func:`park_unpickled`), read back only where needed."""
    proxy_type, original, spec, extra = made
    exported, provider, config, layout = served
    if in_worker:
        worker_torch_threads(config.intra_op_threads)
    parking = None
    if weights is not None:
        parking = park_unpickled(original, weights, resolve_cache_dir(config.cache_dir))

    def module() -> torch.nn.Module:
        return original if parking is None else parking.resident()

    reopened = reopen(exported, spec, module, provider, config, layout)
    if reopened is None:
        logger.warning(
            "spacy-accelerate: the cached %s model %s is not here and %s, so this "
            "pipeline runs on PyTorch. Call spacy_accelerate.optimize(nlp) on it to "
            "accelerate it again.",
            config.precision.value,
            exported.key[:12],
            "its lossy plan is judged on the whole pipeline, which an unpickled "
            "transformer does not have"
            if config.calibrated and config.missing_cache is not MissingCache.PYTORCH
            else spelled(
                [Advice("missing_cache", "pytorch"), " says not to export it at load time"]
            ),
        )
        return module()
    session, found = reopened
    proxy = proxy_type(session, spec, original, found, *extra)
    if parking is not None:
        proxy.parking = parking
        parking.park()  # again, where the entry was built from them
        return_freed_memory()
    return proxy


@singledispatch
def make_proxy(
    original: torch.nn.Module,
    session: Session,
    spec: EncoderSpec,
    exported: ExportedModel | None,
) -> AcceleratedModule:
    """The proxy that keeps ``original``'s calling contract, serving ``session``: the
    verified model ``exported``, or (None) a candidate plan (:func:`candidate_proxy`)."""
    raise UnsupportedArchitectureError(
        f"No accelerated stand-in for {type(original).__name__}; please report this."
    )


@make_proxy.register
def _(
    original: CuratedTransformer,
    session: Session,
    spec: EncoderSpec,
    exported: ExportedModel | None,
) -> AcceleratedModule:
    return AcceleratedEncoder(session, spec, original, exported)


@make_proxy.register
def _(
    original: PreTrainedModel,
    session: Session,
    spec: EncoderSpec,
    exported: ExportedModel | None,
) -> AcceleratedModule:
    return AcceleratedHFModel(session, spec, original, exported, _output_type(original, spec))


def candidate_proxy(
    original: torch.nn.Module, session: Session, spec: EncoderSpec
) -> AcceleratedModule:
    """The proxy of a candidate plan, judged (or measured) before any cache entry holds
    it: it has no provenance to report, reopen or pickle (:attr:`AcceleratedModule.exported`),
    and runs only scoped to the thread judging it."""
    return make_proxy(original, session, spec, None)


def _output_type(model: PreTrainedModel, spec: EncoderSpec) -> type[ModelOutput]:
    """The ``ModelOutput`` class ``model`` returns, read from one tiny call."""
    inputs = EncoderInputs.uniform(spec, 1, 2)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return type(model(**inputs.as_torch(spec), return_dict=True))
    finally:
        model.train(was_training)
