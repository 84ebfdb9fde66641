"""``optimize(nlp, "cuda", "fp16")`` end to end with only the device swapped for the CPU.

Everything of the CUDA path runs: the CUDA graph plan (CUDA fusions, fp16
weights), the fp16 gate, the bucket plan, IO binding with arena buffers,
CUDA-graph ids, warm-up of every bucket, and the proxy inside spaCy, except
that ONNX Runtime executes on its CPU device (it ignores the CUDA provider it
cannot load, which is accepted here instead of refused) and the runner binds
CPU buffers. What this cannot show is the GPU itself: kernels, speed, capture.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
import spacy
import torch
from annotations import run

import spacy_accelerate
from spacy_accelerate.backends.onnxruntime import session as runtime
from spacy_accelerate.backends.onnxruntime.cuda_graphs import GraphBook
from spacy_accelerate.backends.onnxruntime.io_binding import BoundRunner
from spacy_accelerate.backends.onnxruntime.provider_options import import_onnxruntime
from spacy_accelerate.bench.doc_outputs import token_cosines
from spacy_accelerate.bench.side_by_side import agreement
from spacy_accelerate.export.onnx import MODEL_FILE
from spacy_accelerate.options.config import Provider
from spacy_accelerate.pipeline.components import find_transformer_components
from spacy_accelerate.pipeline.shim import find_span_settings

ort = import_onnxruntime()
BUCKETS = (1, 2, 4, 8)


def _cpu_device_runner(session, ort_module, config, layout) -> BoundRunner:
    return BoundRunner(
        session,
        ort_module,
        device=torch.device("cpu"),
        plan=layout.buckets,
        padding_idx=layout.padding_idx,
        graphs=GraphBook(enabled=config.gpu.cuda_graph, plan=layout.buckets),
    )


@pytest.fixture()
def cuda_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    listed = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: listed)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runtime, "check_active", lambda session, provider: None)
    monkeypatch.setitem(runtime._RUNNERS, Provider.CUDA, _cpu_device_runner)


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["plain", "cuda-graphs"])
def test_the_cuda_fp16_path_annotates_like_pytorch(
    sample_path: Callable[[str], Path],
    ewt_texts: list[str],
    cache_dir: Path,
    cuda_on_the_cpu,
    cuda_graph: bool,
):
    texts = ewt_texts[:48]
    nlp = spacy.load(sample_path("roberta"))
    expected = run(nlp, texts, batch_size=16)
    gpu = spacy_accelerate.GpuOptions(batch_buckets=BUCKETS, cuda_graph=cuda_graph)
    spacy_accelerate.optimize(nlp, "cuda", "fp16", cache_dir=cache_dir, gpu=gpu)

    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    runner = proxy.session.runner
    assert isinstance(runner, BoundRunner) and proxy.session.provider.provider is Provider.CUDA
    spans = find_span_settings(find_transformer_components(nlp)[0])
    assert runner.plan.batch_sizes == BUCKETS and runner.plan.window == spans.window
    parity = proxy.exported.parity
    assert parity.gate.min_cosine == 0.999 and parity.worst_cosine >= 0.999
    # fp16 is a lossy plan: the pipeline's annotations of the calibration texts judged it.
    judged = proxy.exported.record.agreement
    assert judged is not None
    assert {a.value for a, _ in judged.rates} >= {"tag", "dep", "ent"}
    assert all(rate.lower >= 0.99 for _, rate in judged.rates), judged.describe()
    model = onnx.load(str(proxy.exported.path / MODEL_FILE))
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
    warm = len(runner.plan.warm_shapes())
    assert runner.graphs.captured == (warm if cuda_graph else 0)

    actual = run(nlp, texts, batch_size=16)
    pairs = zip(expected, actual, strict=True)
    cosines = torch.cat([torch.from_numpy(token_cosines(e, a)) for e, a in pairs])
    assert float(cosines.min()) >= 0.999
    rates = agreement(expected, actual)
    for attribute in ("tag", "dep", "ent"):
        assert rates.rate(attribute) >= 0.995, (attribute, rates.same, rates.tokens)
    if cuda_graph:  # the pipeline's batches replayed the warm-up's graphs
        assert runner.graphs.captured == warm and max(runner.graphs.runs.values()) > 1
