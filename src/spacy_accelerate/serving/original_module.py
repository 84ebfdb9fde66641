"""The PyTorch module a proxy stands in for, and where its weights are while it serves.

Its structure and config are always held (the ``shell``); its weights are parked while
the proxy serves, and read back from their source only where something needs them
(``restore()``, a save, a pickle, a device move: :mod:`.parked_weights`). What ``restore()``
puts back is :meth:`OriginalModule.read`, a method: it may read a file.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from spacy_accelerate.serving.parked_weights import ParkedWeights, PickledWeights
from spacy_accelerate.serving.weight_sources import WeightsSource


class OriginalModule:
    """The PyTorch module a proxy stands in for (see the module's docstring)."""

    def __init__(self, shell: torch.nn.Module, parking: ParkedWeights | None = None) -> None:
        #: The module as it is held: its structure and config, its weights only where they
        #: are not parked.
        self.shell = shell
        #: Where its weights are while they are parked (:meth:`park`).
        self.parking = parking

    def read(self) -> torch.nn.Module:
        """The module with its weights: read back, and kept, where they were parked."""
        return self.parking.resident() if self.parking is not None else self.shell

    def park(self, source: WeightsSource) -> None:
        """Let the weights go from memory while ``source`` can give them back."""
        original = self.read()  # read back first where parked with another source
        self.parking = ParkedWeights(original, source)
        self.parking.park()

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The module's state, read once where parked and parked again after."""
        if self.parking is None:
            return self.shell.state_dict(*args, **kwargs)
        with self.parking.briefly_resident() as original:
            return original.state_dict(*args, **kwargs)

    def deep_copy(self, memo: dict[int, Any]) -> OriginalModule:
        """A copy for ``copy.deepcopy`` of its proxy: parked weights stay parked, their
        source shared (:meth:`.ParkedWeights.deep_copy`)."""
        if self.parking is None:
            return OriginalModule(copy.deepcopy(self.shell, memo))
        parking = self.parking.deep_copy(memo)
        return OriginalModule(parking.module, parking)

    def pickled(self) -> PickledWeights | None:
        """The parked state for a pickle (None where the module holds its weights: they
        are pickled with it)."""
        return self.parking.pickled() if self.parking is not None else None
