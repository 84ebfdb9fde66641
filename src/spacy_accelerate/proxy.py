"""Step 7: the torch module that stands in for the curated transformer.

spaCy's thinc wrapper calls the shim's module with padded ``input_ids`` and
reads a ``PyTorchTransformerOutput``; this module keeps that contract exactly,
so the span striding, unpadding and listeners around it run unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from curated_transformers.models.attention import AttentionMask
from curated_transformers.models.output import PyTorchTransformerOutput
from thinc.api import Model

from .architectures.spec import EncoderSpec
from .errors import InferenceOnlyError
from .exported import ExportedModel
from .runtime import EncoderSession

#: Set by spacy-curated-transformers on the wrapper before every call: whether
#: the listeners read every layer or only the last one.
ALL_LAYERS_ATTR = "_all_layer_outputs"

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
        layer: Model,
        exported: ExportedModel,
    ) -> None:
        super().__init__()
        self.session = session
        self.spec = spec
        self.exported = exported
        self._layer = layer
        # Kept outside torch's module registry: the original is not part of
        # this module's parameters, only what restore() puts back.
        object.__setattr__(self, "original", original)

    def wants_all_layers(self) -> bool:
        return bool(self._layer.attrs.get(ALL_LAYERS_ATTR, True))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: AttentionMask | None = None,
        token_type_ids: torch.Tensor | None = None,
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

        all_layers = self.wants_all_layers()
        names = self.spec.output_names if all_layers else self.spec.output_names[-1:]
        if ids.size == 0:
            width = self.spec.hidden_width
            arrays = [np.zeros((*ids.shape, width), dtype=np.float32) for _ in names]
        else:
            arrays = self.session.run(ids, mask, types, names)
        tensors = [torch.from_numpy(array).to(input_ids.device) for array in arrays]
        if all_layers:
            return PyTorchTransformerOutput(
                embedding_output=tensors[0], layer_hidden_states=tensors[1:]
            )
        skipped = [_unrequested() for _ in range(self.spec.num_hidden_layers - 1)]
        return PyTorchTransformerOutput(
            embedding_output=_unrequested(), layer_hidden_states=[*skipped, tensors[-1]]
        )

    # thinc serialises the shim's module through these: saving writes the
    # original PyTorch weights (a faithful pipeline), loading new weights into a
    # running session would leave it stale, so that is refused.
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.original.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        raise InferenceOnlyError(
            f"Cannot load new weights into an accelerated transformer. {_RESTORE_HINT}"
        )

    def extra_repr(self) -> str:
        return (
            f"family={self.spec.family}, layers={self.spec.num_hidden_layers}, "
            f"provider={self.session.provider.provider.value}, key={self.exported.key[:12]}"
        )
