"""When a runtime gives back the working memory of a run.

Both CPU runtimes keep the working memory of their largest run for the rest of the
process: ONNX Runtime's CPU arena keeps its peak, OpenVINO's CPU plugin keeps its graph's
intermediate buffers and the infer request's output tensors at the largest shape seen. One
100,000-character request on minilm-ewt left a served process 1.1 GiB (ONNX Runtime) and
0.8 GiB (OpenVINO) larger for good, where the plain pipeline's came back within 30 MiB
(issue 60). So a run larger than :data:`RELEASE_AFTER_PIECES` gives its working memory back
once its outputs are copied out (ONNX Runtime: the run option
``memory.enable_memory_arena_shrinkage``; OpenVINO: ``CompiledModel.release_memory`` and a
new infer request). Runs up to that size, which every single-document request and the
batches of ``nlp.pipe`` at spaCy's usual sizes stay within, reuse their memory as before:
the cost of reallocating is paid only after an unusually large run (measured:
docs/performance.md, "issue 60").
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

#: The input pieces (rows x length, padding included) above which a run gives its working
#: memory back: 64 spans of 128 pieces, twice over.
RELEASE_AFTER_PIECES = 16_384


def releases_memory(feeds: Mapping[str, np.ndarray]) -> bool:
    """Whether the run over ``feeds`` (int64 ``(rows, length)`` arrays) gives its working
    memory back after it."""
    ids = next(iter(feeds.values()))
    return int(ids.size) > RELEASE_AFTER_PIECES
