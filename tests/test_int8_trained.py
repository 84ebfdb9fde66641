"""Acceptance for int8: a real model with trained heads keeps its annotations.

MiniLM-L6 (real weights) with tagger, parser and NER trained briefly on
UD-EWT dev annotates all of UD-EWT test with PyTorch fp32 and with the int8
model: every piece's last hidden state within cosine 0.99 of PyTorch's, and
at least 98% of tags and of entity labels the same. (The speed of the same
comparison is measured in benchmarks/side_by_side.py, not here.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import spacy
from spacy_accelerate_samples import ewt
from spacy_accelerate_samples.trained import ensure_trained_sample

import spacy_accelerate
from spacy_accelerate.bench.doc_outputs import token_cosines
from spacy_accelerate.bench.side_by_side import agreement

pytestmark = pytest.mark.slow


def test_int8_keeps_the_trained_minilm_annotations(samples_root: Path, trained_minilm_cache: Path):
    nlp = spacy.load(ensure_trained_sample(samples_root))
    texts = [doc.text for doc in ewt.load_documents("test", max_sentences=8)]
    reference = list(nlp.pipe(texts, batch_size=64))
    spacy_accelerate.optimize(nlp, provider="cpu", precision="int8", cache_dir=trained_minilm_cache)
    (proxy,) = spacy_accelerate.accelerated_components(nlp).values()
    assert proxy.session.config.precision.value == "int8"
    assert proxy.exported.parity.worst_cosine >= 0.99
    accelerated = list(nlp.pipe(texts, batch_size=64))

    pairs = zip(reference, accelerated, strict=True)
    cosines = np.concatenate([token_cosines(ref, acc) for ref, acc in pairs])
    assert cosines.size > 25_000
    assert cosines.min() >= 0.99, cosines.min()
    same = agreement(reference, accelerated)
    assert same.tokens > 25_000
    assert same.rate("tag") >= 0.98, same.rate("tag")
    assert same.rate("ent") >= 0.98, same.rate("ent")
    # The heads are trained: the tags mean something (PyTorch scores 0.80 against gold).
    assert len({t.tag_ for doc in reference for t in doc}) > 30
