"""The transformer outputs spaCy keeps on a ``Doc``, read the same way for both packages.

spacy-curated-transformers stores ragged per-piece arrays without padding;
spacy-transformers stores the padded per-span model output with its
wordpieces. Comparisons (benchmarks, tests) want the former everywhere.
"""

from __future__ import annotations

import numpy as np
from spacy.tokens import Doc

try:
    from spacy_transformers.data_classes import TransformerData
except ImportError:  # pragma: no cover - spacy-transformers is an optional extra
    TransformerData = None  # type: ignore[misc,assignment]


def _is_spacy_transformers(data: object) -> bool:
    return TransformerData is not None and isinstance(data, TransformerData)


def _real_pieces(data: TransformerData, array: np.ndarray) -> np.ndarray:
    mask = np.asarray(data.wordpieces.attention_mask).astype(bool)
    return np.asarray(array)[mask].copy()


def last_hidden_state(doc: Doc) -> np.ndarray:
    """``(pieces, width)``: the last layer's hidden state of every real piece of ``doc``."""
    data = doc._.trf_data
    if _is_spacy_transformers(data):
        return _real_pieces(data, data.model_output.last_hidden_state)
    return np.asarray(data.last_hidden_layer_state.dataXd).copy()


def all_hidden_states(doc: Doc) -> list[np.ndarray]:
    """The embedding output and every layer's hidden state, each ``(pieces, width)``."""
    data = doc._.trf_data
    if _is_spacy_transformers(data):
        return [_real_pieces(data, layer) for layer in data.model_output.hidden_states]
    return [np.asarray(layer.dataXd).copy() for layer in data.all_outputs]


def token_cosines(reference: Doc, candidate: Doc) -> np.ndarray:
    """Cosine similarity of each piece's last hidden state to the reference's."""
    a = last_hidden_state(reference).astype(np.float64)
    b = last_hidden_state(candidate).astype(np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.sum(a * b, axis=-1) / np.maximum(norms, 1e-30)
