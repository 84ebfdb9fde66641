"""The OpenVINO runtime on the CPU: Intel's AMX and VNNI units, bf16 and int8.

The exported encoder is converted once to OpenVINO's IR (``model.xml`` and
``model.bin``, stored in the same cache entry as any other export) and
compiled for the CPU with the precision hint of the request: ``f32``, or
``bf16`` where the CPU has bf16 arithmetic (AVX512_BF16 or AMX); an int8
model's unquantized part gets ``bf16`` there too (:func:`precision_hint`).
OpenVINO keeps compiled blobs under the cache dir, so a warm start skips
compilation.
Infer requests are made per thread (one request may not run twice at once)
and the thread count is the process's CPU affinity, as for ONNX Runtime.

OpenVINO is run directly, not through ONNX Runtime's OpenVINO provider:
both ran at the same speed (measured:
``benchmarks/results/openvino_ep-trf-base-8x128.json``), the ``openvino``
wheel installs next to ``onnxruntime`` (``onnxruntime-openvino`` replaces
it), and the direct API is what NNCF quantizes. The model keeps dynamic batch
and length axes: static models per bucket were slower on the CPU
(measured: ``benchmarks/results/openvino_shapes-*.json``, ``docs/openvino.md``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.backends.openvino.mapped_weights import FileId, file_ids, give_back
from spacy_accelerate.cpu_features import (
    BF16_FLAGS,
    INT8_KERNEL_FLAGS,
    CpuFeatures,
    cpu_features,
    is_this_cpu,
)
from spacy_accelerate.errors import Advice, OneOf, PrecisionUnavailableError
from spacy_accelerate.options.config import OptimizeConfig, Precision
from spacy_accelerate.runtime.cancellation import runtime_call
from spacy_accelerate.runtime.length_groups import run_by_length
from spacy_accelerate.runtime.providers import ResolvedProvider, import_runtime
from spacy_accelerate.runtime.session import SessionLayout, cpu_warm_shapes, host_arrays
from spacy_accelerate.runtime.working_memory import releases_memory
from spacy_accelerate.verify.plan_search import SEARCH_RULE

if TYPE_CHECKING:
    from spacy_accelerate.backends.base import ExportedGraph

#: The IR files of an OpenVINO cache entry.
IR_FILE = "model.xml"
IR_WEIGHTS = "model.bin"

#: OpenVINO's CPU precision hint per precision served (int8: :func:`precision_hint`).
PRECISION_HINTS: dict[Precision, str] = {Precision.FP32: "f32", Precision.BF16: "bf16"}


#: The group size of dynamic int8's run-time quantization of the activations
#: (:class:`.quantize.DynamicInt8`).
DYNAMIC_INT8_GROUP_SIZE = 128


def float_part_hints() -> tuple[str, ...]:
    """The hints the float layers of an int8 plan are tried in, in order:
    :func:`precision_hint`'s (bf16 where the CPU has it, the faster of the two for the
    same token cosine), then ``f32``, because bf16's own error can be what fails the
    gate."""
    first = precision_hint(Precision.INT8)
    return (first,) if first == "f32" else (first, "f32")


def dynamic_quantization_runs(hint: str, group_size: int, cpu: CpuFeatures | None = None) -> bool:
    """Whether OpenVINO's CPU plugin quantizes the activations of a MatMul with int8
    weights at run time, compiled with ``hint`` and ``DYNAMIC_QUANTIZATION_GROUP_SIZE``
    ``group_size`` on ``cpu`` (this one by default).

    Read from the plugin's source (``useDynamicQuantizationImpl`` in
    ``src/plugins/intel_cpu/src/nodes/executors/dnnl/dnnl_fullyconnected_primitive.cpp``,
    openvinotoolkit/openvino): the group must be a non-zero multiple of 16, the CPU must
    have AVX-VNNI or AVX-512 VNNI (``mayiuse(avx2_vnni) || mayiuse(avx512_core_vnni)``),
    and the MatMul's input must be f32. Under the bf16 hint on a CPU with bf16 units the
    input is bf16, so the int8 weights are only decompressed to bf16 (seen on an AMX
    Xeon: groups of 0, 32 and 128 gave the same outputs). The compiled runtime model does
    not show it (the same ``FullyConnected`` node either way), hence this rule."""
    cpu = cpu or cpu_features()
    bf16 = "BF16" in cpu_capabilities(cpu)
    effective = hint if bf16 else "f32"  # a bf16 hint without bf16 units runs f32
    return cpu.x86 and cpu.vnni and group_size > 0 and group_size % 16 == 0 and effective == "f32"


def dynamic_int8_hints(group_size: int = DYNAMIC_INT8_GROUP_SIZE) -> tuple[str, ...]:
    """The hints dynamic int8 is tried with: ``f32``, and only where its activations are
    really quantized at run time (:func:`dynamic_quantization_runs`). Elsewhere it would
    be int8 weights with float arithmetic, no faster than the float model, so it is left
    out."""
    return ("f32",) if dynamic_quantization_runs("f32", group_size) else ()


def int8_plan_kinds() -> list[str]:
    """The kinds of int8 plan accuracy control tries, in its order, with dynamic int8's
    settings and what each candidate's speed is held against (part of the cache key: an
    entry chosen among other plans, or without the speed gate, is not reused)."""
    group = DYNAMIC_INT8_GROUP_SIZE
    dynamic = [f"dynamic int8, groups of {group}, {hint}" for hint in dynamic_int8_hints()]
    static = [
        "static int8 (statistics on unpadded rows)",
        "static int8, feed-forward outputs float",
    ]
    return [*static, *dynamic, "float layers", f"faster than {speed_baseline()}", SEARCH_RULE]


def speed_baseline() -> str:
    """The float plan an int8 plan must beat to be served: bf16 where the CPU has bf16
    units, fp32 elsewhere."""
    return "bf16" if "BF16" in cpu_capabilities() else "fp32"


#: What installs OpenVINO (and NNCF, for its int8).
#: The extra of spacy-accelerate that installs OpenVINO (and NNCF, for int8).
EXTRA = "openvino"
INSTALL_HINT = f"pip install 'spacy-accelerate[{EXTRA}]'  (installs openvino and nncf)"


def import_openvino() -> ModuleType:
    return import_runtime("openvino", "OpenVINO", INSTALL_HINT)


#: The CPU flags that change what OpenVINO compiles for int8 and bf16 (part of its key).
KERNEL_FLAGS = INT8_KERNEL_FLAGS | {"avx512dq"} | BF16_FLAGS


def cpu_capabilities(cpu: CpuFeatures | None = None) -> frozenset[str]:
    """What OpenVINO's CPU plugin can do on ``cpu`` (this one by default): ``FP32``,
    ``BF16``, ``INT8``, ... as the plugin reports it on this machine (empty without
    OpenVINO); for a simulated CPU, what the plugin reports where those flags are
    (bf16 where it has bf16 units)."""
    cpu = cpu or cpu_features()
    if is_this_cpu(cpu):
        return _plugin_capabilities()
    return frozenset({"FP32", "INT8", *(["BF16"] if cpu.bf16 else [])})


@functools.cache
def _plugin_capabilities() -> frozenset[str]:
    if importlib.util.find_spec("openvino") is None:
        return frozenset()
    core = import_openvino().Core()
    return frozenset(str(item) for item in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def check_precision(precision: Precision) -> None:
    """bf16 only where the CPU computes in bf16; say which instructions are missing."""
    if precision is Precision.BF16 and "BF16" not in cpu_capabilities():
        raise PrecisionUnavailableError(
            Advice("precision", "bf16"),
            " needs a CPU with bf16 arithmetic (AVX512_BF16 or AMX-BF16), which this CPU does "
            "not have. Use ",
            Advice("precision", OneOf(("fp32", "int8"))),
            ", or pass ",
            Advice("fallback", True),
            " to be served fp32 by ONNX Runtime here.",
        )


def precision_hint(precision: Precision) -> str:
    """OpenVINO's inference precision for ``precision`` on this CPU.

    An int8 model's quantized MatMuls run in int8 whatever the hint; the hint sets
    what the rest runs in, including the layers accuracy control left in float.
    Those run in bf16 where OpenVINO's CPU plugin reports ``BF16`` (AVX512_BF16 and
    AMX-BF16 among what it counts): float layers run faster in bf16 than in f32, with
    the same mean token cosine to PyTorch, and the all-int8 model's speed does not
    change (measured: ``docs/openvino.md``, "The int8 search"). This is where accuracy
    control starts; a plan's IR records the hint it was judged with
    (:func:`compile_settings`), and this one is part of the cache key
    (:func:`openvino_key`)."""
    if precision is Precision.INT8:
        return "bf16" if "BF16" in cpu_capabilities() else "f32"
    return PRECISION_HINTS[precision]


#: Where the IR of an int8 plan records the hint its float part was judged in:
#: :func:`precision_hint`'s, or ``f32`` (accuracy control's fallback).
FLOAT_LAYERS_RT_INFO = ["spacy_accelerate", "float_layers_precision"]

#: Where the IR of a dynamic int8 plan records the group size its activations are
#: quantized in at run time (OpenVINO's ``DYNAMIC_QUANTIZATION_GROUP_SIZE``).
DYNAMIC_QUANTIZATION_RT_INFO = ["spacy_accelerate", "dynamic_quantization_group_size"]


def compile_settings(model: Any, precision: Precision) -> dict[str, Any]:
    """The plugin settings that make ``model`` (an IR read by OpenVINO) compute as it
    was judged, read from what its int8 plan recorded: the hint (:func:`precision_hint`
    where nothing is recorded) and, for a dynamic int8 plan, the group size of its
    activations' run-time quantization (not OpenVINO's own default, which runs slower:
    see :class:`.quantize.DynamicInt8`). Kept in the IR, so a warm start compiles the
    model exactly as it was judged."""
    recorded = precision is Precision.INT8 and model.has_rt_info(FLOAT_LAYERS_RT_INFO)
    hint = model.get_rt_info(FLOAT_LAYERS_RT_INFO).astype(str) if recorded else None
    settings: dict[str, Any] = {"INFERENCE_PRECISION_HINT": hint or precision_hint(precision)}
    if precision is Precision.INT8 and model.has_rt_info(DYNAMIC_QUANTIZATION_RT_INFO):
        group = model.get_rt_info(DYNAMIC_QUANTIZATION_RT_INFO).astype(int)
        settings["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = group
    return settings


def cpu_slug() -> str:
    """A folder name for this CPU model and OpenVINO release (compiled blobs are specific
    to both)."""
    core = import_openvino().Core()
    name = str(core.get_property("CPU", "FULL_DEVICE_NAME"))
    version = import_openvino().__version__
    return re.sub(r"[^a-z0-9.]+", "-", f"{name}-ov{version}".lower()).strip("-")


def openvino_key(precision: Precision) -> dict[str, Any]:
    """What the served IR (and, with int8, its quantization) depends on besides the
    weights: the OpenVINO and NNCF releases, the CPU's capability set and, for int8,
    what its float layers run in and which kinds of plan accuracy control searches
    (entries chosen by an older search, which could not serve a faster plan found
    now, are not reused)."""
    versions: dict[str, Any] = {"openvino": import_openvino().__version__}
    try:  # from its metadata: importing NNCF takes time, and fp32 and bf16 never use it
        versions["nncf"] = importlib.metadata.version("nncf")
    except importlib.metadata.PackageNotFoundError:
        versions["nncf"] = None
    key = {
        **versions,
        "cpu": sorted(cpu_capabilities()),
        "cpu_kernels": sorted(cpu_features().flags & KERNEL_FLAGS),
    }
    if precision is Precision.INT8:
        key["int8_float_layers"] = precision_hint(precision)
        key["int8_plans"] = int8_plan_kinds()
    return key


def float_model(export: ExportedGraph) -> Any:
    """OpenVINO's model of the exported graph, weights in fp32: a copy of the one
    converted for every build of this ``optimize()`` call (converting takes seconds)."""
    ov = import_openvino()
    return export.derived("openvino-model", lambda path: ov.convert_model(str(path))).clone()


def convert_to_ir(export: ExportedGraph, folder: Path) -> Path:
    """The exported graph as OpenVINO's IR in ``folder``, weights kept in fp32: the same
    files for every float plan, written once per call (writing a base model's takes
    seconds)."""

    def write(into: Path) -> None:
        model = float_model(export)
        import_openvino().save_model(model, str(into / IR_FILE), compress_to_fp16=False)

    export.written("openvino-ir", folder, write)
    return folder / IR_FILE


@dataclass(frozen=True)
class OpenVINOLayout(SessionLayout):
    """An OpenVINO session's layout: where OpenVINO keeps this model's compiled blobs on
    this CPU (None: compiled on every start)."""

    compiled_dir: Path | None = None


class OpenVINORunner:
    """Torch tensors in, torch tensors out, through one infer request per thread. The
    files OpenVINO mapped the model from (``mapped``) have their pages given back after
    the first inference, and after a release of working memory
    (:mod:`.mapped_weights`)."""

    def __init__(self, compiled: Any, mapped: frozenset[FileId] = frozenset()) -> None:
        self.compiled = compiled
        self.input_names = tuple(port.any_name for port in compiled.inputs)
        self._local = threading.local()
        self.mapped = mapped
        self._mapped_resident = bool(mapped)

    def _request(self) -> Any:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        return request

    def run_arrays(self, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        """The rows run in groups of similar length
        (:mod:`~spacy_accelerate.runtime.length_groups`); the outputs
        are copied out of the request's buffers, which its next inference reuses. A large
        run's working memory is given back after it
        (:mod:`~spacy_accelerate.runtime.working_memory`)."""
        outputs = run_by_length(self.run_whole, feeds, names, borrowed=True)
        if releases_memory(feeds):
            self._release_memory()
        return outputs

    def _release_memory(self) -> None:
        """The graph's intermediate buffers and this thread's request (its output tensors
        stay at the largest shape seen) given back. Where another thread's inference runs,
        OpenVINO refuses: a later large run gives them back instead."""
        self._local.request = None
        try:
            self.compiled.release_memory()
        except RuntimeError:
            return
        self._mapped_resident = bool(self.mapped)  # repacking may have read them again

    def run_whole(self, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        """One inference over the whole padded batch; the arrays are the request's own
        buffers, valid until its next inference."""
        request = self._request()
        with runtime_call(request.cancel):  # a helper told to stop aborts it
            request.infer({name: feeds[name] for name in self.input_names})
        if self._mapped_resident:  # packed at this first inference: the originals go
            self._mapped_resident = False
            give_back(self.mapped)
        return [request.get_tensor(name).data for name in names]

    def run(
        self, feeds: Mapping[str, torch.Tensor], names: Sequence[str], *, graphs: bool = True
    ) -> list[torch.Tensor]:
        arrays = host_arrays(feeds, self.input_names)
        return [torch.from_numpy(array) for array in self.run_arrays(arrays, names)]


class OpenVINOSession:
    """The exported encoder compiled by OpenVINO for this CPU, with the session interface
    the proxy, the parity gate and warm-up use
    (:class:`~spacy_accelerate.runtime.session.Session`). ``model`` is its IR's path, or
    an ``openvino.Model`` in memory: an int8 search's candidate, written to disk only
    where it is served."""

    def __init__(
        self,
        model: Path | Any,
        provider: ResolvedProvider,
        config: OptimizeConfig,
        layout: SessionLayout,
        *,
        cache_dir: Path | None = None,
    ) -> None:
        ov = import_openvino()
        check_precision(config.precision)
        core = ov.Core()
        if cache_dir is not None:
            core.set_property({"CACHE_DIR": str(cache_dir)})
        # What OpenVINO maps: the IR's weights, and a compiled blob it imports.
        mapped = [] if cache_dir is None else [cache_dir]
        if isinstance(model, Path):
            mapped.append(model.with_suffix(".bin"))
            model = core.read_model(str(model))
        # Compiled from the model, not its path: OpenVINO then keys the blob by the model's
        # content, so the blob made while the entry was built (in a temporary folder) is
        # found again once the entry has its final name.
        #: What the model was compiled with (its int8 plan's hint and group, as recorded).
        self.settings: dict[str, Any] = {
            **compile_settings(model, config.precision),
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": config.intra_op_threads,
            "NUM_STREAMS": 1,
        }
        self.compiled = core.compile_model(model, "CPU", self.settings)
        self.provider = provider
        self.config = config
        self.layout = layout
        self.runner = OpenVINORunner(self.compiled, file_ids(mapped))
        self.input_names = self.runner.input_names
        self.output_names = tuple(port.any_name for port in self.compiled.outputs)

    @property
    def rows_independent(self) -> bool:
        """Always: OpenVINO's int8 is static (scales fixed at calibration), so a row's
        outputs never depend on the rows beside it."""
        return True

    def run(self, inputs: EncoderInputs, outputs: Sequence[str]) -> list[np.ndarray]:
        return self.runner.run_arrays(inputs.feeds(self.input_names), outputs)

    def run_tensors(
        self, feeds: Mapping[str, torch.Tensor], outputs: Sequence[str], *, graphs: bool = True
    ) -> list[torch.Tensor]:
        return self.runner.run(feeds, outputs)

    def warm_shapes(self, window: int, batch_size: int) -> list[tuple[int, int]]:
        return cpu_warm_shapes(window, batch_size, self.layout.buckets.longest)


#: Weight precisions of a MatMul whose weights NNCF stored in 8 (or 4) bits.
_LOW_BIT_WEIGHTS = frozenset({"u8", "i8", "u4", "i4"})


@dataclass(frozen=True)
class CompiledMatMuls:
    """What the MatMuls with weights of a compiled model run as, read from OpenVINO's
    runtime model (``layerType`` ``FullyConnected``): int8 arithmetic (a static int8
    plan's), int8 weights with float arithmetic (activations quantized at run time
    where :func:`dynamic_quantization_runs` says so), or float; by precision."""

    int8: int = 0
    dynamic_int8: int = 0
    int8_weights: tuple[tuple[str, int], ...] = ()
    float: tuple[tuple[str, int], ...] = ()

    @property
    def total(self) -> int:
        return self.int8 + self.dynamic_int8 + sum(n for _, n in self.int8_weights + self.float)

    def describe(self) -> str:
        parts = [f"{self.int8} int8"] if self.int8 else []
        if self.dynamic_int8:
            parts.append(f"{self.dynamic_int8} int8 with activations quantized at run time")
        parts += [f"{n} int8 weights with {p} arithmetic" for p, n in self.int8_weights]
        parts += [f"{n} {p}" for p, n in self.float]
        return f"{self.total} MatMuls: " + ", ".join(parts)


def compiled_matmuls(compiled: Any, cpu: CpuFeatures | None = None) -> CompiledMatMuls:
    """:class:`CompiledMatMuls` of ``compiled`` on ``cpu`` (this one by default). The
    arithmetic is the suffix of the node's ``primitiveType`` (``brgemm_avx512_amx_bf16``,
    ``undef_i8``); its weights' precision is its ``runtimePrecision``."""
    hint = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
    group = int(compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE"))
    dynamic = dynamic_quantization_runs(hint, group, cpu)
    int8 = dynamic_int8 = 0
    weights: Counter[str] = Counter()
    floats: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if "layerType" not in info or info["layerType"].astype(str) != "FullyConnected":
            continue
        arithmetic = info["primitiveType"].astype(str).rsplit("_", 1)[-1].lower()
        stored = info["runtimePrecision"].astype(str).lower()
        if arithmetic in ("i8", "u8"):
            int8 += 1
        elif stored in _LOW_BIT_WEIGHTS and dynamic:
            dynamic_int8 += 1
        elif stored in _LOW_BIT_WEIGHTS:
            weights[arithmetic] += 1
        else:
            floats[arithmetic] += 1
    return CompiledMatMuls(
        int8=int8,
        dynamic_int8=dynamic_int8,
        int8_weights=tuple(sorted(weights.items())),
        float=tuple(sorted(floats.items())),
    )
