"""Step 9: run the shapes the pipeline will see before the first real batch.

ONNX Runtime allocates its memory arena on first use, and on a GPU it tunes
kernels per shape, builds TensorRT engines and captures CUDA graphs; doing
it here keeps that cost out of the user's first request. On a GPU every
bucket of the window is run; on the CPU two typical batches suffice.
"""

from __future__ import annotations

from functools import singledispatch

from .architectures.spec import EncoderSpec
from .encoder_inputs import EncoderInputs
from .io_binding import BoundRunner
from .openvino_runtime import OpenVINORunner
from .proxy import AcceleratedModule
from .runtime import HostRunner, TensorRunner
from .shim import SpanSettings


@singledispatch
def warm_shapes(runner: TensorRunner, spans: SpanSettings, spec: EncoderSpec) -> list:
    """The (batch, length) shapes to run, each as often as it needs, in order."""
    raise TypeError(f"No warm-up for {type(runner).__name__}")


@warm_shapes.register(HostRunner)
@warm_shapes.register(OpenVINORunner)
def _(runner: TensorRunner, spans: SpanSettings, spec: EncoderSpec) -> list:
    length = max(1, min(spans.window, spec.model_max_length, spec.longest_input))
    return [(batch, length) for batch in sorted({1, min(spans.batch_size, 8)})]


@warm_shapes.register
def _(runner: BoundRunner, spans: SpanSettings, spec: EncoderSpec) -> list:
    # With CUDA graphs, each bucket's first run captures its graph.
    return runner.plan.warm_shapes()


def warm_up(proxy: AcceleratedModule, spans: SpanSettings, all_layers: bool) -> None:
    spec = proxy.spec
    names = proxy.served_outputs(all_layers)
    for rows, length in warm_shapes(proxy.session.runner, spans, spec):
        feeds = EncoderInputs.uniform(spec, rows, length).as_torch(spec)
        proxy.session.run_tensors(feeds, names)
