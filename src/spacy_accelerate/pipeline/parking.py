"""Which source each served transformer's PyTorch weights are parked with, and when.

:mod:`spacy_accelerate.serving.parked_weights` is the mechanism; this is the policy.
After ``optimize()`` and
after every load, each accelerated transformer's weights are parked: with the pipeline
folder they were just loaded from where there is one (nothing written), else with a
temporary file in the cache folder. ``nlp.to_disk`` reads them back before spaCy writes
(a save into the very folder they would be read from truncates that file first), then
parks them with the folder just written (unless ``exclude`` left the transformer out of it).
A component saved on its own (``nlp.get_pipe(name).to_disk``) into the folder its weights
are parked in loses them: thinc truncates the file before it asks for them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from spacy.language import Language
from thinc.api import Model

from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.patch import ServedTransformer
from spacy_accelerate.pipeline.shim import ShimLocation, find_shim
from spacy_accelerate.serving.proxy import AcceleratedModule
from spacy_accelerate.serving.weight_sources import (
    TemporaryWeightsFile,
    WeightsSource,
    return_freed_memory,
    saved_model_file,
)

logger = logging.getLogger("spacy_accelerate")


def park_served_weights(
    served: Iterable[ServedTransformer], folder: Path | None, scratch: Path
) -> None:
    """Park the PyTorch weights of the ``served`` transformers: read back from ``folder``
    (the pipeline folder they were loaded from or saved to, None where there is none)
    where it holds them in thinc's format, else from a temporary file written in
    ``scratch`` (the cache folder); kept in memory where neither can be had."""
    for each in served:
        if not each.proxy.parks_weights:
            continue
        source = _source(each.location, each.component.pipe.model, folder, each.proxy, scratch)
        if source is not None:
            each.proxy.original.park(source)
    return_freed_memory()


def _source(
    location: ShimLocation,
    model: Model,
    folder: Path | None,
    proxy: AcceleratedModule,
    scratch: Path,
) -> WeightsSource | None:
    if folder is not None:
        saved = saved_model_file(folder, location.component, model, location.shim)
        if saved is not None:
            return saved
    parking = proxy.parking
    if parking is not None and parking.parked and isinstance(parking.source, TemporaryWeightsFile):
        return parking.source  # holds these weights still (nothing moved them since)
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        return TemporaryWeightsFile.write(proxy.read_original(), scratch)
    except OSError as error:
        logger.info(
            "spacy-accelerate: %s keeps its PyTorch weights in memory beside the "
            "accelerated model: no temporary file could be written in %s (%s).",
            location.component,
            scratch,
            error,
        )
        return None


def read_back_weights(nlp: Language) -> None:
    """Every parked weight of ``nlp`` back in memory (before a save)."""
    for component in transformer_components(nlp):
        proxy = find_shim(component).module
        if isinstance(proxy, AcceleratedModule):
            _ = proxy.read_original()  # reads them back
