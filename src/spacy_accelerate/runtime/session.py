"""What every backend's session is to the rest of the library.

The proxy, the parity gate, warm-up and the plan searches see a served model only
through :class:`Session`: ids in, hidden states out, either as numpy arrays (checks) or as
torch tensors (the proxy's hot path), plus the shapes that warm it up. ONNX Runtime's
and OpenVINO's sessions implement it in their own folders under ``backends/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.options.config import OptimizeConfig
from spacy_accelerate.runtime.buckets import BucketPlan
from spacy_accelerate.runtime.providers import ResolvedProvider


@dataclass(frozen=True)
class SessionLayout:
    """What a session needs to know about its model and where it runs, besides the config.
    A backend that keeps derived artefacts (engines, compiled blobs) extends it with their
    folders."""

    input_names: tuple[str, ...]
    padding_idx: int
    buckets: BucketPlan


class Session(Protocol):
    """A served model: the exported encoder, compiled by one backend for one device."""

    provider: ResolvedProvider
    config: OptimizeConfig
    layout: SessionLayout
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    @property
    def rows_independent(self) -> bool:
        """Whether each row of a call gets the outputs it gets alone, whatever the other
        rows: what lets concurrent callers' calls run as one
        (:mod:`~spacy_accelerate.runtime.shared_calls`). Not where the model scales a
        call's activations together (ONNX Runtime's dynamic int8)."""
        ...

    def run(self, inputs: EncoderInputs, outputs: Sequence[str]) -> list[np.ndarray]:
        """The requested outputs as host arrays, run the way the proxy runs them."""
        ...

    def run_tensors(
        self, feeds: Mapping[str, torch.Tensor], outputs: Sequence[str], *, graphs: bool = True
    ) -> list[torch.Tensor]:
        """The requested outputs as torch tensors on the session's device (``graphs``:
        whether this run may capture or replay a CUDA graph)."""
        ...

    def warm_shapes(self, window: int, batch_size: int) -> list[tuple[int, int]]:
        """The (rows, length) shapes that warm this session up for spans of ``window``
        pieces in batches of ``batch_size``, in order."""
        ...


def host_arrays(feeds: Mapping[str, torch.Tensor], names: Sequence[str]) -> dict[str, np.ndarray]:
    """The int64 numpy arrays a CPU runtime takes (no copy for CPU int64 tensors)."""
    return {name: feeds[name].detach().cpu().numpy().astype(np.int64, copy=False) for name in names}


def cpu_warm_shapes(window: int, batch_size: int, longest: int) -> list[tuple[int, int]]:
    """A CPU session's warm-up: one row at the span length. A CPU runtime compiles nothing
    per shape that a batch would reuse, and its memory grows with the first real batch
    either way, so a larger batch here only lengthens the load (0.6 s of trf-base's cold
    start, measured for issue 54) after a spot check that has just run batches."""
    del batch_size  # the interface's: a GPU session warms every batch bucket
    return [(1, max(1, min(window, longest)))]
