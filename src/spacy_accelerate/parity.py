"""The parity gate: prove the exported model equals the PyTorch module before serving it.

The check runs both on one padded batch of mixed lengths (the way spaCy
calls the transformer), compares every output at the positions spaCy keeps
(padding is stripped by spaCy), and refuses the model with the measured
numbers when any difference exceeds the tolerance. It never warns and
carries on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .architectures.spec import EncoderSpec
from .errors import ConversionError
from .runtime import EncoderSession


@dataclass(frozen=True)
class ParityReport:
    """Largest absolute difference per output (embedding output first)."""

    max_abs_diff: tuple[float, ...]
    tolerance: float
    batch_shape: tuple[int, int]

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff)

    @property
    def passed(self) -> bool:
        return self.worst <= self.tolerance

    def as_dict(self) -> dict[str, object]:
        return {
            "max_abs_diff": list(self.max_abs_diff),
            "tolerance": self.tolerance,
            "batch_shape": list(self.batch_shape),
        }


def verification_batch(spec: EncoderSpec, window: int, *, seed: int = 0) -> torch.Tensor:
    """Random piece ids, padded with the encoder's own ``padding_idx``, rows of mixed lengths."""
    # RoBERTa counts positions from padding_idx + 1, so this bounds every family.
    positions = spec.max_position_embeddings - spec.padding_idx - 1
    longest = max(1, min(window, spec.model_max_length, positions))
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
    return ids


def reference_outputs(module: torch.nn.Module, input_ids: torch.Tensor) -> list[np.ndarray]:
    """The PyTorch module's outputs, in eval mode, called as thinc calls it."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            output = module(input_ids)
    finally:
        module.train(was_training)
    return [tensor.detach().cpu().float().numpy() for tensor in output.all_outputs]


def check_parity(
    module: torch.nn.Module,
    session: EncoderSession,
    spec: EncoderSpec,
    *,
    window: int,
    tolerance: float,
) -> ParityReport:
    """Compare ``session`` with ``module``; raise :class:`ConversionError` on a mismatch."""
    input_ids = verification_batch(spec, window)
    expected = reference_outputs(module, input_ids)
    ids = input_ids.numpy()
    mask = ids != spec.padding_idx
    actual = session.run(ids, mask.astype(np.int64), np.zeros_like(ids), spec.output_names)
    diffs = tuple(
        float(np.max(np.abs(a[mask] - e[mask]))) for a, e in zip(actual, expected, strict=True)
    )
    report = ParityReport(max_abs_diff=diffs, tolerance=tolerance, batch_shape=tuple(ids.shape))
    if not report.passed:
        per_output = ", ".join(
            f"{name}={diff:.3g}" for name, diff in zip(spec.output_names, diffs, strict=True)
        )
        raise ConversionError(
            f"The exported {spec.family} model does not match the PyTorch module: largest "
            f"absolute difference {report.worst:.3g} > tolerance {tolerance:g} on a padded batch "
            f"of shape {report.batch_shape} ({per_output}). The model was not served; the "
            "pipeline is unchanged. Please report this with your package versions."
        )
    return report
