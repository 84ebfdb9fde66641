"""Run a session on tensors that stay on their device (IO binding).

spaCy hands the transformer torch tensors (CUDA tensors under
``spacy.require_gpu()``). The runner pads them into the bucket's input
buffers on the same device, binds those buffers and the bucket's output
buffers to the session, runs it, and cuts the real rows back out as new
tensors: no copy through host memory on the way. Buffers are views of one
arena per input and output, sized once for the largest bucket of the
window, so every bucket keeps the same addresses from one batch to the next
(which replaying a CUDA graph requires) and memory stays at one bucket's
worth. The same code runs on ONNX Runtime's CPU device, which is how it is
tested without a GPU.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from spacy_accelerate.backends.onnxruntime.cuda_graphs import NO_GRAPH, GraphBook
from spacy_accelerate.runtime.buckets import BucketPlan, pad_into, unpad

#: ONNX element types of the graph's inputs and outputs, as torch and numpy name them.
_ELEMENT_TYPES: dict[str, tuple[torch.dtype, type]] = {
    "tensor(int64)": (torch.int64, np.int64),
    "tensor(float)": (torch.float32, np.float32),
    "tensor(float16)": (torch.float16, np.float16),
}


@dataclass(frozen=True)
class _Port:
    """One input or output of the graph: its name, element type and trailing width."""

    name: str
    torch_dtype: torch.dtype
    numpy_dtype: type
    width: int | None  # hidden width of an output; None for (batch, sequence) inputs
    per_piece: bool  # (batch, sequence[, width]) rather than (batch, width)

    def shape(self, bucket: tuple[int, int]) -> tuple[int, ...]:
        rows, length = bucket
        lead = (rows, length) if self.per_piece else (rows,)
        return lead if self.width is None else (*lead, self.width)


def _ports(values: Sequence[Any], *, outputs: bool) -> dict[str, _Port]:
    ports = {}
    for value in values:
        torch_dtype, numpy_dtype = _ELEMENT_TYPES[value.type]
        width = value.shape[-1] if outputs else None
        ports[value.name] = _Port(
            value.name,
            torch_dtype,
            numpy_dtype,
            width,
            per_piece=not outputs or len(value.shape) == 3,  # a pooled output is (batch, width)
        )
    return ports


@dataclass
class _Bound:
    """A bucket's input and output views and the binding that points the session at them."""

    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    binding: Any
    graph_id: int
    run_options: Any


class BoundRunner:
    """Runs one session at bucket shapes on device-resident torch tensors."""

    def __init__(
        self,
        session: Any,
        ort: Any,
        *,
        device: torch.device,
        plan: BucketPlan,
        padding_idx: int,
        graphs: GraphBook,
    ) -> None:
        self.session = session
        self.device = device
        self.plan = plan
        self.graphs = graphs
        self._ort = ort
        self._fill = {"input_ids": padding_idx, "attention_mask": 0, "token_type_ids": 0}
        self._inputs = _ports(session.get_inputs(), outputs=False)
        self._outputs = _ports(session.get_outputs(), outputs=True)
        self._arena: dict[str, torch.Tensor] = {}
        self._bound: dict[tuple[tuple[int, int], tuple[str, ...], bool], _Bound] = {}
        self._lock = threading.Lock()

    @property
    def ort_device(self) -> tuple[str, int]:
        return self.device.type, self.device.index or 0

    def run(
        self, feeds: Mapping[str, torch.Tensor], names: Sequence[str], *, graphs: bool = True
    ) -> list[torch.Tensor]:
        """The outputs ``names`` for ``feeds`` (int64 ``(batch, length)`` tensors).

        ``graphs=False`` for one-off runs (the parity gate): they must not capture a
        CUDA graph that the pipeline would never replay.
        """
        wanted = tuple(names)
        rows = feeds["input_ids"].shape[0]
        with self._lock:
            parts = [
                self._run_bucket(
                    {name: feeds[name][rows_] for name in self._inputs}, wanted, graphs
                )
                for rows_ in self.plan.chunks(rows)
            ]
        if len(parts) == 1:
            return parts[0]
        return [torch.cat(list(chunks), dim=0) for chunks in zip(*parts, strict=True)]

    def buffers(self, shape: tuple[int, int], names: Sequence[str], graphs: bool = True) -> _Bound:
        """The bound buffers of a bucket (made on first use)."""
        key = (shape, tuple(names), graphs)
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bind(shape, tuple(names), graphs)
            if self.plan.in_window(shape):
                self._bound[key] = bound  # shapes past the window are not kept
        return bound

    def _run_bucket(
        self, feeds: Mapping[str, torch.Tensor], names: tuple[str, ...], graphs: bool
    ) -> list[torch.Tensor]:
        rows, length = feeds["input_ids"].shape
        bound = self.buffers(self.plan.shape_for(rows, length), names, graphs)
        for name, buffer in bound.inputs.items():
            pad_into(buffer, feeds[name].to(self.device, torch.int64), self._fill[name])
        # Padding rows see one piece: a row with no piece at all is a softmax over
        # nothing, NaN in fp16. Those rows are cut off either way.
        bound.inputs["attention_mask"][rows:, 0] = 1
        self.graphs.record_run(bound.graph_id)
        with _on_device(self.device):
            self.session.run_with_iobinding(bound.binding, bound.run_options)
        return [unpad(bound.outputs[name], rows, length) for name in names]

    def _view(self, port: _Port, shape: tuple[int, ...], *, in_window: bool) -> torch.Tensor:
        count = math.prod(shape)
        if not in_window:
            return torch.empty(shape, dtype=port.torch_dtype, device=self.device)
        arena = self._arena.get(port.name)
        if arena is None:
            size = math.prod(port.shape(self.plan.arena_shape))
            arena = torch.empty(size, dtype=port.torch_dtype, device=self.device)
            self._arena[port.name] = arena
        return arena[:count].view(shape)

    def _bind(self, shape: tuple[int, int], names: tuple[str, ...], graphs: bool) -> _Bound:
        in_window = self.plan.in_window(shape)
        device_type, device_id = self.ort_device
        binding = self.session.io_binding()
        inputs, outputs = {}, {}
        for name, port in self._inputs.items():
            view = self._view(port, port.shape(shape), in_window=in_window)
            binding.bind_input(
                name, device_type, device_id, port.numpy_dtype, tuple(view.shape), view.data_ptr()
            )
            inputs[name] = view
        for name in names:
            port = self._outputs[name]
            view = self._view(port, port.shape(shape), in_window=in_window)
            binding.bind_output(
                name, device_type, device_id, port.numpy_dtype, tuple(view.shape), view.data_ptr()
            )
            outputs[name] = view
        graph_id = self.graphs.graph_id(shape, names) if in_window and graphs else NO_GRAPH
        run_options = self.graphs.run_options(self._ort, graph_id)
        return _Bound(inputs, outputs, binding, graph_id, run_options)


@contextmanager
def _on_device(device: torch.device) -> Iterator[None]:
    """Around a run on a GPU: wait for torch's copies into the input buffers (they ran
    on torch's stream, ONNX Runtime reads on its own), and give the thread's current
    device back afterwards (ONNX Runtime sets it to the session's and leaves it so,
    which would move the caller's later work to that GPU)."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.current_stream(device).synchronize()
    with torch.cuda.device(device):
        yield
