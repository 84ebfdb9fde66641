"""Step 9: run the shapes the pipeline will see before the first real batch.

ONNX Runtime allocates its memory arena and (on GPU providers) builds
kernels or engines on first use; doing it here keeps that cost out of the
user's first request.
"""

from __future__ import annotations

import numpy as np

from .encoder_inputs import EncoderInputs
from .proxy import AcceleratedModule
from .shim import SpanSettings


def warm_up(proxy: AcceleratedModule, spans: SpanSettings) -> None:
    spec = proxy.spec
    positions = spec.max_position_embeddings - spec.padding_idx - 1
    length = max(1, min(spans.window, spec.model_max_length, positions))
    token = (spec.padding_idx + 1) % spec.vocab_size
    for batch in sorted({1, min(spans.batch_size, 8)}):
        ids = np.full((batch, length), token, dtype=np.int64)
        proxy.session.run(EncoderInputs.from_ids(ids, spec.padding_idx), spec.output_names)
