"""The validated options of one ``optimize()`` call.

All options are checked once, here, and then travel as one frozen
:class:`OptimizeConfig`: the later steps never see a raw string, and the
cache key is computed from exactly the values that shaped the exported file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from spacy_accelerate.errors import Advice, InvalidOptionError, Said, joined
from spacy_accelerate.options.agreement import DEFAULT_AGREEMENT, AgreementBounds
from spacy_accelerate.options.gate import Gate
from spacy_accelerate.options.gpu import GpuOptions
from spacy_accelerate.options.precision import LOSSY, Precision
from spacy_accelerate.options.providers import PROVIDERS, Provider

__all__ = ["LOSSY", "Precision", "Provider"]  # where most of the library imports them from


class MissingCache(str, Enum):
    """What a saved or pickled pipeline does where it loads and its cache entry is not
    there: export it again from the pipeline's own weights, or run on PyTorch (with a
    warning) instead of exporting at load time."""

    REBUILD = "rebuild"
    PYTORCH = "pytorch"


class Workload(str, Enum):
    """What the pipeline serves: ``nlp.pipe`` over many texts, or one document per call
    (``nlp(text)``: a web worker answering a request). ``precision="auto"`` times its
    candidates on it, and the overlap of ``nlp.pipe`` is not decided for single documents
    (off, untimed)."""

    BATCHES = "batches"
    DOCUMENTS = "documents"


def texts_digest(texts: Sequence[str]) -> str:
    """SHA256 of calibration texts: what is saved of them instead of the texts."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf8"))
        digest.update(b"\0")
    return digest.hexdigest()


#: The fp32 parity gate of DESIGN.md: the largest allowed absolute difference
#: between a hidden state of the exported model and of the PyTorch module.
DEFAULT_TOLERANCE = 1e-4

#: The fp32 gate on a GPU: TensorRT builds fp32 engines with TF32 tensor cores
#: (10-bit mantissa inputs) and GPU kernels reduce in other orders than the
#: CPU, so 1e-4 is out of reach there. (The CUDA provider runs with TF32 off.)
DEFAULT_GPU_TOLERANCE = 1e-3

#: The gate of int8: the smallest allowed cosine similarity between one
#: token's hidden state and PyTorch's fp32 one.
DEFAULT_MIN_COSINE = 0.99

#: The gate of a calibrated int8 (a provider row with ``calibrated_int8``, OpenVINO's):
#: the mean token cosine over the pieces spaCy reads in the calibration documents (see
#: :class:`~spacy_accelerate.options.gate.Gate`).
DEFAULT_CALIBRATED_INT8_MIN_COSINE = 0.995

#: ... and the floor under every single piece of them, catching a broken model.
CALIBRATED_COSINE_FLOOR = 0.95

#: The gate of fp16 and bf16, tighter than int8's: half precision loses far less.
DEFAULT_FP16_MIN_COSINE = 0.999

#: Seconds to wait for another process building the same model (``lock_timeout``).
DEFAULT_LOCK_TIMEOUT = 3600.0

#: ONNX opset used by the exporter; part of the cache key.
DEFAULT_OPSET = 17


def parse_enum(enum_type: type[Enum], value: Any, option: str) -> Any:
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        try:
            return enum_type(value.strip().lower())
        except ValueError:
            pass
    valid = ", ".join(repr(member.value) for member in enum_type)
    raise InvalidOptionError("Unknown ", Advice(option), f" {value!r}. Valid values: {valid}.")


def parse_provider(value: str | Provider) -> Provider:
    """Turn a user's provider string into a :class:`Provider`, or explain the valid ones."""
    return PROVIDERS.parse(value)


def parse_precision(value: str | Precision) -> Precision:
    """Turn a user's precision string into a :class:`Precision`, or explain the valid ones."""
    return parse_enum(Precision, value, "precision")


#: Whether ``nlp.pipe`` overlaps the transformer with the components behind it unless
#: told otherwise: None, where ``optimize()`` measures that it pays
#: (:mod:`spacy_accelerate.planning.overlap_plan`).
DEFAULT_OVERLAP: bool | None = None


@dataclass(frozen=True)
class OptimizeConfig:
    """Everything ``optimize()`` was asked to do, validated.

    ``tolerance`` and ``min_cosine`` are kept as the user gave them (None:
    not given), because their defaults depend on where the model ends up
    running, which ``auto`` and ``fallback`` only decide later.
    """

    provider: Provider
    precision: Precision
    cache_dir: Path | None
    warmup: bool
    verify: bool
    intra_op_threads: int
    tolerance: float | None = None
    min_cosine: float | None = None
    opset: int = DEFAULT_OPSET
    gpu: GpuOptions = GpuOptions()
    fallback: bool = False
    #: Whether ``nlp.pipe`` runs the transformer in a helper thread while the components
    #: behind it annotate the batch before (:mod:`spacy_accelerate.serving.overlap`);
    #: None: where it measures a gain (:mod:`spacy_accelerate.planning.overlap_plan`).
    overlap: bool | None = DEFAULT_OVERLAP
    #: The calibration texts of a lossy plan (None: the built-in sample, or only their
    #: digest is known: a saved pipeline, whose texts were never written to disk).
    calibration_texts: tuple[str, ...] | None = None
    #: A lossy plan: the least share of calibration units of each annotation that must
    #: stay as PyTorch fp32's (see :mod:`~spacy_accelerate.options.agreement`).
    min_agreement: AgreementBounds = DEFAULT_AGREEMENT
    #: The SHA256 (:func:`texts_digest`) and number of the calibration texts given, the
    #: only things saved of them.
    calibration_sha256: str | None = None
    calibration_count: int | None = None
    #: Seconds to wait for another process building the same model.
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    #: What a saved or pickled pipeline does where its cache entry is missing.
    missing_cache: MissingCache = MissingCache.REBUILD
    #: What the pipeline serves: batches or single documents (:class:`Workload`).
    workload: Workload = Workload.BATCHES
    #: Whether ``nlp.to_disk`` saves the served models with the pipeline (its bundle).
    bundle: bool = True

    @property
    def calibrated(self) -> bool:
        """Whether the plan is lossy, hence judged on calibration texts by the pipeline's
        agreement with PyTorch fp32 (and, for OpenVINO's int8, quantized with their
        statistics)."""
        return self.precision in LOSSY

    @property
    def on_gpu(self) -> bool:
        return PROVIDERS.on_gpu(self.provider)

    def export_options(self) -> dict[str, Any]:
        """The options that change the exported file, hence part of the cache key."""
        options: dict[str, Any] = {
            "provider": self.provider.value,
            "precision": self.precision.value,
            "opset": self.opset,
            "fixed_shapes": None,
        }
        return options

    def gate(self) -> Gate:
        """fp32 must match PyTorch within the tolerance; fp16, bf16 and int8 must keep every
        token's direction (cosine); calibrated int8 is held to the mean over the pieces spaCy
        reads, with a floor under every piece (see :class:`~.gate.Gate`). This is the cheap first
        filter of a lossy plan; the pipeline's agreement judges it next."""
        if self.precision is Precision.FP32:
            return Gate(max_abs_diff=self.tolerance or default_tolerance(self.provider))
        bound = self.min_cosine or default_min_cosine(self.precision, self.provider)
        if self.precision is Precision.INT8 and _calibrated_int8(self.provider):
            return Gate(min_cosine=min(CALIBRATED_COSINE_FLOOR, bound), min_mean_cosine=bound)
        return Gate(min_cosine=bound)

    def served_by(self, provider: Provider) -> OptimizeConfig:
        """This request served by ``provider`` instead (a fallback): a precision that
        provider cannot serve becomes fp32."""
        served = PROVIDERS.serves(provider, self.precision)
        return replace(
            self, provider=provider, precision=self.precision if served else Precision.FP32
        )


def default_tolerance(provider: Provider) -> float:
    """The fp32 parity bound: near-exact on a CPU, TF32-sized on a GPU."""
    return DEFAULT_GPU_TOLERANCE if PROVIDERS.on_gpu(provider) else DEFAULT_TOLERANCE


def default_min_cosine(precision: Precision, provider: Provider) -> float:
    """The token cosine bound of a reduced precision. A calibrated int8 (OpenVINO's) is
    held to a tighter bound, on the mean, than a dynamic one (ONNX Runtime's)."""
    if precision in (Precision.FP16, Precision.BF16):
        return DEFAULT_FP16_MIN_COSINE
    if _calibrated_int8(provider):
        return DEFAULT_CALIBRATED_INT8_MIN_COSINE
    return DEFAULT_MIN_COSINE


def _calibrated_int8(provider: Provider) -> bool:
    row = PROVIDERS.get(provider)
    return row is not None and row.calibrated_int8


def check_gpu_options(provider: Provider, gpu: GpuOptions) -> Said | None:
    """Why ``gpu`` cannot be served by ``provider``, or None."""
    row = PROVIDERS.get(provider)
    problem = row.cuda_graph_problem if row is not None else None
    if not gpu.cuda_graph or problem is None:
        return None
    capture = [other.provider.value for other in PROVIDERS if other.captures_graphs]
    instead: Said = ("Use ",)
    if capture:
        instead = ("Use ", Advice("provider", capture[0]), " with cuda_graph=True, or ")
    return (
        "cuda_graph=True is not available with ",
        Advice("provider", provider.value),
        f": {problem}. ",
        *instead,
        f"{provider.value} without CUDA graphs.",
    )


def check_supported(provider: Provider, precision: Precision) -> None:
    """Refuse a provider/precision pair this release cannot serve yet (``auto``: a
    provider that serves some precision)."""
    if PROVIDERS.serves(provider, precision):
        return
    if precision is Precision.AUTO and (provider is Provider.AUTO or provider in PROVIDERS):
        return
    served = joined(
        (
            (Advice("provider", p.value), " with ", Advice("precision", q.value))
            for p, q in sorted(PROVIDERS.served(), key=lambda pair: (pair[0].value, pair[1].value))
        ),
        ", ",
    )
    raise InvalidOptionError(
        Advice("provider", provider.value),
        " with ",
        Advice("precision", precision.value),
        " is not available in this release of spacy-accelerate. Supported: ",
        *served,
        ".",
    )
