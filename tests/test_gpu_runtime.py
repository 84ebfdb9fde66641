"""The GPU runtime, tested where no GPU is needed.

What runs on a GPU but can be checked without one is checked here on the
CPU: the fp16 graph itself (a graph-level conversion, run by ONNX Runtime's
CPU provider), bucket selection, padding and unpadding, IO binding through
ONNX Runtime's CPU device, the exact provider options built for CUDA and
TensorRT, CUDA-graph bookkeeping, TensorRT's engine folders in the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import spacy
import torch
from annotations import disagreements, max_abs_diff, run

import spacy_accelerate
from spacy_accelerate.architectures import detect_architecture
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.backends.base import ServeRequest
from spacy_accelerate.backends.onnxruntime.cuda_graphs import (
    FIRST_GRAPH_ID,
    GRAPH_ID_OPTION,
    NO_GRAPH,
    GraphBook,
)
from spacy_accelerate.backends.onnxruntime.graph import graph_plan, optimize_graph
from spacy_accelerate.backends.onnxruntime.io_binding import BoundRunner
from spacy_accelerate.backends.onnxruntime.provider_options import (
    OnnxRuntimeLayout,
    execution_providers,
    import_onnxruntime,
)
from spacy_accelerate.backends.onnxruntime.session import EncoderSession, HostRunner
from spacy_accelerate.backends.registry import check_provider, session_layout
from spacy_accelerate.cache.store import ModelCache
from spacy_accelerate.errors import InvalidInputError, InvalidOptionError
from spacy_accelerate.export.onnx import MODEL_FILE, export_onnx
from spacy_accelerate.options.config import Precision, Provider
from spacy_accelerate.options.gate import Gate
from spacy_accelerate.options.gpu import GpuOptions, TensorRTOptions
from spacy_accelerate.options.request import build_config
from spacy_accelerate.pipeline.components import find_transformer_components
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.provision.get_or_export import get_or_export
from spacy_accelerate.runtime.buckets import BucketPlan, default_batch_buckets, pad_into, unpad
from spacy_accelerate.verify.parity import check_parity
from spacy_accelerate.verify.verification import random_rows

ort = import_onnxruntime()


def encoder_of(nlp: spacy.language.Language):
    module = find_shim(find_transformer_components(nlp)[0]).read_pytorch_module()
    return module, detect_architecture(module)


def cpu_layout(spec, plan: BucketPlan) -> OnnxRuntimeLayout:
    return OnnxRuntimeLayout(spec.input_names, spec.padding_idx, plan)


# ----------------------------------------------------------------------------- fp16


@pytest.fixture(scope="module", params=["minilm", "roberta"])
def fp16_model(request, sample_path: Callable[[str], Path], tmp_path_factory):
    """The graph the CUDA provider gets at fp16, written for a sample pipeline."""
    nlp = spacy.load(sample_path(request.param))
    module, detected = encoder_of(nlp)
    folder = tmp_path_factory.mktemp(f"fp16-{request.param}")
    path = folder / MODEL_FILE
    hf_model = detected.architecture.to_hugging_face(detected.encoder, detected.spec)
    export_onnx(hf_model, detected.spec, path, opset=17)
    optimize_graph(path, path, detected.spec, graph_plan(Provider.CUDA, Precision.FP16))
    return module, detected, path


def test_the_fp16_graph_is_half_precision_with_fp32_inputs_and_outputs(fp16_model):
    _module, detected, path = fp16_model
    model = onnx.load(str(path))
    weights = [init for init in model.graph.initializer if len(init.dims) == 2]
    halves = [init for init in weights if init.data_type == onnx.TensorProto.FLOAT16]
    assert weights and len(halves) >= 0.9 * len(weights)
    assert {i.type.tensor_type.elem_type for i in model.graph.input} == {onnx.TensorProto.INT64}
    outputs = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    assert set(outputs) == set(detected.spec.output_names)
    assert set(outputs.values()) == {onnx.TensorProto.FLOAT}


def test_the_fp16_graph_on_the_cpu_provider_keeps_token_cosine(fp16_model):
    module, detected, path = fp16_model
    config = build_config("cpu", "fp32")
    plan = BucketPlan.for_pipeline(config.gpu, detected.spec, 128, 8)
    session = EncoderSession(path, check_provider(config), config, cpu_layout(detected.spec, plan))
    report = check_parity(
        module,
        detected,
        session,
        gate=Gate(min_cosine=0.999),
        batches=[random_rows(detected.spec, 128)],
    )
    assert report.worst_cosine >= 0.999
    # Half precision really happened: fp32 would be within 1e-5.
    assert report.worst > 1e-4


def test_gpu_graph_plans():
    assert graph_plan(Provider.CUDA, Precision.FP16).float16
    assert graph_plan(Provider.CUDA, Precision.FP32).for_gpu
    assert not graph_plan(Provider.CUDA, Precision.FP32).float16
    # TensorRT takes the plain graph: its fp16 is a builder flag.
    assert not graph_plan(Provider.TENSORRT, Precision.FP16).fuse
    cpu = graph_plan(Provider.CPU, Precision.FP32)
    assert cpu.fuse and not cpu.for_gpu and not cpu.float16


# --------------------------------------------------------------------------- buckets


def test_default_batch_buckets_are_powers_of_two_up_to_the_span_batch():
    assert default_batch_buckets(384) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert default_batch_buckets(24) == (1, 2, 4, 8, 16, 24)
    assert default_batch_buckets(1) == (1,)


def test_bucket_selection_and_chunks():
    plan = BucketPlan(batch_sizes=(1, 2, 4, 8), sequence_multiple=16, window=128, longest=512)
    assert [plan.batch_for(rows) for rows in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert [plan.sequence_for(n) for n in (1, 16, 17, 128, 129, 505, 512)] == [
        16,
        16,
        32,
        128,
        144,
        512,
        512,
    ]
    assert [(s.start, s.stop) for s in plan.chunks(19)] == [(0, 8), (8, 16), (16, 19)]
    assert plan.sequence_sizes == (16, 32, 48, 64, 80, 96, 112, 128)
    assert len(plan.warm_shapes()) == 4 * 8 and plan.arena_shape == (8, 128)
    assert plan.in_window((8, 128)) and not plan.in_window((1, 144))
    assert plan.profile_shapes() == ((1, 16), (8, 128), (8, 512))
    with pytest.raises(InvalidInputError, match="513 pieces is longer than the 512 positions"):
        plan.sequence_for(513)


def test_the_sequence_bucket_never_passes_the_model_limit():
    plan = BucketPlan(batch_sizes=(4,), sequence_multiple=16, window=130, longest=130)
    assert plan.sequence_for(129) == 130 and plan.sequence_sizes[-1] == 130


def test_pad_and_unpad_round_trip_and_unpad_copies():
    source = torch.arange(6, dtype=torch.int64).reshape(2, 3) + 1
    buffer = torch.empty(4, 8, dtype=torch.int64)
    pad_into(buffer, source, fill=-7)
    assert torch.equal(buffer[:2, :3], source)
    assert int((buffer == -7).sum()) == 4 * 8 - 6
    out = torch.randn(4, 8, 5)
    kept = unpad(out, 2, 3)
    assert kept.shape == (2, 3, 5) and torch.equal(kept, out[:2, :3])
    out.zero_()  # the next batch overwrites the bucket's buffer
    assert kept.abs().sum() > 0
    assert unpad(torch.ones(4, 5), 2, 3).shape == (2, 5)


# ------------------------------------------------------------------------ IO binding


@pytest.fixture(scope="module")
def roberta_session(sample_path: Callable[[str], Path], tmp_path_factory):
    nlp = spacy.load(sample_path("roberta"))
    module, detected = encoder_of(nlp)
    config = build_config("cpu", "fp32", cache_dir=tmp_path_factory.mktemp("io-binding"))
    request = ServeRequest.plain(module, detected, config, check_provider(config), 64)
    session, _ = get_or_export(request, ModelCache(config.cache_dir))
    return detected.spec, session


def bound_runner(spec, session, plan: BucketPlan, *, graphs: bool = False) -> BoundRunner:
    return BoundRunner(
        session._session,
        ort,
        device=torch.device("cpu"),
        plan=plan,
        padding_idx=spec.padding_idx,
        graphs=GraphBook(enabled=graphs, plan=plan),
    )


def random_feeds(spec, rows: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(spec.padding_idx + 1, spec.vocab_size, (rows, length), generator=generator)
    for row in range(rows):  # rows of mixed lengths, padded like spaCy pads them
        ids[row, max(1, length - 3 * row) :] = spec.padding_idx
    return EncoderInputs.from_ids(ids.numpy(), spec.padding_idx).as_torch(spec)


@pytest.mark.parametrize(("rows", "length"), [(1, 1), (3, 37), (4, 64), (11, 20), (2, 90)], ids=str)
def test_io_binding_matches_the_host_path(roberta_session, rows: int, length: int):
    spec, session = roberta_session
    plan = BucketPlan(
        batch_sizes=(1, 2, 4), sequence_multiple=16, window=64, longest=spec.longest_input
    )
    runner = bound_runner(spec, session, plan)
    feeds = random_feeds(spec, rows, length, seed=rows * 100 + length)
    names = spec.hidden_state_names
    expected = HostRunner(session._session, session._ort).run(feeds, names)
    actual = runner.run(feeds, names)
    mask = feeds["attention_mask"].bool()
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape == (rows, length, spec.hidden_width)
        assert float((a[mask] - e[mask]).abs().max()) <= 1e-5


def test_bucket_buffers_keep_their_addresses_and_share_one_arena(roberta_session):
    spec, session = roberta_session
    plan = BucketPlan(
        batch_sizes=(1, 2, 4), sequence_multiple=16, window=64, longest=spec.longest_input
    )
    runner = bound_runner(spec, session, plan)
    last = spec.hidden_state_names[-1:]
    small, large = runner.buffers((1, 16), last), runner.buffers((4, 64), last)
    assert runner.buffers((1, 16), last) is small  # the same binding, every batch
    for name in spec.input_names:
        assert small.inputs[name].data_ptr() == large.inputs[name].data_ptr()
    assert small.outputs[last[0]].data_ptr() == large.outputs[last[0]].data_ptr()
    first = runner.run(random_feeds(spec, 2, 30, seed=1), last)[0]
    padded = runner.buffers((2, 32), last).inputs["attention_mask"]
    two = runner.run(random_feeds(spec, 3, 30, seed=1), last)[0]
    assert two.shape[0] == 3
    mask = runner.buffers((4, 32), last).inputs["attention_mask"]
    # The padding row sees one piece (no softmax over nothing), the padding columns none.
    assert mask[3, 0] == 1 and int(mask[3, 1:].sum()) == 0 and int(mask[:3, 30:].sum()) == 0
    assert padded.shape == (2, 32)
    kept = first.clone()
    runner.run(random_feeds(spec, 2, 30, seed=2), last)  # same bucket, new text
    assert torch.equal(first, kept)  # what spaCy keeps is never overwritten
    # A shape past the window runs on buffers of its own, not kept.
    beyond = runner.buffers((4, 80), last)
    assert beyond.inputs["input_ids"].data_ptr() != large.inputs["input_ids"].data_ptr()
    assert beyond.graph_id == NO_GRAPH


def test_an_accelerated_pipeline_through_io_binding_annotates_like_pytorch(
    sample_path: Callable[[str], Path], ewt_texts: list[str], cache_dir: Path
):
    texts = ewt_texts[:24]
    nlp = spacy.load(sample_path("roberta"))
    expected = run(nlp, texts, batch_size=8)
    spacy_accelerate.optimize(nlp, "cpu", "fp32", cache_dir=cache_dir)
    proxy = spacy_accelerate.accelerated_components(nlp)["transformer"]
    plan = BucketPlan(
        batch_sizes=(1, 2, 4, 8), sequence_multiple=16, window=128, longest=proxy.spec.longest_input
    )
    runner = bound_runner(proxy.spec, proxy.session, plan, graphs=True)
    proxy.session.runner = runner
    actual = run(nlp, texts, batch_size=8)
    assert max_abs_diff(expected, actual) <= 1e-4
    assert disagreements(expected, actual, nlp) == []
    assert runner.graphs.ids and sum(runner.graphs.runs.values()) > 0


# ----------------------------------------------------------------------- CUDA graphs


def test_graph_ids_are_stable_per_bucket_and_outputs():
    plan = BucketPlan(batch_sizes=(1, 8), sequence_multiple=16, window=32, longest=512)
    book = GraphBook(enabled=True, plan=plan)
    last, every = ("layer_2",), ("embeddings", "layer_1", "layer_2")
    first = book.graph_id((1, 16), last)
    assert first == FIRST_GRAPH_ID == 1  # 0 is what a run without the option replays
    assert book.graph_id((1, 16), last) == first
    assert len({first, book.graph_id((1, 16), every), book.graph_id((8, 32), last)}) == 3
    assert book.graph_id((8, 48), last) == NO_GRAPH  # past the window: no graph
    assert GraphBook(enabled=False, plan=plan).graph_id((1, 16), last) == NO_GRAPH
    assert book.record_run(first) and not book.record_run(first)  # capture, then replay
    assert not book.record_run(NO_GRAPH) and book.captured == 1
    options = book.run_options(ort, first)
    assert options.get_run_config_entry(GRAPH_ID_OPTION) == str(first)
    # With graphs on, a run without a graph must say so: no option would mean graph 0.
    assert book.run_options(ort, NO_GRAPH).get_run_config_entry(GRAPH_ID_OPTION) == "-1"
    assert GraphBook(enabled=False, plan=plan).run_options(ort, NO_GRAPH) is None


def test_every_warm_bucket_gets_its_own_graph(roberta_session):
    spec, session = roberta_session
    plan = BucketPlan(
        batch_sizes=(1, 2), sequence_multiple=32, window=64, longest=spec.longest_input
    )
    runner = bound_runner(spec, session, plan, graphs=True)
    last = spec.hidden_state_names[-1:]
    shapes = runner.plan.warm_shapes()  # what a GPU session warms up
    for rows, length in shapes:
        runner.run(random_feeds(spec, rows, length, seed=rows + length), last)
    assert runner.graphs.captured == len(plan.warm_shapes()) == 4
    assert sorted(runner.graphs.ids.values()) == [1, 2, 3, 4]
    runner.run(random_feeds(spec, 2, 50, seed=3), last)  # a replay, not a new capture
    assert runner.graphs.captured == 4 and max(runner.graphs.runs.values()) == 2
    past = runner.buffers((2, 96), last)  # past the window: runs, explicitly without a graph
    assert past.run_options.get_run_config_entry(GRAPH_ID_OPTION) == str(NO_GRAPH)


# ------------------------------------------------------------------ provider options


@pytest.fixture()
def layout() -> OnnxRuntimeLayout:
    plan = BucketPlan(
        batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128), sequence_multiple=16, window=128, longest=512
    )
    return OnnxRuntimeLayout(
        input_names=("input_ids", "attention_mask", "token_type_ids"),
        padding_idx=1,
        buckets=plan,
        engine_dir=Path("/cache/tensorrt/h200/abc"),
        timing_dir=Path("/cache/tensorrt/h200/timing"),
    )


def test_cuda_provider_options(layout: OnnxRuntimeLayout):
    config = build_config("cuda", "fp16", device_id=1, gpu={"cuda_graph": True})
    assert execution_providers(config, layout) == [
        (
            "CUDAExecutionProvider",
            {
                "device_id": "1",
                "do_copy_in_default_stream": "1",
                "use_tf32": "1",
                "enable_cuda_graph": "1",
            },
        )
    ]
    # An fp32 model gets true fp32 products, not TF32's 10-bit mantissas.
    fp32 = dict(execution_providers(build_config("cuda", "fp32"), layout))
    assert fp32["CUDAExecutionProvider"]["use_tf32"] == "0"
    assert fp32["CUDAExecutionProvider"]["enable_cuda_graph"] == "0"


def test_tensorrt_provider_options_with_one_profile_over_every_bucket(layout: OnnxRuntimeLayout):
    trt = TensorRTOptions(builder_optimization_level=5, max_workspace_size=2 * 1024**3)
    config = build_config("tensorrt", "fp16", gpu=GpuOptions(tensorrt=trt))
    names = "input_ids:{0},attention_mask:{0},token_type_ids:{0}"
    assert execution_providers(config, layout) == [
        (
            "TensorrtExecutionProvider",
            {
                "device_id": "0",
                "trt_fp16_enable": "1",
                "trt_max_workspace_size": str(2 * 1024**3),
                "trt_builder_optimization_level": "5",
                "trt_profile_min_shapes": names.format("1x16"),
                "trt_profile_opt_shapes": names.format("128x128"),
                "trt_profile_max_shapes": names.format("128x512"),
                "trt_engine_cache_enable": "1",
                "trt_engine_cache_path": "/cache/tensorrt/h200/abc",
                "trt_timing_cache_enable": "1",
                "trt_timing_cache_path": "/cache/tensorrt/h200/timing",
            },
        ),
        (
            "CUDAExecutionProvider",
            {
                "device_id": "0",
                "do_copy_in_default_stream": "1",
                "use_tf32": "1",
                "enable_cuda_graph": "0",
            },
        ),
    ]
    fp32 = dict(execution_providers(build_config("tensorrt", "fp32"), layout))
    assert fp32["TensorrtExecutionProvider"]["trt_fp16_enable"] == "0"
    no_caches = GpuOptions(tensorrt=TensorRTOptions(engine_cache=False, timing_cache=False))
    bare = dict(execution_providers(build_config("tensorrt", "fp16", gpu=no_caches), layout))
    assert not any("cache" in key for key in bare["TensorrtExecutionProvider"])


def test_cuda_graphs_are_refused_with_tensorrt():
    with pytest.raises(InvalidOptionError, match="single CUDA graph per session"):
        build_config("tensorrt", "fp16", gpu=GpuOptions(cuda_graph=True))


def test_the_cpu_provider_gets_no_gpu_options(layout: OnnxRuntimeLayout):
    assert execution_providers(build_config("cpu", "int8"), layout) == [
        ("CPUExecutionProvider", {})
    ]


def test_tensorrt_engines_live_beside_the_entries_and_go_with_them(tmp_path: Path, roberta_session):
    cache = ModelCache(tmp_path)
    key = "a" * 64
    config = build_config("tensorrt", "fp16", cache_dir=tmp_path)
    spec = roberta_session[0]
    plan = BucketPlan.for_pipeline(config.gpu, spec, 32, 8)
    layout = session_layout(config, spec, plan, cache, key)
    assert layout.engine_dir.parent.parent.parent == tmp_path / "tensorrt"
    assert layout.engine_dir.parent.name == key and layout.timing_dir.name == "timing"
    # Engines are only valid for the settings they were built with: other settings,
    # another folder.
    slower = GpuOptions(tensorrt=TensorRTOptions(builder_optimization_level=5))
    other = build_config("tensorrt", "fp16", cache_dir=tmp_path, gpu=slower)
    assert session_layout(other, spec, plan, cache, key).engine_dir != layout.engine_dir
    fp32 = build_config("tensorrt", "fp32", cache_dir=tmp_path)
    assert session_layout(fp32, spec, plan, cache, key).engine_dir != layout.engine_dir
    wider = BucketPlan.for_pipeline(config.gpu, spec, 64, 8)
    assert session_layout(config, spec, wider, cache, key).engine_dir != layout.engine_dir
    assert session_layout(config, spec, plan, cache, key).engine_dir == layout.engine_dir
    (layout.engine_dir / "model.engine").write_bytes(b"engine")
    assert cache.entries() == []  # never mistaken for a cache entry
    # The engine lock lives with the other locks, so removing engines never removes it.
    with cache.derived_lock(layout.engine_dir):
        locks = list((tmp_path / ".locks").glob("tensorrt-*.lock"))
    assert not cache.evict(key) and not layout.engine_dir.exists()
    assert locks and all(lock.exists() for lock in locks)
    layout = session_layout(config, spec, plan, cache, key)  # made again, as a build does
    assert layout.engine_dir.exists()
    mine = tmp_path / "tensorrt" / "my-notes"
    mine.mkdir()
    (mine / "keep.txt").write_text("not the cache's")
    cache.clear()
    assert not layout.engine_dir.exists() and not layout.timing_dir.exists()
    assert (mine / "keep.txt").exists()  # clear() removes what it made, nothing else
    assert session_layout(build_config("cuda", "fp16"), spec, plan, cache, key).engine_dir is None


def test_tensorrt_without_caches_or_a_writable_cache_still_runs(
    tmp_path: Path, roberta_session, caplog: pytest.LogCaptureFixture
):
    spec, key = roberta_session[0], "b" * 64
    off = GpuOptions(tensorrt=TensorRTOptions(engine_cache=False, timing_cache=False))
    config = build_config("tensorrt", "fp16", cache_dir=tmp_path, gpu=off)
    plan = BucketPlan.for_pipeline(config.gpu, spec, 32, 8)
    layout = session_layout(config, spec, plan, ModelCache(tmp_path), key)
    assert layout.engine_dir is None and layout.timing_dir is None
    assert not (tmp_path / "tensorrt").exists()
    (tmp_path / "file").write_text("a file where the cache should be")
    unwritable = ModelCache(tmp_path / "file")
    trt = build_config("tensorrt", "fp16")
    with caplog.at_level("WARNING", logger="spacy_accelerate"):
        layout = session_layout(trt, spec, plan, unwritable, key)
    assert layout.engine_dir is None and "will not be cached" in caplog.text


# ---------------------------------------------------------------- options and gates


def test_default_gates_follow_provider_and_precision():
    assert build_config("cpu", "fp32").gate() == Gate(max_abs_diff=1e-4)
    assert build_config("cuda", "fp32").gate() == Gate(max_abs_diff=1e-3)  # GPU kernels
    assert build_config("tensorrt", "fp16").gate() == Gate(min_cosine=0.999)
    assert build_config("cpu", "int8").gate() == Gate(min_cosine=0.99)
    assert build_config("cuda", "fp16", min_cosine=0.9995).gate() == Gate(min_cosine=0.9995)
    on_cpu = build_config("tensorrt", "fp16", fallback=True).served_by(Provider.CPU)
    assert (on_cpu.provider, on_cpu.precision, on_cpu.gate()) == (
        Provider.CPU,
        Precision.FP32,
        Gate(max_abs_diff=1e-4),
    )


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ({"batch_buckets": [0, 8]}, "batch_buckets must be positive"),
        ({"sequence_multiple": 0}, "sequence_multiple must be a positive integer"),
        ({"cuda_graphs": True}, r"Unknown GPU option\(s\) \['cuda_graphs'\]"),
        ({"tensorrt": {"builder_optimization_level": 9}}, "from 0 to 5"),
        ({"tensorrt": {"workspace": 1}}, r"Unknown TensorRT option\(s\) \['workspace'\]"),
        ({"tensorrt": {"max_workspace_size": -1}}, "positive number of bytes"),
        ("fast", "gpu must be a spacy_accelerate.GpuOptions"),
        ({"cuda_graph": "false"}, "cuda_graph must be True or False"),
        ({"tensorrt": {"engine_cache": 0}}, "engine_cache must be True or False"),
        ({"tensorrt": 5}, "tensorrt must be a spacy_accelerate.TensorRTOptions"),
    ],
)
def test_bad_gpu_options_are_refused(gpu, message: str):
    with pytest.raises(InvalidOptionError, match=message):
        build_config("cuda", "fp16", gpu=gpu)


def test_bad_device_id_is_refused():
    with pytest.raises(InvalidOptionError, match="device_id must be a CUDA device index"):
        build_config("cuda", "fp16", device_id=-1)


def test_gpu_options_round_trip_as_plain_values():
    options = GpuOptions(
        cuda_graph=True, batch_buckets=(8, 1, 8), tensorrt=TensorRTOptions(3, 1024)
    )
    assert options.batch_buckets == (1, 8)
    again = build_config("cuda", "fp16", device_id=2, gpu=options.as_dict()).gpu
    assert again == GpuOptions(
        device_id=2, cuda_graph=True, batch_buckets=(1, 8), tensorrt=TensorRTOptions(3, 1024)
    )


def test_the_top_level_device_id_wins_when_given():
    on_three = GpuOptions(device_id=3)
    assert build_config("cuda", "fp16", gpu=on_three).gpu.device_id == 3
    assert build_config("cuda", "fp16", gpu=on_three, device_id=0).gpu.device_id == 0
    assert build_config("cuda", "fp16", gpu={"device_id": 3}, device_id=1).gpu.device_id == 1
    assert build_config("cuda", "fp16").gpu.device_id == 0


def test_fp16_parity_uses_the_real_pytorch_outputs(fp16_model):
    """The gate judges against the module: a broken fp16 graph (weights zeroed) fails."""
    module, detected, path = fp16_model
    broken = path.with_name("broken.onnx")
    model = onnx.load(str(path))
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT16 and len(init.dims) == 2:
            array = onnx.numpy_helper.to_array(init)
            init.CopyFrom(onnx.numpy_helper.from_array(np.zeros_like(array), init.name))
            break
    onnx.save(model, str(broken))
    config = build_config("cpu", "fp32")
    plan = BucketPlan.for_pipeline(config.gpu, detected.spec, 128, 8)
    session = EncoderSession(
        broken, check_provider(config), config, cpu_layout(detected.spec, plan)
    )
    with pytest.raises(spacy_accelerate.AccuracyError, match="token cosine"):
        check_parity(
            module,
            detected,
            session,
            gate=Gate(min_cosine=0.999),
            batches=[random_rows(detected.spec, 128)],
        )
