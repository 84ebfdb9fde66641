"""Step 9: run the shapes the pipeline will see before the first real batch.

ONNX Runtime allocates its memory arena and (on GPU providers) builds
kernels or engines on first use; doing it here keeps that cost out of the
user's first request.
"""

from __future__ import annotations

from .encoder_inputs import EncoderInputs
from .proxy import AcceleratedModule
from .shim import SpanSettings


def warm_up(proxy: AcceleratedModule, spans: SpanSettings) -> None:
    spec = proxy.spec
    length = max(1, min(spans.window, spec.model_max_length, spec.longest_input))
    for batch in sorted({1, min(spans.batch_size, 8)}):
        proxy.session.run(EncoderInputs.uniform(spec, batch, length), spec.output_names)
