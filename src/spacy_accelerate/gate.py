"""What a model must meet to be served, decided once from the precision asked for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Gate:
    """What a model must meet to be served: ``max_abs_diff`` for fp32, ``min_cosine`` otherwise."""

    max_abs_diff: float | None = None
    min_cosine: float | None = None

    def accepts(self, worst_abs: float, worst_cosine: float) -> bool:
        within_abs = self.max_abs_diff is None or worst_abs <= self.max_abs_diff
        within_cos = self.min_cosine is None or worst_cosine >= self.min_cosine
        # NaN compares false both ways: a model producing NaN never passes.
        return within_abs and within_cos and not np.isnan(worst_abs + worst_cosine)

    def describe(self) -> str:
        parts = []
        if self.max_abs_diff is not None:
            parts.append(f"max abs diff <= {self.max_abs_diff:g}")
        if self.min_cosine is not None:
            parts.append(f"token cosine >= {self.min_cosine:g}")
        return " and ".join(parts)


def recorded_report_meets(report: dict[str, Any], gate: Gate) -> bool:
    """Whether a stored report already proves ``gate``; False when it cannot be read."""
    try:
        worst_abs = float(max(report["max_abs_diff"]))
        worst_cos = float(min(report["min_cosine"]))
    except (KeyError, ValueError, TypeError):
        return False
    return gate.accepts(worst_abs, worst_cos)
