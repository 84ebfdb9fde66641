"""CUDA graph bookkeeping: which captured graph replays which bucket.

ONNX Runtime's CUDA provider keeps one CUDA graph per graph id, chosen per
run with the ``gpu_graph_id`` run option. The first run under an id makes
the regular runs the capture needs (so that its memory arena holds
everything: nothing may be allocated while capturing) and the capture
itself, inside that one call; later runs under the id replay the graph. A
replay reads and writes the very addresses bound at capture, so each graph
belongs to one bucket shape and one set of outputs, always bound to the
same buffers (see :mod:`spacy_accelerate.backends.onnxruntime.io_binding`).

Ids start at 1: a run *without* the option counts as id 0 and would replay
graph 0. Every run of a session with graphs on therefore names its id, and
shapes outside the window's buckets name -1 (no graph) rather than capturing
graphs for shapes that may never come again.

ONNX Runtime keeps captured graphs per calling thread, and a capture is
broken by unsafe CUDA calls from other threads meanwhile: warm-up captures
in the thread that calls ``optimize()``, which is where spaCy runs the
pipeline unless you serve it from other threads (those capture their own on
first use). TensorRT's provider keeps a single graph per session, which
cannot serve several bucket shapes, so graphs are a CUDA-provider option.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spacy_accelerate.runtime.buckets import BucketPlan

#: ONNX Runtime's run option naming the graph to capture or replay.
GRAPH_ID_OPTION = "gpu_graph_id"

#: The id that tells ONNX Runtime not to use a graph for this run.
NO_GRAPH = -1

#: The first id handed out (0 is what a run without the option gets).
FIRST_GRAPH_ID = 1

#: A graph's identity: the bucket shape and the outputs asked for.
GraphKey = tuple[tuple[int, int], tuple[str, ...]]


@dataclass
class GraphBook:
    """Hands out one stable graph id per (bucket shape, outputs), when graphs are on."""

    enabled: bool
    plan: BucketPlan
    ids: dict[GraphKey, int] = field(default_factory=dict)
    #: How often each graph id ran; its first run is its capture.
    runs: dict[int, int] = field(default_factory=dict)

    def graph_id(self, shape: tuple[int, int], names: tuple[str, ...]) -> int:
        if not self.enabled or not self.plan.in_window(shape):
            return NO_GRAPH
        return self.ids.setdefault((shape, names), FIRST_GRAPH_ID + len(self.ids))

    def record_run(self, graph_id: int) -> bool:
        """Count a run of ``graph_id``; True when that run is the capture."""
        if graph_id == NO_GRAPH:
            return False
        self.runs[graph_id] = self.runs.get(graph_id, 0) + 1
        return self.runs[graph_id] == 1

    @property
    def captured(self) -> int:
        """How many graphs have been captured."""
        return len(self.runs)

    def run_options(self, ort: Any, graph_id: int) -> Any:
        """The ``RunOptions`` of one run: with graphs on, always naming its graph (or -1);
        None when the session has no graphs."""
        if not self.enabled:
            return None
        options = ort.RunOptions()
        options.add_run_config_entry(GRAPH_ID_OPTION, str(graph_id))
        return options
