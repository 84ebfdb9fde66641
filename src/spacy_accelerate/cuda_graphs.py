"""CUDA graph bookkeeping: which captured graph replays which bucket.

ONNX Runtime runs a graph id (the ``gpu_graph_id`` run option) normally a
couple of times, so that its memory arena holds everything the run needs
(no allocation may happen during a capture), captures it on the next run
and replays it from then on. A replay reads and writes the very addresses
bound at capture, so each graph belongs to one bucket shape and one set of
outputs, always bound to the same buffers (see
:mod:`spacy_accelerate.io_binding`). Shapes outside the window's buckets run
without a graph (id -1) rather than capturing graphs for shapes that may
never come again.

ONNX Runtime keeps captured graphs per calling thread, and a capture is
broken by unsafe CUDA calls from other threads meanwhile: warm-up captures
in the thread that calls ``optimize()``, which is where spaCy runs the
pipeline unless you serve it from other threads (they then capture their
own on first use).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .buckets import BucketPlan

#: ONNX Runtime's run option naming the graph to capture or replay.
GRAPH_ID_OPTION = "gpu_graph_id"

#: The id that tells ONNX Runtime not to use a graph for this run.
NO_GRAPH = -1

#: Regular runs ONNX Runtime makes of a graph id before capturing it (its CUDA
#: provider's ``min_num_runs_before_cuda_graph_capture_``; older releases used 1,
#: for which these runs are simply one more replay).
REGULAR_RUNS_BEFORE_CAPTURE = 2

#: A graph's identity: the bucket shape and the outputs asked for.
GraphKey = tuple[tuple[int, int], tuple[str, ...]]


@dataclass
class GraphBook:
    """Hands out one stable graph id per (bucket shape, outputs), when graphs are on."""

    enabled: bool
    plan: BucketPlan
    ids: dict[GraphKey, int] = field(default_factory=dict)
    #: How often each graph id ran.
    runs: dict[int, int] = field(default_factory=dict)

    def graph_id(self, shape: tuple[int, int], names: tuple[str, ...]) -> int:
        if not self.enabled or not self.plan.in_window(shape):
            return NO_GRAPH
        return self.ids.setdefault((shape, names), len(self.ids))

    def record_run(self, graph_id: int) -> bool:
        """Count a run of ``graph_id``; True when that run is the capture."""
        if graph_id == NO_GRAPH:
            return False
        self.runs[graph_id] = self.runs.get(graph_id, 0) + 1
        return self.runs[graph_id] == REGULAR_RUNS_BEFORE_CAPTURE + 1

    @property
    def captured(self) -> int:
        """How many graphs have been captured."""
        return sum(count > REGULAR_RUNS_BEFORE_CAPTURE for count in self.runs.values())

    @property
    def warm_runs(self) -> int:
        """Runs of each bucket at warm-up: enough to capture its graph when graphs are on."""
        return REGULAR_RUNS_BEFORE_CAPTURE + 1 if self.enabled else 1

    def run_options(self, ort: Any, graph_id: int) -> Any:
        """The ``RunOptions`` of a run under ``graph_id`` (None: no graph)."""
        if graph_id == NO_GRAPH:
            return None
        options = ort.RunOptions()
        options.add_run_config_entry(GRAPH_ID_OPTION, str(graph_id))
        return options
