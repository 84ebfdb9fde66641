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

import logging
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
from spacy_accelerate.cpu_budget import BUDGET
from spacy_accelerate.errors import InferenceOnlyError, UnsupportedArchitectureError
from spacy_accelerate.provision.get_or_export import ExportedModel
from spacy_accelerate.runtime.cancellation import check as check_cancelled
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.serving.original_module import OriginalModule
from spacy_accelerate.serving.parked_weights import ParkedWeights
from spacy_accelerate.serving.pickling import reduce
from spacy_accelerate.serving.served_model import ServedModel

logger = logging.getLogger("spacy_accelerate")

#: Keyword the patched ``convert_inputs`` adds: whether every layer is read.
ALL_LAYERS_KWARG = "all_layer_outputs"

RESTORE_HINT = (
    "Call spacy_accelerate.restore(nlp) to put the PyTorch transformer back first, "
    "then optimize() again after training."
)


def _unrequested() -> torch.Tensor:
    # Stands where a layer that was not computed would be. Any use of it as a
    # (batch, sequence, width) tensor fails loudly instead of reading a copy
    # of another layer.
    return torch.empty(0)


class AcceleratedModule(torch.nn.Module):
    """What both proxies share: what serves (:class:`.ServedModel`: the session, opened in
    this process), the module it stands in for (:class:`.OriginalModule`: its weights
    parked while this serves) and how it is pickled (:mod:`.pickling`)."""

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
        self.spec = spec
        # Kept outside torch's module registry: the original is not part of this module's
        # parameters, only what restore() puts back.
        object.__setattr__(self, "original", OriginalModule(original))
        self.served = ServedModel(session, spec, exported, self.read_original)

    original: OriginalModule

    @property
    def session(self) -> Session:
        return self.served.session

    @property
    def provenance(self) -> ExportedModel | None:
        """The verified model served, or None for a candidate plan (:func:`candidate_proxy`)."""
        return self.served.provenance

    @property
    def exported(self) -> ExportedModel:
        return self.served.exported

    @property
    def parking(self) -> ParkedWeights | None:
        return self.original.parking

    @property
    def shell(self) -> torch.nn.Module:
        """The PyTorch module as it is held (no reading back)."""
        return self.original.shell

    def read_original(self) -> torch.nn.Module:
        """The PyTorch module this one stands in for (what ``restore()`` puts back), with
        its weights: read back from their file where they were parked (a method, not a
        property: it may read a file)."""
        return self.original.read()

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
        return [tensor.to(ids.device) for tensor in self.served.run(feeds, names)]

    # thinc serialises the shim's module through these: saving writes the
    # original PyTorch weights (a faithful pipeline); loading new weights into a
    # running session would leave it stale, so that is refused.
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.original.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        raise InferenceOnlyError(
            "Cannot load new weights (from_disk, from_bytes or training) into an accelerated "
            f"transformer. {RESTORE_HINT}"
        )

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        # Device and dtype moves (nlp.to_gpu, shim.to_device) reach the original,
        # so that restore() hands back a module where the pipeline expects it.
        self.read_original()._apply(fn)
        return self

    def rebuild_args(self) -> tuple[Any, ...]:
        """Constructor arguments after ``(session, spec, original, exported)``."""
        return ()

    def __deepcopy__(self, memo: dict[int, Any]) -> AcceleratedModule:
        # The session is immutable and thread-safe: copies share it.
        original = self.original.deep_copy(memo)
        clone = type(self)(
            self.session, self.spec, original.shell, self.provenance, *self.rebuild_args()
        )
        object.__setattr__(clone, "original", original)
        clone.served.opened_in = self.served.opened_in  # made in a fork: the parent's
        if BUDGET.serves(self):  # a copy of a pipeline's: it serves in the copy's
            BUDGET.serve(clone)
        clone.train(self.training)
        memo[id(self)] = clone
        return clone

    def __reduce__(self) -> tuple[Any, ...]:
        return reduce(self)

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

    def rebuild_args(self) -> tuple[Any, ...]:
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
