"""The numeric precisions a model can be served in, and which of them lose accuracy."""

from __future__ import annotations

from enum import Enum


class Precision(str, Enum):
    """The numeric precision of the exported model; ``auto``: the fastest plan here that
    passes the accuracy gate (see :mod:`spacy_accelerate.planning.auto_precision`)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"
    AUTO = "auto"


#: The precisions that lose accuracy: each of their plans is judged by the pipeline's
#: agreement with PyTorch fp32 on calibration texts (``min_agreement``).
LOSSY: frozenset[Precision] = frozenset({Precision.FP16, Precision.BF16, Precision.INT8})

#: The precisions whose plans are judged by their annotations of calibration texts: the
#: only ones that read ``min_agreement`` and ``calibration_texts`` (``auto`` may serve a
#: lossy plan).
JUDGED: frozenset[Precision] = LOSSY | {Precision.AUTO}
