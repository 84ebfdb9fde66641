"""The PyTorch encoder's weights while a runtime serves it: out of memory, read back on demand.

Once a runtime serves a transformer, the PyTorch module is kept only for what needs its
weights: :func:`~spacy_accelerate.restore`, saving (thinc writes the module's state),
pickling, device moves and a new ``optimize()``. Holding its weights in memory meanwhile
doubles a serving process's model (trf-base: 341 MiB of PyTorch parameters beside the
runtime's own copy). So its parameters and persistent buffers are *parked*: replaced by
tensors on the ``meta`` device (shapes and dtypes, no storage; non-persistent buffers, which
no file holds, stay), and read back from a :class:`WeightsSource` when one of those needs
them:

- :class:`SavedModelFile`: the component's ``model`` file in the folder the pipeline was
  just loaded from (what ``spacy.load`` read the weights from). It is held open, so a
  deleted or renamed folder stays readable. Only thinc's own PyTorch format (a plain
  ``PyTorchShim``) is read this way: a shim with its own serialiser (spacy-transformers')
  uses the next source.
- :class:`TemporaryWeightsFile`: the state written once to an unnamed temporary file in the
  cache folder (about a second for trf-base), which the system removes when the process
  ends. A pipeline accelerated in this process has no other copy of its weights, and
  neither has an unpickled one whose original's file is not on its machine: the pickle
  carries the state's bytes, which the copy writes to such a file without loading them
  (:func:`park_unpickled`); a copy on the same machine reopens the original's
  :class:`SavedModelFile` instead, where it had one.

What is read back is checked, not trusted: parking records the SHA256 of the state it lets
go (:func:`~spacy_accelerate.export.fingerprint.state_digest`, about 60 ms for a 90 MB
model and 0.25 s for trf-base's 341 MiB, on one core), and a state read back with another
digest (a file rewritten in place, whatever its size and modification time say) is refused
with a :class:`WeightsUnavailableError`, the module left parked. A model file whose size,
inode or modification time changed is refused before it is read.

Reading for a save or a pickle is brief (:meth:`ParkedWeights.briefly_resident`): the
weights are parked again as soon as they are written, so ``nlp.to_disk`` and
``pickle.dumps(nlp)`` leave one copy resident, the runtime's. Where no source can be made (a
read-only cache), the weights stay in memory, said in one INFO line. Reading back is
``load_state_dict(assign=True)`` of the same tensors, so ``restore()`` gives PyTorch's
bit-identical outputs (``tests/test_parked_weights.py``).
"""

from __future__ import annotations

import copy
import io
import logging
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spacy_accelerate.cpu_budget import on_fork_in_child
from spacy_accelerate.export.fingerprint import state_digest
from spacy_accelerate.serving.weight_sources import (
    SavedFileRecord,
    SavedModelFile,
    TemporaryWeightsFile,
    WeightsSource,
    changed_since_parked,
    load_state,
    return_freed_memory,
)

logger = logging.getLogger("spacy_accelerate")

META = torch.device("meta")


@dataclass(frozen=True)
class PickledWeights:
    """A parked module's state as a pickle carries it: ``torch.save``'s bytes, the device
    it was parked from, the digest recorded when it was parked, and the pipeline folder's
    file it was parked with, if any (:func:`park_unpickled`)."""

    data: bytes
    device: torch.device
    digest: str
    saved: SavedFileRecord | None = None


class ParkedWeights:
    """One module's parameters and persistent buffers, parked on the ``meta`` device
    while ``source`` can give them back, checked against the digest recorded when they
    were parked (see the module's docstring). Thread-safe: a proxy's copies share it."""

    def __init__(self, module: torch.nn.Module, source: WeightsSource) -> None:
        self.module = module
        self.source = source
        self._lock = threading.RLock()
        _EVERY.add(self)
        self._device: torch.device | None = None
        #: SHA256 of the state parked (:func:`state_digest`); what ``source`` must give back.
        self._digest: str | None = None

    @property
    def parked(self) -> bool:
        return self._device is not None

    def park(self) -> None:
        """Let the module's state go from memory, its digest recorded now."""
        self._park(None)

    def _park(self, digest: str | None) -> None:
        """Park with ``digest`` (None: computed here), the state's where it is known."""
        with self._lock:
            if self._device is not None:
                return
            state = self.module.state_dict()
            devices = {tensor.device for tensor in state.values()}
            if len(devices) != 1 or META in devices:
                return  # nothing to park, or spread over devices: left as it is
            self._digest = state_digest(state) if digest is None else digest
            self._device = devices.pop()
            empty = {name: torch.empty_like(tensor, device=META) for name, tensor in state.items()}
            self.module.load_state_dict(empty, assign=True)

    def resident(self) -> torch.nn.Module:
        """The module with its weights, read back (and kept) where they were parked; a
        state that is not the one parked is refused, the module left parked."""
        with self._lock:
            if self._device is not None:
                state = self.source.read(self._device)
                if state_digest(state) != self._digest:
                    raise changed_since_parked(self.source.where)
                self.module.load_state_dict(state, assign=True)
                self._device = None
            return self.module

    def room_for_a_load(self) -> torch.nn.Module:
        """A copy of the module whose parked state is uninitialised memory (never read
        back), for a load that writes every entry of it: where the parked state can no
        longer be read (its folder rewritten). The module itself stays parked."""
        with self._lock:
            room = copy.deepcopy(self.module)  # parked: shapes only, nothing copied
            device = self._device
        if device is not None:
            state = room.state_dict()
            empty = {name: torch.empty_like(t, device=device) for name, t in state.items()}
            room.load_state_dict(empty, assign=True)  # non-persistent buffers kept as held
        return room

    @contextmanager
    def briefly_resident(self) -> Iterator[torch.nn.Module]:
        """The module with its weights for the ``with`` block, which only reads them, parked
        again after it with the digest they were checked against (a save or a pickle reads
        the state once and leaves one copy resident)."""
        with self._lock:
            was_parked, digest = self.parked, self._digest
            try:
                yield self.resident()
            finally:
                if was_parked:
                    self._park(digest)
                    return_freed_memory()

    def pickled(self) -> PickledWeights | None:
        """The parked state, read back briefly and serialised for a pickle; None where the
        module holds its weights (they are pickled with it)."""
        with self._lock:
            if self._device is None or self._digest is None:
                return None
            device, digest, buffer = self._device, self._digest, io.BytesIO()
            with self.briefly_resident() as module:
                torch.save(module.state_dict(), buffer)
            saved = self.source.record() if isinstance(self.source, SavedModelFile) else None
            return PickledWeights(buffer.getvalue(), device, digest, saved)

    @classmethod
    def parked_with(
        cls,
        module: torch.nn.Module,
        source: WeightsSource,
        device: torch.device | None,
        digest: str | None,
    ) -> ParkedWeights:
        """``module``, whose state is already parked from ``device`` (None: it holds its
        weights) with ``source`` holding the state of SHA256 ``digest``."""
        made = cls(module, source)
        made._device, made._digest = device, digest
        return made

    def deep_copy(self, memo: dict[int, Any]) -> ParkedWeights:
        """A copy of the module (``copy.deepcopy``, parked state as shapes only) and of this
        record, with the same source and a lock of its own. Both are copied under the lock,
        so that a read-back or a parking in another thread is never half in the copy (a
        module copied parked, recorded as holding its weights)."""
        with self._lock:
            module = copy.deepcopy(self.module, memo)
            return ParkedWeights.parked_with(module, self.source, self._device, self._digest)


def park_unpickled(
    module: torch.nn.Module, pickled: PickledWeights, scratch: Path
) -> ParkedWeights | None:
    """An unpickled copy's weights, ``module`` (its structure) parked with: the pipeline
    folder's file the original's were parked with, where it is the very one (a copy on
    the same machine: nothing written); else the pickle's state written as it is to a
    temporary file in ``scratch`` (the cache folder), never loaded. Where no file can be
    written there, the state is loaded into ``module`` and kept in memory (None returned),
    as :mod:`spacy_accelerate.pipeline.parking` does for a pipeline."""
    source = pickled.saved.reopen() if pickled.saved is not None else None
    if source is not None:
        return ParkedWeights.parked_with(module, source, pickled.device, pickled.digest)
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        written = TemporaryWeightsFile.holding(pickled.data, scratch)
    except OSError as error:
        logger.info(
            "spacy-accelerate: an unpickled transformer keeps its PyTorch weights in memory "
            "beside the accelerated model: no temporary file could be written in %s (%s).",
            scratch,
            error,
        )
        state = load_state(pickled.data, pickled.device)
        if state_digest(state) != pickled.digest:
            raise changed_since_parked("the pickle it was unpickled from") from None
        module.load_state_dict(state, assign=True)
        return None
    return ParkedWeights.parked_with(module, written, pickled.device, pickled.digest)


#: Every parked module's record in this process, for :func:`_after_fork_in_child`.
_EVERY: weakref.WeakSet[ParkedWeights] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a forked child: fresh locks (one a parent's thread held at the fork, reading the
    weights back or parking them, would stay held there for good)."""
    for parked in list(_EVERY):
        parked._lock = threading.RLock()


on_fork_in_child(_after_fork_in_child)
