"""``precision="auto"``: the fastest plan on this machine that passes the accuracy gate.

The candidates are every precision the provider serves (every usable provider's, for
``provider="auto"``): fp32, bf16 where the CPU has it, int8, fp16 on a GPU. Each is
built (or read from the cache) and judged as if asked for by name: a lossy plan must
keep the pipeline's annotations of the calibration texts (``min_agreement``), fp32 its
parity. The ones that pass are timed side by side on the calibration texts, in turns,
and the fastest is served. ``optimize()`` logs the plan that won and why each faster
one lost.

The choice is stored as a cache entry of its own, keyed by everything it depends on:
the transformers' weights, the pipeline's other components, the calibration texts and
bounds, the request, the package versions, the thread count and the CPU's features. A
warm start reads it and builds only the chosen plan (a cache hit); a CPU with other
features searches again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from spacy.language import Language

from spacy_accelerate import progress
from spacy_accelerate.cache.store import ModelCache
from spacy_accelerate.cpu_features import cpu_features
from spacy_accelerate.errors import (
    AccuracyError,
    AgreementError,
    CacheError,
    ConversionError,
    ProviderUnavailableError,
)
from spacy_accelerate.export.fingerprint import cache_key, package_versions, weights_digest
from spacy_accelerate.options.config import GPU_PROVIDERS, OptimizeConfig, Precision, Provider
from spacy_accelerate.pipeline.calibration import CalibrationSource, annotate, builtin_texts
from spacy_accelerate.pipeline.patch import patch, revert, scoped
from spacy_accelerate.pipeline.proxy import AcceleratedModule
from spacy_accelerate.pipeline.shim import ShimLocation

logger = logging.getLogger("spacy_accelerate")

#: The file of a choice entry.
CHOICE_FILE = "auto_precision.json"

#: The calibration tokens each candidate is timed on, per turn: enough for a stable
#: figure on a small model, few enough that trf-base's five candidates time in a minute.
TIMED_TOKENS = 1500

#: Turns of timing; each candidate's fastest turn counts (the first also warms it up).
TURNS = 2


@dataclass(frozen=True)
class Candidate:
    """One plan ``auto`` may serve."""

    provider: Provider
    precision: Precision

    @property
    def label(self) -> str:
        return f"{self.provider.value} {self.precision.value}"


@dataclass(frozen=True)
class Choice:
    """What the search found: the plan served, each passing plan's seconds on the timed
    texts, and each refused plan with its reason."""

    chosen: Candidate
    seconds: dict[str, float]
    refused: dict[str, str]

    def explain(self) -> str:
        """Why the plan won, and why each faster one lost, in one line."""
        won = self.seconds[self.chosen.label]
        timed = ", ".join(f"{label} {s:.3f} s" for label, s in sorted(self.seconds.items()))
        lost = "; ".join(f"{label}: {why}" for label, why in self.refused.items())
        return (
            f"precision='auto' chose {self.chosen.label} ({won:.3f} s on the timed "
            f"calibration texts; passing plans: {timed})" + (f"; refused: {lost}" if lost else "")
        )

    def as_dict(self) -> dict[str, Any]:
        return {"chosen": asdict(self.chosen), "seconds": self.seconds, "refused": self.refused}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Choice:
        chosen = data["chosen"]
        return cls(
            chosen=Candidate(Provider(chosen["provider"]), Precision(chosen["precision"])),
            seconds={str(k): float(v) for k, v in data["seconds"].items()},
            refused={str(k): str(v) for k, v in data["refused"].items()},
        )


def timed_texts(texts: Sequence[str], tokens: int = TIMED_TOKENS) -> list[str]:
    """The first calibration texts holding about ``tokens`` whitespace-separated words."""
    chosen: list[str] = []
    count = 0
    for text in texts:
        if count >= tokens:
            break
        chosen.append(text)
        count += len(text.split())
    return chosen


def choice_inputs(
    config: OptimizeConfig,
    candidates: Sequence[Candidate],
    locations: Sequence[ShimLocation],
    source: CalibrationSource,
) -> dict[str, Any]:
    """What a stored choice depends on (its key): a change to any of these searches anew."""
    cpu = cpu_features()
    on_gpu = any(candidate.provider in GPU_PROVIDERS for candidate in candidates)
    usable = on_gpu and torch.cuda.is_available()
    gpu = torch.cuda.get_device_name(config.gpu.device_id or 0) if usable else None
    return {
        "auto_precision": 1,
        "candidates": [candidate.label for candidate in candidates],
        "weights_sha256": [weights_digest(location.pytorch_module) for location in locations],
        "judged_by_sha256": source.judged_by,
        "calibration_sha256": source.digest,
        "min_agreement": config.min_agreement.resolved(),
        "tolerance": config.tolerance,
        "min_cosine": config.min_cosine,
        "gpu": config.gpu.as_dict(),
        "threads": config.intra_op_threads,
        "cpu": {"vendor": cpu.vendor, "machine": cpu.machine, "flags": sorted(cpu.flags)},
        "gpu_device": gpu,
        "versions": package_versions(),
    }


def choose(
    nlp: Language,
    config: OptimizeConfig,
    candidates: Sequence[Candidate],
    locations: Sequence[ShimLocation],
    source: CalibrationSource,
    cache: ModelCache,
    accelerate: Callable[[OptimizeConfig], None],
) -> Choice:
    """Serve the stored choice for this request, or search, store and serve one.
    ``accelerate`` serves one concrete request (all components, all or nothing). On any
    failure the pipeline is left as it was."""
    inputs = choice_inputs(config, candidates, locations, source)
    key = cache_key(inputs)
    previous = [location.module for location in locations]
    found: list[Choice] = []

    def search(folder: Path) -> dict[str, Any]:
        choice = _search(nlp, config, candidates, locations, source, accelerate)
        found.append(choice)
        (folder / CHOICE_FILE).write_text(json.dumps(choice.as_dict(), indent=2))
        return {"auto_precision": choice.as_dict()}

    try:
        try:
            result = cache.get_or_build(key, inputs, search, (CHOICE_FILE,))
        except CacheError as error:
            if not found:
                raise
            # Searched, but the choice could not be stored (a read-only or full cache):
            # the winner is served, and the next start searches again.
            logger.warning("spacy-accelerate: the auto precision choice is not stored: %s", error)
            return _chosen(found[0])
        if found:  # the search left the winner in place
            return _chosen(found[0])
        choice = Choice.from_dict(json.loads(result.entry.file(CHOICE_FILE).read_text()))
        try:
            accelerate(_as_request(config, choice.chosen))
        except (AccuracyError, ProviderUnavailableError, ConversionError) as error:
            # What was chosen cannot be served here any more (a GPU gone, a refusal): search
            # again rather than fail.
            logger.warning(
                "spacy-accelerate: the stored choice %s cannot be served here (%s); searching "
                "again",
                choice.chosen.label,
                error,
            )
            rebuilt = cache.rebuild(result.entry, inputs, search, (CHOICE_FILE,))
            if found:
                return _chosen(found[0])
            # Another process stored a new choice meanwhile: serve that one.
            choice = Choice.from_dict(json.loads(rebuilt.entry.file(CHOICE_FILE).read_text()))
            accelerate(_as_request(config, choice.chosen))
        else:
            logger.info("spacy-accelerate: the stored choice was reused (no search)")
        return _chosen(choice)
    except BaseException:
        for location, module in zip(locations, previous, strict=True):
            revert(location, module)
        raise


def _chosen(choice: Choice) -> Choice:
    logger.info("spacy-accelerate: %s", choice.explain())
    return choice


def _as_request(config: OptimizeConfig, candidate: Candidate) -> OptimizeConfig:
    return replace(config, provider=candidate.provider, precision=candidate.precision)


def _search(
    nlp: Language,
    config: OptimizeConfig,
    candidates: Sequence[Candidate],
    locations: Sequence[ShimLocation],
    source: CalibrationSource,
    accelerate: Callable[[OptimizeConfig], None],
) -> Choice:
    """Build and judge every candidate, time those that pass (in this thread only: other
    threads keep annotating with what they run), install the fastest."""
    previous = [location.module for location in locations]
    served: dict[str, tuple[Candidate, list[torch.nn.Module]]] = {}
    refused: dict[str, str] = {}
    unavailable: list[ProviderUnavailableError] = []
    judging = "precision='auto': building and judging each candidate"
    for candidate in progress.track(candidates, judging):
        progress.note(candidate.label)
        try:
            accelerate(_as_request(config, candidate))
        except (AccuracyError, ProviderUnavailableError, ConversionError) as error:
            if isinstance(error, ProviderUnavailableError):
                unavailable.append(error)
            refused[candidate.label] = (
                error.finding if isinstance(error, AgreementError) else str(error)
            )
            logger.info("spacy-accelerate: auto precision: %s refused", candidate.label)
            continue
        served[candidate.label] = (candidate, [location.module for location in locations])
        for location, module in zip(locations, previous, strict=True):
            revert(location, module)
    tried = "; ".join(f"{label}: {why}" for label, why in refused.items())
    if not served and len(unavailable) == len(refused):
        raise ProviderUnavailableError(
            f"precision='auto' found no provider that can run here; tried: {tried}"
        )
    if not served:
        raise AccuracyError(f"precision='auto' found no plan that passes the gate; tried: {tried}")
    texts = timed_texts(source.texts or builtin_texts())
    turns: dict[str, list[float]] = {label: [] for label in served}
    racing = f"precision='auto': racing {', '.join(served)} on the calibration texts"
    for _ in progress.track(range(TURNS), racing):
        for label, (_candidate, modules) in served.items():
            with ExitStack() as stack:
                for location, module in zip(locations, modules, strict=True):
                    stack.enter_context(scoped(location, module))
                start = time.perf_counter()
                annotate(nlp, texts)
                turns[label].append(time.perf_counter() - start)
    seconds = {label: min(times) for label, times in turns.items()}
    winner = _fastest(seconds, {label: c for label, (c, _) in served.items()})
    for location, module in zip(locations, served[winner][1], strict=True):
        if isinstance(module, AcceleratedModule):
            patch(location, module)
        else:
            revert(location, module)
    return Choice(chosen=served[winner][0], seconds=seconds, refused=refused)


#: How much faster a lossy plan must be than the fastest exact (fp32) one to be chosen:
#: within that, the timing's noise could pick a plan that changes annotations for nothing.
LOSSY_MARGIN = 0.05


def _fastest(seconds: dict[str, float], candidates: dict[str, Candidate]) -> str:
    """The label of the fastest plan, an exact one unless a lossy one beats it by more
    than :data:`LOSSY_MARGIN`."""
    fastest = min(seconds, key=seconds.__getitem__)
    exact = [label for label in seconds if candidates[label].precision is Precision.FP32]
    if not exact or candidates[fastest].precision is Precision.FP32:
        return fastest
    best_exact = min(exact, key=seconds.__getitem__)
    if seconds[fastest] < seconds[best_exact] * (1 - LOSSY_MARGIN):
        return fastest
    return best_exact
