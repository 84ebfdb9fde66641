"""Step 9: run the shapes the pipeline will see before the first real batch.

ONNX Runtime allocates its memory arena and (on GPU providers) builds
kernels or engines on first use; doing it here keeps that cost out of the
user's first request.
"""

from __future__ import annotations

import torch

from .proxy import AcceleratedEncoder
from .shim import SpanSettings


def warm_up(proxy: AcceleratedEncoder, spans: SpanSettings) -> None:
    spec = proxy.spec
    length = max(1, min(spans.window, spec.model_max_length))
    token = (spec.padding_idx + 1) % spec.vocab_size
    was_training = proxy.training
    proxy.eval()
    try:
        with torch.no_grad():
            for batch in sorted({1, min(spans.batch_size, 8)}):
                proxy(torch.full((batch, length), token, dtype=torch.long))
    finally:
        proxy.train(was_training)
