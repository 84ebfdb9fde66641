"""The variants ``spacy-accelerate bench`` puts beside PyTorch: one per precision asked,
as ``optimize()``'s keyword arguments, checked before any pipeline loads (a mistake then
fails at once, not after PyTorch's timed passes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spacy_accelerate.options.config import parse_precision
from spacy_accelerate.options.precision import JUDGED
from spacy_accelerate.options.request import build_config


def precision_variants(
    provider: str, precisions: Sequence[str], judging: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """``optimize()``'s keyword arguments for each of ``precisions`` (in order, repeats
    dropped) on ``provider``, by precision.

    ``judging`` (``min_agreement``, ``calibration_texts``) goes to the precisions that
    read it (:data:`~spacy_accelerate.options.precision.JUDGED`); where none of them
    does, to every variant, so that ``optimize()`` refuses it rather than the benchmark
    dropping it unsaid. Every variant is validated here."""
    asked = {given: parse_precision(given) for given in dict.fromkeys(precisions)}
    judged = {given for given, parsed in asked.items() if parsed in JUDGED}
    variants = {
        given: {
            "provider": provider,
            "precision": given,
            **(judging if given in judged or not judged else {}),
        }
        for given in asked
    }
    for options in variants.values():
        build_config(**options)
    return variants
