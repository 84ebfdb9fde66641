"""Every failure is a SpacyAccelerateError that says what to do, and leaves the pipeline usable."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import spacy
import torch
from annotations import last_hidden
from curated_transformers.models.curated_transformer import CuratedTransformer
from spacy.training import Example
from transformers import BertConfig, BertModel, MPNetConfig, MPNetModel

import spacy_accelerate
from spacy_accelerate import (
    ConversionError,
    InferenceOnlyError,
    InvalidInputError,
    InvalidOptionError,
    NoTransformerError,
    ProviderUnavailableError,
    SpacyAccelerateError,
    UnsupportedArchitectureError,
)
from spacy_accelerate.architectures import detect_architecture
from spacy_accelerate.architectures.bert import BertArchitecture
from spacy_accelerate.runtime import providers as providers_module


def test_errors_share_one_base():
    for error in (
        ConversionError,
        InferenceOnlyError,
        InvalidOptionError,
        NoTransformerError,
        ProviderUnavailableError,
        UnsupportedArchitectureError,
        spacy_accelerate.CacheError,
        spacy_accelerate.AgreementError,
        spacy_accelerate.PrecisionUnavailableError,
    ):
        assert issubclass(error, SpacyAccelerateError)
    assert issubclass(spacy_accelerate.PrecisionUnavailableError, ProviderUnavailableError)
    assert issubclass(spacy_accelerate.AgreementError, spacy_accelerate.AccuracyError)


def test_no_transformer_names_the_components_found():
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer", name="splitter")
    nlp.add_pipe("tok2vec")
    with pytest.raises(NoTransformerError, match=r"'splitter' \(sentencizer\), 'tok2vec'"):
        spacy_accelerate.optimize(nlp, provider="cpu")


class HomeMadeEncoder(torch.nn.Module):
    """An encoder no converter knows."""


def test_unsupported_encoder_names_the_supported_ones():
    with pytest.raises(
        UnsupportedArchitectureError, match="HomeMadeEncoder is not supported yet.*AlbertEncoder"
    ):
        detect_architecture(CuratedTransformer(HomeMadeEncoder()))


def test_unsupported_hugging_face_model_names_the_supported_ones():
    config = MPNetConfig(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=20,
    )
    with pytest.raises(
        UnsupportedArchitectureError, match="MPNetModel is not supported yet.*DistilBertModel"
    ):
        detect_architecture(MPNetModel(config))


def test_a_model_asked_for_attention_weights_is_refused():
    config = BertConfig(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=20,
        output_attentions=True,
    )
    with pytest.raises(UnsupportedArchitectureError, match="output_attentions"):
        detect_architecture(BertModel(config))


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"provider": "gpu"}, "Unknown provider 'gpu'. Valid values: 'auto', 'cpu', 'cuda'"),
        ({"precision": "fp8"}, "Unknown precision 'fp8'. Valid values: 'fp32', 'fp16', 'bf16'"),
        ({"provider": "cpu", "precision": "fp16"}, "provider='cpu' with precision='int8'"),
        ({"tolerance": 2.0}, "tolerance must be a number between 0 and 1"),
        ({"threads": 0}, "threads must be a positive integer"),
    ],
)
def test_invalid_options_list_the_valid_values(
    bert: spacy.language.Language, cache_dir: Path, kwargs: dict, pattern: str
):
    with pytest.raises(InvalidOptionError, match=pattern):
        spacy_accelerate.optimize(bert, cache_dir=cache_dir, **kwargs)
    assert not spacy_accelerate.is_optimized(bert)
    assert not cache_dir.exists()


def test_missing_gpu_provider_says_what_to_install(bert: spacy.language.Language, cache_dir: Path):
    with pytest.raises(ProviderUnavailableError, match=r"pip install 'spacy-accelerate\[gpu\]'"):
        spacy_accelerate.optimize(bert, provider="cuda", cache_dir=cache_dir)
    with pytest.raises(ProviderUnavailableError, match=r"spacy-accelerate\[tensorrt\]"):
        spacy_accelerate.optimize(bert, provider="tensorrt", cache_dir=cache_dir)


def test_missing_onnxruntime_says_what_to_install(
    bert: spacy.language.Language, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    real_import = importlib.import_module

    def without_onnxruntime(name: str, *args: object) -> object:
        if name == "onnxruntime":
            raise ImportError("No module named 'onnxruntime'")
        return real_import(name, *args)

    monkeypatch.setattr(providers_module.importlib, "import_module", without_onnxruntime)
    with pytest.raises(ProviderUnavailableError, match=r"spacy-accelerate\[cpu\]"):
        spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    # auto would serve with OpenVINO (a test dependency) alone; without it too, it says what
    # to install.
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "openvino" else real_find_spec(name, *a),
    )
    with pytest.raises(ProviderUnavailableError, match=r"spacy-accelerate\[cpu\]"):
        spacy_accelerate.optimize(bert, provider="auto", cache_dir=cache_dir)


def test_auto_picks_the_cpu_provider_here(bert: spacy.language.Language, cache_dir: Path):
    spacy_accelerate.optimize(bert, provider="auto", cache_dir=cache_dir)
    proxy = spacy_accelerate.accelerated_components(bert)["transformer"]
    assert proxy.session.provider.provider is spacy_accelerate.Provider.CPU


def test_parity_failure_refuses_with_numbers_and_caches_nothing(
    bert: spacy.language.Language, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    convert = BertArchitecture.hf_state_dict.__func__

    def damaged(cls: type, encoder: torch.nn.Module, spec: object) -> dict:
        state = convert(cls, encoder, spec)
        bias = state["encoder.layer.1.output.dense.bias"].clone()
        bias[0] += 0.05  # one feature: a shift of all of them would vanish in the layer norm
        state["encoder.layer.1.output.dense.bias"] = bias
        return state

    monkeypatch.setattr(BertArchitecture, "hf_state_dict", classmethod(damaged))
    before = last_hidden(bert("A sentence to check."))
    with pytest.raises(ConversionError, match=r"largest absolute difference .* > tolerance 0.0001"):
        spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    assert not spacy_accelerate.is_optimized(bert)
    assert spacy_accelerate.list_cached(cache_dir) == []
    assert np.array_equal(before, last_hidden(bert("A sentence to check.")))


def test_training_an_accelerated_pipeline_names_restore(
    bert: spacy.language.Language, cache_dir: Path
):
    spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    doc = bert.make_doc("Training is refused .")
    example = Example.from_dict(doc, {"tags": ["NN", "VBZ", "VBN", "."]})
    with pytest.raises(InferenceOnlyError, match=r"spacy_accelerate.restore\(nlp\)"):
        bert.update([example])
    module = spacy_accelerate.accelerated_components(bert)["transformer"]
    with pytest.raises(InferenceOnlyError, match="restore"):
        module.load_state_dict({})


def test_saving_an_accelerated_pipeline_writes_the_pytorch_weights(
    bert: spacy.language.Language, cache_dir: Path, tmp_path: Path
):
    text = "Saving keeps the original weights ."
    before = last_hidden(bert(text))
    spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    bert.to_disk(tmp_path / "saved")
    off = {"nlp": {"after_pipeline_creation": {"enabled": False}}}
    reloaded = spacy.load(tmp_path / "saved", config=off)
    assert not spacy_accelerate.is_optimized(reloaded)
    assert np.array_equal(before, last_hidden(reloaded(text)))


def test_optimize_twice_and_restore_twice_are_safe(bert: spacy.language.Language, cache_dir: Path):
    spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    assert spacy_accelerate.is_optimized(bert)
    spacy_accelerate.restore(bert)
    spacy_accelerate.restore(bert)
    assert not spacy_accelerate.is_optimized(bert)
    module = bert.get_pipe("transformer").model.get_ref("transformer").shims[0]._model
    assert isinstance(module, CuratedTransformer)


def test_gate_catches_a_graph_that_assumes_trailing_padding(
    bert: spacy.language.Language, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    # ONNX Runtime's default fused attention reads the mask as one length per
    # row; the verification batch has padding inside a row, so that must fail.
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat

    monkeypatch.setattr(AttentionMaskFormat, "AttentionMask", AttentionMaskFormat.MaskIndexEnd)
    with pytest.raises(ConversionError, match="does not match the PyTorch module"):
        spacy_accelerate.optimize(bert, provider="cpu", cache_dir=cache_dir)
    assert not spacy_accelerate.is_optimized(bert)


@pytest.mark.parametrize("provider", ["cpu", "openvino"])
@pytest.mark.parametrize(
    ("sample", "offset"), [("roberta", 2), ("bert", 0), ("st-roberta", 2), ("st-bert", 0)]
)
def test_a_span_past_the_models_positions_is_refused_as_pytorch_refuses_it(
    sample_path: Callable[[str], Path], cache_dir: Path, provider: str, sample: str, offset: int
):
    # spacy-transformers hands over whatever its tokenizer makes when no max length is
    # set; OpenVINO's Gather would read past the position table and annotate silently.
    # RoBERTa's positions start after its padding index (1), BERT's at 0: both are served
    # up to their last position, exactly as far as PyTorch goes.
    nlp = spacy.load(sample_path(sample))
    spacy_accelerate.optimize(nlp, provider, "fp32", cache_dir=cache_dir, warmup=False)
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    longest = proxy.spec.longest_input
    assert longest == proxy.spec.max_position_embeddings - offset
    ids = torch.full((1, longest + 1), 5)
    with torch.no_grad():
        proxy.read_original()(ids[:, :longest])
        with pytest.raises((IndexError, RuntimeError)):  # curated: IndexError, HF: RuntimeError
            proxy.read_original()(ids)
        proxy(ids[:, :longest])
        with pytest.raises(InvalidInputError, match=f"{longest + 1} pieces is longer than"):
            proxy(ids)
