"""The spaCy side: the transformer components and their shims, the swap of the proxy in
and out (with its guard), the listeners' layer mixes, the training guard, ``nlp.pipe``,
persistence (load and save hooks, the config record, ``restore()``), where the weights are
parked, and warm-up.

The names below are what the API (:mod:`spacy_accelerate.api`) uses: steps 1-3 and 8-9 on
one transformer, step 12 (:func:`remember`) and its undo (:func:`restore`), and the hooks
that load and save an accelerated pipeline."""

from spacy_accelerate.pipeline.changes import remember, restore
from spacy_accelerate.pipeline.components import declared_special_ids, find_transformer_components
from spacy_accelerate.pipeline.patch import (
    accelerated_components,
    exclusive,
    guard,
    is_optimized,
    revert,
    serve_in,
    served_transformers,
)
from spacy_accelerate.pipeline.persist import (
    CALLBACK_NAME,
    CALLBACK_NAME_V1,
    AfterCreation,
    ApiCalls,
    unpatch_all,
)
from spacy_accelerate.pipeline.shim import ShimLocation, find_shim, find_span_settings

__all__ = [
    "CALLBACK_NAME",
    "CALLBACK_NAME_V1",
    "AfterCreation",
    "ApiCalls",
    "ShimLocation",
    "accelerated_components",
    "declared_special_ids",
    "exclusive",
    "find_shim",
    "find_span_settings",
    "find_transformer_components",
    "guard",
    "is_optimized",
    "remember",
    "restore",
    "revert",
    "serve_in",
    "served_transformers",
    "unpatch_all",
]
