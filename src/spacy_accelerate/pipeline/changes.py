"""Every change the library makes to objects it does not own, each with its undo beside it.

spaCy's ``Language`` (its methods and config), thinc's layers (their forward and
attributes) and shims (their module), and the PyTorch module's weights: :data:`CHANGES`
lists what ``optimize()``, a load and ``bench`` change, in the order they are made, each
with the function that makes it and the one that undoes it on a whole pipeline.
:func:`restore` runs every undo, the last change first, and leaves the pipeline as it was
before (``tests/test_restore_equality.py`` compares it with one never optimized).
``tests/test_changes.py`` reads this table: a change without an undo, or a change to a
foreign object made outside the modules of these functions, fails it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from spacy.language import Language

from spacy_accelerate.cache.root import resolve_cache_dir
from spacy_accelerate.options.request import OptimizeRequest
from spacy_accelerate.pipeline.layer_mix import install_layer_mixes, remove_layer_mixes
from spacy_accelerate.pipeline.parking import park_served_weights, read_back_weights
from spacy_accelerate.pipeline.patch import (
    ServedTransformer,
    guard,
    patch,
    remove_stand_ins,
    stand_in,
    unguard_all,
)
from spacy_accelerate.pipeline.persist import (
    ApiCalls,
    forget,
    install_load_hooks,
    record,
    remove_load_hooks,
    unpatch_all,
)
from spacy_accelerate.pipeline.pipe import install_pipe, remove_pipe
from spacy_accelerate.pipeline.training_guard import (
    install_training_guards,
    remove_training_guards,
)


@dataclass(frozen=True)
class Change:
    """One change to objects the library does not own: what it changes, the function that
    makes it, and the one that undoes it on a pipeline (a no-op where it was not made)."""

    what: str
    install: Callable[..., object]
    undo: Callable[[Language], object]


CHANGES: tuple[Change, ...] = (
    Change(
        "each transformer layer's forward (the swap guard) and its convert_inputs (the "
        "all-layers flag)",
        guard,
        unguard_all,
    ),
    Change("a comparison's module in a transformer's shim (bench)", stand_in, remove_stand_ins),
    Change("the accelerated module in each transformer's shim", patch, unpatch_all),
    Change(
        "the PyTorch module's weights, parked on the meta device",
        park_served_weights,
        read_back_weights,
    ),
    Change(
        "nlp's training methods (the inference-only guard)",
        install_training_guards,
        remove_training_guards,
    ),
    Change("each all-layer listener's layer mix", install_layer_mixes, remove_layer_mixes),
    Change("the optimize() record in nlp.config", record, forget),
    Change("nlp's load and save methods", install_load_hooks, remove_load_hooks),
    Change(
        "nlp.pipe (in worker processes sharing the CPUs, or overlapped)", install_pipe, remove_pipe
    ),
)


def restore(nlp: Language) -> Language:
    """Undo ``optimize()`` (and ``bench``'s comparisons): the pipeline as it was before,
    its PyTorch transformers with their weights, thinc's own forward and
    ``convert_inputs``, training, ``nlp.pipe`` and a plain saved config. A no-op on a
    plain pipeline."""
    for change in reversed(CHANGES):
        change.undo(nlp)
    return nlp


def remember(
    nlp: Language,
    served: Sequence[ServedTransformer],
    request: OptimizeRequest,
    calls: ApiCalls,
    folder: Path | None,
) -> None:
    """Step 12, once ``served`` (every transformer of ``nlp``) runs accelerated: make the
    acceleration part of the pipeline: guarded against training, its all-layer listeners
    mixing each document unpadded, ``request`` recorded in its config for ``to_disk``,
    applied again (through ``calls``) when new weights are loaded, and its PyTorch weights
    out of memory while it is served (read back from ``folder``, the pipeline folder it
    was loaded from, where there is one)."""
    install_training_guards(nlp)
    install_layer_mixes([each.component for each in served])
    record(nlp, request)
    install_load_hooks(nlp, request, calls, from_file=False)
    park_served_weights(served, folder, resolve_cache_dir(request.cache_dir))
