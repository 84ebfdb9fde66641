"""The accuracy gate: prove the exported model matches the PyTorch module before serving it.

Both run on padded batches of mixed lengths (the way spaCy calls the
transformer: see :mod:`.verification` for which rows); every output is compared at the
positions spaCy keeps
(padding is stripped by spaCy). fp32 must match within an absolute
tolerance; a reduced precision must keep every token's hidden state
pointing the same way (cosine similarity). A failure refuses the model with
the measured numbers: it never warns and carries on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from spacy_accelerate.architectures import DetectedEncoder
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.errors import AccuracyError, Advice, ConversionError
from spacy_accelerate.options.gate import Gate
from spacy_accelerate.runtime.length_groups import run_by_length
from spacy_accelerate.runtime.session import Session


@dataclass(frozen=True)
class ParityReport:
    """Per output (embedding output first): the largest absolute difference and the
    smallest cosine similarity of one token's vector to PyTorch's. What the build decided
    (its plan, the pipeline's agreement) is its :class:`~.record.BuildRecord`."""

    outputs: tuple[str, ...]
    max_abs_diff: tuple[float, ...]
    min_cosine: tuple[float, ...]
    gate: Gate
    batch_shape: tuple[int, int]
    #: Per output: the mean cosine over the pieces spaCy reads (see :func:`read_pieces`),
    #: and how many such pieces there were.
    mean_cosine: tuple[float, ...] = ()
    read_pieces: int = 0

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff)

    @property
    def worst_cosine(self) -> float:
        return min(self.min_cosine)

    @property
    def worst_mean_cosine(self) -> float:
        return min(self.mean_cosine, default=1.0)

    @property
    def passed(self) -> bool:
        return self.gate.accepts(self.worst, self.worst_cosine, self.worst_mean_cosine)

    def as_dict(self) -> dict[str, Any]:
        return {
            "outputs": list(self.outputs),
            "max_abs_diff": list(self.max_abs_diff),
            "min_cosine": list(self.min_cosine),
            "mean_cosine": list(self.mean_cosine),
            "read_pieces": self.read_pieces,
            "gate": {
                "max_abs_diff": self.gate.max_abs_diff,
                "min_cosine": self.gate.min_cosine,
                "min_mean_cosine": self.gate.min_mean_cosine,
            },
            "batch_shape": list(self.batch_shape),
        }

    def per_output(self) -> str:
        rows = zip(self.outputs, self.max_abs_diff, self.min_cosine, strict=True)
        return ", ".join(f"{name}: abs {diff:.3g} cos {cos:.5f}" for name, diff, cos in rows)


def reference_outputs(
    module: torch.nn.Module, detected: DetectedEncoder, inputs: EncoderInputs
) -> list[np.ndarray]:
    """The PyTorch module's outputs in eval mode, called as spaCy calls it, on the rows
    grouped by length as the served models run them
    (:func:`~spacy_accelerate.runtime.length_groups.run_by_length`): every real piece's
    state up to float rounding, for less padding run; zeros past a group's length, where
    :func:`compare` never reads."""
    spec = detected.spec

    def run(feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        rows = EncoderInputs(feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"])
        return detected.architecture.reference_outputs(module, rows, spec)

    feeds = {
        "input_ids": inputs.input_ids,
        "attention_mask": inputs.attention_mask,
        "token_type_ids": inputs.token_type_ids,
    }
    was_training = module.training
    module.eval()
    try:
        return run_by_length(run, feeds, spec.output_names, borrowed=False)
    finally:
        module.train(was_training)


def token_cosines(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(e, axis=-1)
    dots = np.sum(a * e, axis=-1)
    # Two zero vectors agree perfectly; one zero vector against another does not.
    both_zero = norms == 0
    return np.where(both_zero, np.where(np.all(a == e, axis=-1), 1.0, 0.0), dots / (norms + 1e-30))


def read_pieces(mask: np.ndarray) -> np.ndarray:
    """The real pieces spaCy reads: every row's first and last real piece are the span's
    begin and end markers (``[CLS]``/``[SEP]``, ``<s>``/``</s>``), which no token is
    aligned to (curated pipelines strip them, spacy-transformers aligns none to them)."""
    read = mask.astype(bool).copy()
    rows = np.flatnonzero(read.any(axis=1))
    firsts = read[rows].argmax(axis=1)
    lasts = read.shape[1] - 1 - read[rows, ::-1].argmax(axis=1)
    read[rows, firsts] = False
    read[rows, lasts] = False
    return read


def compare(
    actual: list[np.ndarray],
    expected: list[np.ndarray],
    spec: EncoderSpec,
    inputs: EncoderInputs,
    gate: Gate,
) -> ParityReport:
    """Measure ``actual`` against ``expected`` where spaCy reads them (real pieces only)."""
    mask = inputs.attention_mask.astype(bool)
    read = read_pieces(mask)
    diffs, cosines, means = [], [], []
    for a, e in zip(actual, expected, strict=True):
        kept_a, kept_e = (a[mask], e[mask]) if a.ndim == 3 else (a, e)
        diffs.append(float(np.max(np.abs(kept_a - kept_e))) if kept_a.size else 0.0)
        cosines.append(float(np.min(token_cosines(kept_a, kept_e))) if kept_a.size else 1.0)
        read_a, read_e = (a[read], e[read]) if a.ndim == 3 else (a, e)
        means.append(float(np.mean(token_cosines(read_a, read_e))) if read_a.size else 1.0)
    return ParityReport(
        outputs=spec.output_names,
        max_abs_diff=tuple(diffs),
        min_cosine=tuple(cosines),
        gate=gate,
        batch_shape=inputs.shape,
        mean_cosine=tuple(means),
        read_pieces=int(read.sum()),
    )


def _merged(reports: list[ParityReport]) -> ParityReport:
    """The worst of several batches' reports, output by output."""
    if len(reports) == 1:
        return reports[0]
    first = reports[0]
    weights = [r.read_pieces for r in reports]
    return replace(
        first,
        max_abs_diff=tuple(
            max(values) for values in zip(*(r.max_abs_diff for r in reports), strict=True)
        ),
        min_cosine=tuple(
            min(values) for values in zip(*(r.min_cosine for r in reports), strict=True)
        ),
        mean_cosine=tuple(
            float(np.average(values, weights=weights)) if sum(weights) else 1.0
            for values in zip(*(r.mean_cosine for r in reports), strict=True)
        ),
        read_pieces=sum(weights),
        batch_shape=(
            sum(r.batch_shape[0] for r in reports),
            max(r.batch_shape[1] for r in reports),
        ),
    )


def _cosine_findings(report: ParityReport, gate: Gate) -> str:
    """What missed the gate's cosine bounds, in words."""
    findings = []
    if gate.min_cosine is not None and not report.worst_cosine >= gate.min_cosine:
        findings.append(
            f"smallest token cosine similarity {report.worst_cosine:.5f} < {gate.min_cosine:g}"
        )
    if gate.min_mean_cosine is not None and not report.worst_mean_cosine >= gate.min_mean_cosine:
        findings.append(
            "mean token cosine over the pieces spaCy reads "
            f"{report.worst_mean_cosine:.5f} < {gate.min_mean_cosine:g}"
        )
    return "; ".join(findings) or f"outputs that are not numbers ({gate.describe()})"


def check_parity(
    module: torch.nn.Module,
    detected: DetectedEncoder,
    session: Session,
    *,
    gate: Gate,
    batches: Sequence[EncoderInputs],
    references: Sequence[list[np.ndarray]] | None = None,
) -> ParityReport:
    """Compare ``session`` with ``module`` on ``batches`` (the rows of a
    :class:`~.verification.Verification`, or a calibrated model's calibration spans); raise
    when the gate is not met. ``references``: the module's outputs for ``batches``, when
    already computed."""
    spec = detected.spec
    chosen = list(batches)
    if not chosen:
        raise ValueError("check_parity() needs at least one batch")
    if references is None:
        references = [reference_outputs(module, detected, inputs) for inputs in chosen]
    report = _merged(
        [
            compare(session.run(inputs, spec.output_names), expected, spec, inputs, gate)
            for inputs, expected in zip(chosen, references, strict=True)
        ]
    )
    if report.passed or gate == Gate():  # no bounds: measured only, the caller judges
        return report
    if gate.min_cosine is not None or gate.min_mean_cosine is not None:
        raise AccuracyError(
            f"The reduced-precision {spec.family} model drifts too far from the PyTorch module: "
            f"{_cosine_findings(report, gate)} (largest absolute difference {report.worst:.3g}) "
            "on padded batches of "
            f"{report.batch_shape} rows x pieces ({report.per_output()}). It was not served; "
            "the pipeline is unchanged. Use ",
            Advice("precision", "fp32"),
            ", or lower ",
            Advice("min_cosine"),
            " if this accuracy is enough for you.",
        )
    raise ConversionError(
        f"The exported {spec.family} model does not match the PyTorch module: largest "
        f"absolute difference {report.worst:.3g} > tolerance {gate.max_abs_diff:g} on a padded "
        f"batch of shape {report.batch_shape} ({report.per_output()}). The model was not "
        "served; the pipeline is unchanged. Please report this with your package versions."
    )
