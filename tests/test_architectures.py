"""Step 3 and the conversion: dimensions read from the encoder, every tensor accounted for."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from spacy_accelerate_samples import load_sample
from transformers import BertConfig, BertModel

from spacy_accelerate import ConversionError
from spacy_accelerate.architectures import detect_architecture
from spacy_accelerate.architectures.base import bert_like_state_dict
from spacy_accelerate.backends.base import ServeRequest
from spacy_accelerate.backends.registry import check_provider
from spacy_accelerate.cache.store import ModelCache
from spacy_accelerate.options.request import build_config
from spacy_accelerate.provision.get_or_export import get_or_export
from spacy_accelerate.serving.proxy import make_proxy
from spacy_accelerate.verify.verification import random_rows


def curated(sample_path: Callable[[str], Path], name: str) -> torch.nn.Module:
    nlp = load_sample(name, sample_path(name).parent)
    return nlp.get_pipe("transformer").model.get_ref("transformer").shims[0]._model


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # family, width, heads, head width, FFN width, layers, activation, padding index
        ("roberta", ("roberta", 48, 3, 16, 100, 2, "gelu", 1)),
        ("bert", ("bert", 40, 5, 8, 72, 2, "gelu_new", 0)),
        ("minilm", ("bert", 384, 12, 32, 1536, 6, "gelu", 0)),
        ("xlmr", ("roberta", 56, 4, 14, 120, 2, "gelu", 1)),
        ("camembert", ("roberta", 44, 4, 11, 90, 3, "gelu", 1)),
        ("albert", ("albert", 40, 4, 10, 72, 4, "gelu_new", 0)),
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


@pytest.mark.parametrize("name", ["roberta", "bert", "minilm", "xlmr", "camembert", "albert"])
def test_hugging_face_model_matches_every_layer(sample_path: Callable[[str], Path], name: str):
    module = curated(sample_path, name).eval()
    detected = detect_architecture(module)
    hf_model = detected.architecture.to_hugging_face(detected.encoder, detected.spec)
    inputs = random_rows(detected.spec, window=64)
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


def test_albert_groups_and_embedding_width_are_read(sample_path: Callable[[str], Path]):
    spec = detect_architecture(curated(sample_path, "albert")).spec
    assert (spec.embedding_width, spec.num_hidden_groups, spec.inner_group_num) == (24, 2, 2)
    for name in ("bert", "roberta"):
        other = detect_architecture(curated(sample_path, name)).spec
        assert (other.num_hidden_groups, other.inner_group_num) == (1, 1)
        assert other.embedding_width == other.hidden_width


def test_hugging_face_proxy_honours_token_type_ids(tmp_path: Path):
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=60,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=40,
        type_vocab_size=2,
    )
    model = BertModel(config).eval()
    nlp_config = build_config("cpu", "fp32", cache_dir=tmp_path)
    detected = detect_architecture(model)
    request = ServeRequest.plain(model, detected, nlp_config, check_provider(nlp_config), 16)
    session, exported = get_or_export(request, ModelCache(tmp_path))
    proxy = make_proxy(model, session, detected.spec, exported)
    ids = torch.randint(1, 60, (2, 9))
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
        actual = proxy(input_ids=ids, attention_mask=mask, token_type_ids=types)
        zeros = proxy(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))
    assert torch.max(torch.abs(expected.last_hidden_state - actual.last_hidden_state)) < 1e-4
    assert torch.max(torch.abs(expected.pooler_output - actual.pooler_output)) < 1e-4
    assert torch.max(torch.abs(zeros.last_hidden_state - actual.last_hidden_state)) > 1e-3
