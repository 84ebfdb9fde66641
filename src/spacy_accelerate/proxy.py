"""Step 7: the torch module that stands in for the curated transformer.

spaCy's thinc wrapper calls the shim's module with padded ``input_ids`` and
reads a ``PyTorchTransformerOutput``; this module keeps that contract exactly,
so the span striding, unpadding and listeners around it run unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from curated_transformers.models.attention import AttentionMask
from curated_transformers.models.output import PyTorchTransformerOutput

from .architectures.spec import EncoderSpec
from .config import OptimizeConfig
from .errors import InferenceOnlyError
from .exported import ExportedModel, reopen_session
from .providers import ResolvedProvider
from .runtime import EncoderSession

#: Keyword the patched ``convert_inputs`` adds: whether every layer is read.
ALL_LAYERS_KWARG = "all_layer_outputs"

_RESTORE_HINT = (
    "Call spacy_accelerate.restore(nlp) to put the PyTorch transformer back first, "
    "then optimize() again after training."
)


def _unrequested() -> torch.Tensor:
    # Stands where a layer that was not computed would be. Any use of it as a
    # (batch, sequence, width) tensor fails loudly instead of reading a copy
    # of another layer.
    return torch.empty(0)


class AcceleratedEncoder(torch.nn.Module):
    """A ``CuratedTransformer`` look-alike backed by an ONNX Runtime session."""

    def __init__(
        self,
        session: EncoderSession,
        spec: EncoderSpec,
        original: torch.nn.Module,
        exported: ExportedModel,
    ) -> None:
        super().__init__()
        self.session = session
        self.spec = spec
        self.exported = exported
        # Kept outside torch's module registry: the original is not part of
        # this module's parameters, only what restore() puts back.
        object.__setattr__(self, "original", original)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: AttentionMask | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        all_layer_outputs: bool = True,
    ) -> PyTorchTransformerOutput:
        if self.training and torch.is_grad_enabled():
            raise InferenceOnlyError(
                "This transformer has been accelerated by spacy-accelerate and is inference-only; "
                f"it cannot be trained. {_RESTORE_HINT}"
            )
        ids = input_ids.detach().cpu().numpy().astype(np.int64, copy=False)
        if attention_mask is None:
            mask = (ids != self.spec.padding_idx).astype(np.int64)
        else:
            mask = attention_mask.bool_mask.detach().cpu().numpy().astype(np.int64)
        if token_type_ids is None:
            types = np.zeros_like(ids)
        else:
            types = token_type_ids.detach().cpu().numpy().astype(np.int64, copy=False)

        names = self.spec.output_names if all_layer_outputs else self.spec.output_names[-1:]
        if ids.size == 0:
            width = self.spec.hidden_width
            arrays = [np.zeros((*ids.shape, width), dtype=np.float32) for _ in names]
        else:
            arrays = self.session.run(ids, mask, types, names)
        tensors = [torch.from_numpy(array).to(input_ids.device) for array in arrays]
        if all_layer_outputs:
            return PyTorchTransformerOutput(
                embedding_output=tensors[0], layer_hidden_states=tensors[1:]
            )
        skipped = [_unrequested() for _ in range(self.spec.num_hidden_layers - 1)]
        return PyTorchTransformerOutput(
            embedding_output=_unrequested(), layer_hidden_states=[*skipped, tensors[-1]]
        )

    # thinc serialises the shim's module through these: saving writes the
    # original PyTorch weights (a faithful pipeline); loading new weights into a
    # running session would leave it stale, so that is refused.
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.original.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        raise InferenceOnlyError(
            "Cannot load new weights (nlp.from_disk, from_bytes or training) into an "
            f"accelerated transformer. {_RESTORE_HINT}"
        )

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        # Device and dtype moves (nlp.to_gpu, shim.to_device) reach the original,
        # so that restore() hands back a module where the pipeline expects it.
        self.original._apply(fn)
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> AcceleratedEncoder:
        # The session is immutable and thread-safe: copies share it.
        clone = AcceleratedEncoder(
            self.session, self.spec, copy.deepcopy(self.original, memo), self.exported
        )
        clone.train(self.training)
        memo[id(self)] = clone
        return clone

    def __reduce__(self) -> tuple[Any, ...]:
        # A pickled proxy reopens its verified cache entry; sessions are never pickled.
        return (
            _reopen,
            (self.original, self.spec, self.exported, self.session.provider, self.session.config),
        )

    def extra_repr(self) -> str:
        return (
            f"family={self.spec.family}, layers={self.spec.num_hidden_layers}, "
            f"provider={self.session.provider.provider.value}, key={self.exported.key[:12]}"
        )


def _reopen(
    original: torch.nn.Module,
    spec: EncoderSpec,
    exported: ExportedModel,
    provider: ResolvedProvider,
    config: OptimizeConfig,
) -> AcceleratedEncoder:
    session = reopen_session(exported, provider, config)
    return AcceleratedEncoder(session, spec, original, exported)
