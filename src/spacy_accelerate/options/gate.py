"""What a model must meet to be served, decided once from the precision asked for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Gate:
    """What a model must meet to be served: ``max_abs_diff`` for fp32, ``min_cosine``
    (every piece) for reduced precisions, and for calibrated int8 ``min_mean_cosine``
    too: the mean over the pieces spaCy reads.

    Why a mean for calibrated int8: a few pieces of real text (the attention sinks of
    BERT-like models, a full stop say) carry hidden states of outsized norm that
    8-bit activations cannot follow closely; bounding every single piece tightly
    refuses models whose annotations hardly change. The pipeline's own annotations
    are gated separately (agreement), and ``min_cosine`` stays as a floor under
    every piece.
    """

    max_abs_diff: float | None = None
    min_cosine: float | None = None
    min_mean_cosine: float | None = None

    def accepts(self, worst_abs: float, worst_cosine: float, mean_cosine: float = 1.0) -> bool:
        within_abs = self.max_abs_diff is None or worst_abs <= self.max_abs_diff
        within_cos = self.min_cosine is None or worst_cosine >= self.min_cosine
        within_mean = self.min_mean_cosine is None or mean_cosine >= self.min_mean_cosine
        # NaN compares false both ways: a model producing NaN never passes.
        finite = not np.isnan(worst_abs + worst_cosine + mean_cosine)
        return within_abs and within_cos and within_mean and finite

    def describe(self) -> str:
        parts = []
        if self.max_abs_diff is not None:
            parts.append(f"max abs diff <= {self.max_abs_diff:g}")
        if self.min_mean_cosine is not None:
            parts.append(f"mean token cosine >= {self.min_mean_cosine:g}")
        if self.min_cosine is not None:
            parts.append(f"every token's cosine >= {self.min_cosine:g}")
        return " and ".join(parts)


def recorded_report_meets(report: dict[str, Any], gate: Gate) -> bool:
    """Whether a stored report already proves ``gate``; False when it cannot be read."""
    try:
        worst_abs = float(max(report["max_abs_diff"]))
        worst_cos = float(min(report["min_cosine"]))
        means = report.get("mean_cosine")
        if gate.min_mean_cosine is not None and not means:
            return False
        mean_cos = float(min(means)) if means else 1.0
    except (KeyError, ValueError, TypeError):
        return False
    return gate.accepts(worst_abs, worst_cos, mean_cos)
