"""PyTorch's outputs for the rows a model is checked on, computed once per batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from spacy_accelerate.architectures import DetectedEncoder
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.verify.parity import reference_outputs


class References:
    """PyTorch's outputs for the rows a model is checked on, each batch computed once.

    Computed with the transformer's layer to this thread alone (``exclusive``): another
    thread annotating on the same PyTorch module puts it back in train mode after every
    batch (thinc does), and a reference computed meanwhile would run with dropout."""

    def __init__(
        self,
        module: torch.nn.Module,
        detected: DetectedEncoder,
        exclusive: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        self._module, self._detected, self._exclusive = module, detected, exclusive
        self._known: dict[int, tuple[EncoderInputs, list[Any]]] = {}

    def of(self, batches: Sequence[EncoderInputs]) -> list[list[Any]]:
        missing = [batch for batch in batches if id(batch) not in self._known]
        if missing:
            with self._exclusive():
                for batch in missing:
                    outputs = reference_outputs(self._module, self._detected, batch)
                    self._known[id(batch)] = (batch, outputs)
        return [self._known[id(batch)][1] for batch in batches]
