"""``precision="auto"``: the fastest plan on this machine that passes the accuracy gate.

The candidates are every precision the provider serves (every usable provider's, for
``provider="auto"``): fp32, bf16 where the CPU has it, int8, fp16 on a GPU. Each is
built (or read from the cache) and judged as if asked for by name: a lossy plan must
keep the pipeline's annotations of the calibration texts (``min_agreement``), fp32 its
parity. The search (:class:`~.auto_search.AutoSearch`) stops where a candidate cannot win: the exact
plans are served first, and every lossy build then races the plan that would be served
so far before it is judged (an int8 search skips its ladder where its all-int8 plan
cannot win; see :mod:`~spacy_accelerate.verify.plan_search`). The ones that pass are
timed side by side on the calibration texts, in turns, and the fastest is served, a
lossier one only where it is faster by a margin. ``optimize()`` logs the plan that won
and why each other one lost.

The choice is stored as a cache entry of its own, keyed by everything it depends on:
the transformers' weights, the pipeline's other components, the calibration texts and
bounds, the request, the package versions, the thread count and the CPU's features. A
warm start reads it and builds only the chosen plan (a cache hit); a CPU with other
features searches again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from spacy.language import Language

from spacy_accelerate.cache.store import CacheEntry, ModelCache
from spacy_accelerate.cache.untrusted import CorruptEntry, read_json_object
from spacy_accelerate.cpu_features import cpu_features
from spacy_accelerate.errors import (
    AccuracyError,
    CacheError,
    ConversionError,
    ProviderUnavailableError,
)
from spacy_accelerate.export.fingerprint import cache_key, package_versions, weights_digest
from spacy_accelerate.options.config import OptimizeConfig
from spacy_accelerate.options.providers import PROVIDERS
from spacy_accelerate.pipeline.patch import revert
from spacy_accelerate.pipeline.shim import ShimLocation
from spacy_accelerate.planning.auto_search import (
    Accelerate,
    AutoSearch,
    Candidate,
    Choice,
)
from spacy_accelerate.planning.judging import CalibrationSource
from spacy_accelerate.verify.record import BuildRecord

logger = logging.getLogger("spacy_accelerate")

#: The file of a choice entry.
CHOICE_FILE = "auto_precision.json"


def _stored_choice(entry: CacheEntry) -> Choice:
    """The choice stored in ``entry``, or a :class:`CacheError` where it cannot be read."""
    try:
        return Choice.from_dict(read_json_object(entry.file(CHOICE_FILE)))
    except (CorruptEntry, KeyError, TypeError, ValueError, AttributeError) as error:
        raise CacheError(
            f"The stored auto precision choice in {entry.path} cannot be read ({error}). "
            "Remove the entry (spacy-accelerate cache clear) so that it is searched again."
        ) from None


def choice_inputs(
    config: OptimizeConfig,
    candidates: Sequence[Candidate],
    locations: Sequence[ShimLocation],
    source: CalibrationSource,
) -> dict[str, Any]:
    """What a stored choice depends on (its key): a change to any of these searches anew."""
    cpu = cpu_features()
    on_gpu = any(PROVIDERS.on_gpu(candidate.provider) for candidate in candidates)
    usable = on_gpu and torch.cuda.is_available()
    gpu = torch.cuda.get_device_name(config.gpu.device_id or 0) if usable else None
    return {
        "auto_precision": 3,  # 3: lossier plans beat less lossy ones by the margin
        "workload": config.workload.value,
        "candidates": [candidate.label for candidate in candidates],
        "weights_sha256": [
            weights_digest(location.read_pytorch_module()) for location in locations
        ],
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
    accelerate: Accelerate,
) -> Choice:
    """Serve the stored choice for this request, or search, store and serve one.
    ``accelerate`` serves one concrete request (all components, all or nothing). On any
    failure the pipeline is left as it was."""
    inputs = choice_inputs(config, candidates, locations, source)
    key = cache_key(inputs)
    previous = [location.module for location in locations]
    found: list[Choice] = []

    def search(folder: Path) -> dict[str, Any]:
        choice = AutoSearch(nlp, config, locations, source, accelerate).run(candidates)
        found.append(choice)
        (folder / CHOICE_FILE).write_text(json.dumps(choice.as_dict(), indent=2))
        return BuildRecord(chosen=choice.chosen.label).as_dict()

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
        choice = _stored_choice(result.entry)
        try:
            accelerate(choice.chosen.asked_in(config), {})
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
            choice = _stored_choice(rebuilt.entry)
            accelerate(choice.chosen.asked_in(config), {})
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
