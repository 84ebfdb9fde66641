"""The validated options of one ``optimize()`` call.

All options are checked once, here, and then travel as one frozen
:class:`OptimizeConfig`: the later steps never see a raw string, and the
cache key is computed from exactly the values that shaped the exported file.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from .errors import InvalidOptionError
from .gate import Gate
from .quantize import DEFAULT_INT8_RECIPE, Int8Recipe


class Provider(str, Enum):
    """Where the transformer runs once it has been accelerated."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
    TENSORRT = "tensorrt"
    OPENVINO = "openvino"


class Precision(str, Enum):
    """The numeric precision of the exported model."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"


#: The provider/precision pairs this release serves. Others are rejected with a
#: clear error instead of being half-supported.
SUPPORTED_COMBINATIONS: frozenset[tuple[Provider, Precision]] = frozenset(
    {(Provider.CPU, Precision.FP32), (Provider.CPU, Precision.INT8)}
)

#: The fp32 parity gate of DESIGN.md: the largest allowed absolute difference
#: between a hidden state of the exported model and of the PyTorch module.
DEFAULT_TOLERANCE = 1e-4

#: The gate of reduced precisions: the smallest allowed cosine similarity
#: between one token's hidden state and PyTorch's fp32 one.
DEFAULT_MIN_COSINE = 0.99

#: ONNX opset used by the exporter; part of the cache key.
DEFAULT_OPSET = 17


def _parse_enum(enum_type: type[Enum], value: Any, option: str) -> Any:
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        try:
            return enum_type(value.strip().lower())
        except ValueError:
            pass
    valid = ", ".join(repr(member.value) for member in enum_type)
    raise InvalidOptionError(f"Unknown {option} {value!r}. Valid values: {valid}.")


def parse_provider(value: str | Provider) -> Provider:
    """Turn a user's provider string into a :class:`Provider`, or explain the valid ones."""
    return _parse_enum(Provider, value, "provider")


def parse_precision(value: str | Precision) -> Precision:
    """Turn a user's precision string into a :class:`Precision`, or explain the valid ones."""
    return _parse_enum(Precision, value, "precision")


def _default_threads() -> int:
    # The CPUs this process may run on, not the machine's: containers and
    # `taskset` restrict the former, and oversubscription costs more than it gains.
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class OptimizeConfig:
    """Everything ``optimize()`` was asked to do, validated."""

    provider: Provider
    precision: Precision
    cache_dir: Path | None
    warmup: bool
    verify: bool
    tolerance: float
    intra_op_threads: int
    min_cosine: float = DEFAULT_MIN_COSINE
    opset: int = DEFAULT_OPSET
    int8: Int8Recipe = DEFAULT_INT8_RECIPE

    def export_options(self) -> dict[str, Any]:
        """The options that change the exported file, hence part of the cache key."""
        options: dict[str, Any] = {
            "provider": self.provider.value,
            "precision": self.precision.value,
            "opset": self.opset,
            "fixed_shapes": None,
        }
        if self.precision is Precision.INT8:
            options["int8"] = asdict(self.int8)
        return options

    def gate(self) -> Gate:
        """fp32 must match PyTorch within ``tolerance``; int8 must keep ``min_cosine``."""
        if self.precision is Precision.FP32:
            return Gate(max_abs_diff=self.tolerance)
        return Gate(min_cosine=self.min_cosine)


def build_config(
    provider: str | Provider,
    precision: str | Precision,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    warmup: bool = True,
    verify: bool = True,
    tolerance: float = DEFAULT_TOLERANCE,
    min_cosine: float = DEFAULT_MIN_COSINE,
    threads: int | None = None,
) -> OptimizeConfig:
    """Validate the user's options; ``provider`` may still be ``auto`` here.

    ``auto`` is resolved by :func:`spacy_accelerate.providers.check_provider`,
    because only it knows what is installed.
    """
    parsed_provider = parse_provider(provider)
    parsed_precision = parse_precision(precision)
    if not (isinstance(tolerance, int | float) and 0 < tolerance < 1):
        raise InvalidOptionError(
            f"tolerance must be a number between 0 and 1, got {tolerance!r}; the default "
            f"is {DEFAULT_TOLERANCE}."
        )
    if not (isinstance(min_cosine, int | float) and 0 < min_cosine <= 1):
        raise InvalidOptionError(
            f"min_cosine must be a number in (0, 1], got {min_cosine!r}; the default is "
            f"{DEFAULT_MIN_COSINE}."
        )
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise InvalidOptionError(f"threads must be a positive integer or None, got {threads!r}.")
    return OptimizeConfig(
        provider=parsed_provider,
        precision=parsed_precision,
        cache_dir=Path(cache_dir) if cache_dir is not None else None,
        warmup=bool(warmup),
        verify=bool(verify),
        tolerance=float(tolerance),
        min_cosine=float(min_cosine),
        intra_op_threads=threads if threads is not None else _default_threads(),
    )


def check_supported(provider: Provider, precision: Precision) -> None:
    """Refuse a provider/precision pair this release cannot serve yet."""
    if (provider, precision) in SUPPORTED_COMBINATIONS:
        return
    served = ", ".join(
        f"provider={p.value!r} with precision={q.value!r}"
        for p, q in sorted(SUPPORTED_COMBINATIONS, key=lambda pair: (pair[0].value, pair[1].value))
    )
    raise InvalidOptionError(
        f"provider={provider.value!r} with precision={precision.value!r} is not available in "
        f"this release of spacy-accelerate. Supported: {served}."
    )
