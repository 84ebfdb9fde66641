"""The accuracy gate: prove the exported model matches the PyTorch module before serving it.

Both run on one padded batch of mixed lengths (the way spaCy calls the
transformer); every output is compared at the positions spaCy keeps
(padding is stripped by spaCy). fp32 must match within an absolute
tolerance; a reduced precision must keep every token's hidden state
pointing the same way (cosine similarity). A failure refuses the model with
the measured numbers: it never warns and carries on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from .architectures import DetectedEncoder
from .architectures.spec import EncoderSpec
from .encoder_inputs import EncoderInputs
from .errors import AccuracyError, ConversionError
from .gate import Gate
from .runtime import EncoderSession


@dataclass(frozen=True)
class ParityReport:
    """Per output (embedding output first): the largest absolute difference and the
    smallest cosine similarity of one token's vector to PyTorch's."""

    outputs: tuple[str, ...]
    max_abs_diff: tuple[float, ...]
    min_cosine: tuple[float, ...]
    gate: Gate
    batch_shape: tuple[int, int]
    #: For int8: the quantization plan that passed (see :class:`~.quantize.KeepFloat`).
    plan: str | None = None

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff)

    @property
    def worst_cosine(self) -> float:
        return min(self.min_cosine)

    @property
    def passed(self) -> bool:
        return self.gate.accepts(self.worst, self.worst_cosine)

    def as_dict(self) -> dict[str, Any]:
        return {
            "outputs": list(self.outputs),
            "max_abs_diff": list(self.max_abs_diff),
            "min_cosine": list(self.min_cosine),
            "gate": {"max_abs_diff": self.gate.max_abs_diff, "min_cosine": self.gate.min_cosine},
            "batch_shape": list(self.batch_shape),
            "plan": self.plan,
        }

    def per_output(self) -> str:
        rows = zip(self.outputs, self.max_abs_diff, self.min_cosine, strict=True)
        return ", ".join(f"{name}: abs {diff:.3g} cos {cos:.5f}" for name, diff, cos in rows)


def verification_batch(spec: EncoderSpec, window: int, *, seed: int = 0) -> EncoderInputs:
    """Random piece ids, padded with the encoder's own ``padding_idx``, rows of mixed lengths."""
    longest = max(1, min(window, spec.model_max_length, spec.longest_input))
    lengths = sorted({longest, max(1, (2 * longest) // 3), min(longest, 5), 1}, reverse=True)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), longest), spec.padding_idx, dtype=torch.long)
    for row, length in enumerate(lengths):
        pieces = torch.randint(0, spec.vocab_size - 1, (length,), generator=generator)
        # Shift ids at or above padding_idx up by one so no real piece is padding.
        ids[row, :length] = pieces + (pieces >= spec.padding_idx).long()
    # spaCy masks every padding_idx piece, wherever it stands (a piece encoder
    # may emit it from text); a graph that assumes trailing padding must fail here.
    if longest >= 4:
        ids[0, longest // 2 : longest // 2 + 2] = spec.padding_idx
    return EncoderInputs.from_ids(ids.numpy(), spec.padding_idx)


def reference_outputs(
    module: torch.nn.Module, detected: DetectedEncoder, inputs: EncoderInputs
) -> list[np.ndarray]:
    """The PyTorch module's outputs in eval mode, called as spaCy calls it."""
    was_training = module.training
    module.eval()
    try:
        return detected.architecture.reference_outputs(module, inputs, detected.spec)
    finally:
        module.train(was_training)


def token_cosines(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(e, axis=-1)
    dots = np.sum(a * e, axis=-1)
    # Two zero vectors agree perfectly; one zero vector against another does not.
    both_zero = norms == 0
    return np.where(both_zero, np.where(np.all(a == e, axis=-1), 1.0, 0.0), dots / (norms + 1e-30))


def compare(
    actual: list[np.ndarray],
    expected: list[np.ndarray],
    spec: EncoderSpec,
    inputs: EncoderInputs,
    gate: Gate,
) -> ParityReport:
    """Measure ``actual`` against ``expected`` where spaCy reads them (real pieces only)."""
    mask = inputs.attention_mask.astype(bool)
    diffs, cosines = [], []
    for a, e in zip(actual, expected, strict=True):
        kept_a, kept_e = (a[mask], e[mask]) if a.ndim == 3 else (a, e)
        diffs.append(float(np.max(np.abs(kept_a - kept_e))) if kept_a.size else 0.0)
        cosines.append(float(np.min(token_cosines(kept_a, kept_e))) if kept_a.size else 1.0)
    return ParityReport(
        outputs=spec.output_names,
        max_abs_diff=tuple(diffs),
        min_cosine=tuple(cosines),
        gate=gate,
        batch_shape=inputs.shape,
    )


def _merged(reports: list[ParityReport]) -> ParityReport:
    """The worst of several batches' reports, output by output."""
    if len(reports) == 1:
        return reports[0]
    first = reports[0]
    return replace(
        first,
        max_abs_diff=tuple(
            max(values) for values in zip(*(r.max_abs_diff for r in reports), strict=True)
        ),
        min_cosine=tuple(
            min(values) for values in zip(*(r.min_cosine for r in reports), strict=True)
        ),
        batch_shape=(
            sum(r.batch_shape[0] for r in reports),
            max(r.batch_shape[1] for r in reports),
        ),
    )


def check_parity(
    module: torch.nn.Module,
    detected: DetectedEncoder,
    session: EncoderSession,
    *,
    window: int,
    gate: Gate,
    batches: Sequence[EncoderInputs] | None = None,
) -> ParityReport:
    """Compare ``session`` with ``module`` on ``batches`` (a calibrated model: its
    calibration spans) or the random verification batch; raise when the gate is not met."""
    spec = detected.spec
    chosen = list(batches) if batches else [verification_batch(spec, window)]
    report = _merged(
        [
            compare(
                session.run(inputs, spec.output_names),
                reference_outputs(module, detected, inputs),
                spec,
                inputs,
                gate,
            )
            for inputs in chosen
        ]
    )
    if report.passed:
        return report
    if gate.min_cosine is not None:
        raise AccuracyError(
            f"The reduced-precision {spec.family} model drifts too far from the PyTorch module: "
            f"smallest token cosine similarity {report.worst_cosine:.5f} < {gate.min_cosine:g} "
            f"(largest absolute difference {report.worst:.3g}) on padded batches of "
            f"{report.batch_shape} rows x pieces ({report.per_output()}). It was not served; "
            "the pipeline is unchanged. Use precision='fp32', or lower min_cosine if this "
            "accuracy is enough for you."
        )
    raise ConversionError(
        f"The exported {spec.family} model does not match the PyTorch module: largest "
        f"absolute difference {report.worst:.3g} > tolerance {gate.max_abs_diff:g} on a padded "
        f"batch of shape {report.batch_shape} ({report.per_output()}). The model was not "
        "served; the pipeline is unchanged. Please report this with your package versions."
    )
