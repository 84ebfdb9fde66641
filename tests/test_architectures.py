"""Step 3 and the conversion: dimensions read from the encoder, every tensor accounted for."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import spacy
import torch

from spacy_accelerate import ConversionError
from spacy_accelerate.architectures import detect_architecture
from spacy_accelerate.architectures.base import bert_like_state_dict
from spacy_accelerate.parity import verification_batch


def curated(sample_path: Callable[[str], Path], name: str) -> torch.nn.Module:
    nlp = spacy.load(sample_path(name))
    return nlp.get_pipe("transformer").model.get_ref("transformer").shims[0]._model


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # family, width, heads, head width, FFN width, layers, activation, padding index
        ("roberta", ("roberta", 48, 3, 16, 100, 2, "gelu", 1)),
        ("bert", ("bert", 40, 5, 8, 72, 2, "gelu_new", 0)),
        ("minilm", ("bert", 384, 12, 32, 1536, 6, "gelu", 0)),
    ],
)
def test_spec_is_read_from_the_encoder(
    sample_path: Callable[[str], Path], name: str, expected: tuple
):
    spec = detect_architecture(curated(sample_path, name)).spec
    actual = (
        spec.family,
        spec.hidden_width,
        spec.num_attention_heads,
        spec.head_width,
        spec.intermediate_width,
        spec.num_hidden_layers,
        spec.hidden_act,
        spec.padding_idx,
    )
    assert actual == expected


@pytest.mark.parametrize("name", ["roberta", "bert", "minilm"])
def test_hugging_face_model_matches_every_layer(sample_path: Callable[[str], Path], name: str):
    module = curated(sample_path, name).eval()
    detected = detect_architecture(module)
    hf_model = detected.architecture.to_hugging_face(detected.encoder, detected.spec)
    inputs = verification_batch(detected.spec, window=64)
    ids = torch.from_numpy(inputs.input_ids)
    mask = ids.ne(detected.spec.padding_idx)
    with torch.no_grad():
        expected = module(ids).all_outputs
        actual = hf_model(**inputs.as_torch(detected.spec), output_hidden_states=True).hidden_states
    assert len(actual) == len(expected) == detected.spec.num_hidden_layers + 1
    for got, want in zip(actual, expected, strict=True):
        assert torch.max(torch.abs(got[mask] - want[mask])) < 1e-5
    # The layers are distinct computations, not copies of one another.
    assert torch.max(torch.abs(expected[-1][mask] - expected[-2][mask])) > 1e-2


def test_an_unmapped_tensor_is_an_error(sample_path: Callable[[str], Path]):
    encoder = detect_architecture(curated(sample_path, "bert"))
    state = dict(encoder.encoder.state_dict())
    state["layers.0.extra.weight"] = torch.zeros(2)
    with pytest.raises(ConversionError, match=r"layers.0.extra.weight"):
        bert_like_state_dict(state, encoder.spec, embeddings_prefix="embeddings.")


def test_a_missing_tensor_is_an_error(sample_path: Callable[[str], Path]):
    encoder = detect_architecture(curated(sample_path, "bert"))
    state = dict(encoder.encoder.state_dict())
    del state["layers.1.ffn.output.bias"]
    with pytest.raises(ConversionError, match=r"layers.1.ffn.output.bias"):
        bert_like_state_dict(state, encoder.spec, embeddings_prefix="embeddings.")
