"""The GPU providers' options: device, buckets, CUDA graphs and TensorRT's builder.

They are validated once, here, into frozen dataclasses. None of them changes
the exported ONNX file (so none is part of its cache key); they shape the
session, its device buffers and TensorRT's engines, which are rebuilt from
the cached file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from spacy_accelerate.errors import Advice, InvalidOptionError

#: TensorRT's default workspace here: enough for BERT-base-sized tactics at
#: batch 128 x 512 without letting the builder take the whole device.
DEFAULT_TRT_WORKSPACE_BYTES = 4 * 1024**3

#: Sequence lengths are padded up to a multiple of this: tensor cores want
#: multiples of 8, and fewer distinct shapes mean fewer engines and graphs.
DEFAULT_SEQUENCE_MULTIPLE = 16


def _check_flag(name: str, value: Any) -> None:
    # "false" would be truthy: a flag must be a real boolean.
    if not isinstance(value, bool):
        raise InvalidOptionError(f"{name} must be True or False, got {value!r}.")


def _positive_int(value: Any, *, allow_zero: bool = False) -> bool:
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return value >= 0 if allow_zero else value > 0


@dataclass(frozen=True)
class TensorRTOptions:
    """How TensorRT builds its engines.

    ``builder_optimization_level`` trades build time for speed (0-5, TensorRT's
    default 3); ``max_workspace_size`` bounds the scratch memory of a tactic;
    the engine and timing caches live under the cache dir, so a warm start
    deserialises the engine instead of rebuilding it (minutes on big models).
    """

    builder_optimization_level: int = 3
    max_workspace_size: int = DEFAULT_TRT_WORKSPACE_BYTES
    engine_cache: bool = True
    timing_cache: bool = True

    def __post_init__(self) -> None:
        for name in ("engine_cache", "timing_cache"):
            _check_flag(f"tensorrt {name}", getattr(self, name))
        level = self.builder_optimization_level
        if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= 5:
            raise InvalidOptionError(
                f"tensorrt builder_optimization_level must be an integer from 0 to 5, got "
                f"{level!r}; 3 is TensorRT's default, 5 builds slowest and runs fastest."
            )
        size = self.max_workspace_size
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise InvalidOptionError(
                f"tensorrt max_workspace_size must be a positive number of bytes, got {size!r}; "
                f"the default is {DEFAULT_TRT_WORKSPACE_BYTES} (4 GiB)."
            )


@dataclass(frozen=True)
class GpuOptions:
    """Where and in which shapes the GPU providers run.

    ``batch_buckets`` are the batch sizes sessions run at (a batch is padded
    up to the next one, a larger batch is run in chunks of the largest);
    None derives them from the pipeline's span batch. Sequences are padded
    up to a multiple of ``sequence_multiple``. ``cuda_graph`` captures one
    CUDA graph per bucket shape and replays it (fewer kernel launches); it
    is opt-in because ONNX Runtime can only capture graphs whose every node
    runs on the GPU.
    """

    device_id: int = 0
    cuda_graph: bool = False
    batch_buckets: tuple[int, ...] | None = None
    sequence_multiple: int = DEFAULT_SEQUENCE_MULTIPLE
    tensorrt: TensorRTOptions = TensorRTOptions()

    def __post_init__(self) -> None:
        _check_flag("cuda_graph", self.cuda_graph)
        if not isinstance(self.tensorrt, TensorRTOptions):
            raise InvalidOptionError(
                f"tensorrt must be a spacy_accelerate.TensorRTOptions or a dict of its fields, "
                f"got {self.tensorrt!r}."
            )
        if not _positive_int(self.device_id, allow_zero=True):
            raise InvalidOptionError(
                Advice("device_id"),
                f" must be a CUDA device index (0, 1, ...), got {self.device_id!r}.",
            )
        if self.batch_buckets is not None:
            buckets = self.batch_buckets
            if not buckets or not all(_positive_int(size) for size in buckets):
                raise InvalidOptionError(
                    f"batch_buckets must be positive batch sizes such as (1, 8, 32, 128), got "
                    f"{buckets!r}; leave it unset to derive them from the pipeline."
                )
            object.__setattr__(self, "batch_buckets", tuple(sorted(set(buckets))))
        if not _positive_int(self.sequence_multiple):
            raise InvalidOptionError(
                f"sequence_multiple must be a positive integer, got {self.sequence_multiple!r}; "
                f"the default is {DEFAULT_SEQUENCE_MULTIPLE}."
            )

    def as_dict(self) -> dict[str, Any]:
        """Plain values, for the pipeline's config (``to_disk``)."""
        return {
            "cuda_graph": self.cuda_graph,
            "batch_buckets": list(self.batch_buckets) if self.batch_buckets else None,
            "sequence_multiple": self.sequence_multiple,
            "tensorrt": {f.name: getattr(self.tensorrt, f.name) for f in fields(TensorRTOptions)},
        }


def parse_gpu_options(
    value: GpuOptions | Mapping[str, Any] | None, *, device_id: int | None = None
) -> GpuOptions:
    """Accept a :class:`GpuOptions`, a mapping of its fields (as a saved config holds
    them) or None. ``device_id`` is the top-level ``optimize()`` option: when given, it
    is the device, whatever ``value`` says."""
    if value is None:
        return GpuOptions() if device_id is None else GpuOptions(device_id=device_id)
    if isinstance(value, GpuOptions):
        return value if device_id is None else replace(value, device_id=device_id)
    if not isinstance(value, Mapping):
        raise InvalidOptionError(
            Advice("gpu"),
            " must be a spacy_accelerate.GpuOptions or a dict of its fields, got "
            f"{type(value).__name__}.",
        )
    known = {f.name for f in fields(GpuOptions)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise InvalidOptionError(
            f"Unknown GPU option(s) {unknown}. Valid: {sorted(known - {'device_id'})}."
        )
    options = dict(value)
    tensorrt = options.pop("tensorrt", None)
    if isinstance(tensorrt, Mapping):
        trt_known = {f.name for f in fields(TensorRTOptions)}
        bad = sorted(set(tensorrt) - trt_known)
        if bad:
            raise InvalidOptionError(
                f"Unknown TensorRT option(s) {bad}. Valid: {sorted(trt_known)}."
            )
        tensorrt = TensorRTOptions(**tensorrt)
    if tensorrt is not None:
        options["tensorrt"] = tensorrt
    if options.get("batch_buckets") is not None:
        options["batch_buckets"] = tuple(options["batch_buckets"])
    if device_id is not None:
        options["device_id"] = device_id
    return GpuOptions(**options)
