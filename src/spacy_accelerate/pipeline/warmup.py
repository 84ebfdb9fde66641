"""Step 9: run the shapes the pipeline will see before the first real batch.

A runtime allocates its memory on first use (ONNX Runtime its arena), and on a
GPU ONNX Runtime tunes kernels per shape, builds TensorRT engines and captures
CUDA graphs; doing it here keeps that cost out of the user's first request. On a
GPU every bucket of the window is run; on the CPU one row
(:func:`~spacy_accelerate.runtime.session.cpu_warm_shapes`).
"""

from __future__ import annotations

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.pipeline.shim import SpanSettings
from spacy_accelerate.serving.proxy import AcceleratedModule


def warm_up(proxy: AcceleratedModule, spans: SpanSettings, all_layers: bool) -> None:
    """Run the shapes the session says warm it up (compiled kernels, buffers, CUDA graphs)
    once each, with the outputs the pipeline reads."""
    spec = proxy.spec
    names = proxy.served_outputs(all_layers)
    window = min(spans.window, spec.model_max_length)
    for rows, length in proxy.session.warm_shapes(window, spans.batch_size):
        feeds = EncoderInputs.uniform(spec, rows, length).as_torch(spec)
        proxy.session.run_tensors(feeds, names)
