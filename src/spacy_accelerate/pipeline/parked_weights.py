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
  deleted or renamed folder stays readable; a file rewritten in place since (checked by
  its size and modification time) is refused with a :class:`WeightsUnavailableError`
  rather than read. Only thinc's own PyTorch format (a plain ``PyTorchShim``) is read this
  way: a shim with its own serialiser (spacy-transformers') uses the next source.
- :class:`TemporaryWeightsFile`: the state written once to an unnamed temporary file in the
  cache folder (about a second for trf-base), which the system removes when the process
  ends. A pipeline accelerated in this process has no other copy of its weights.

Where neither can be made (a read-only cache), the weights stay in memory, said in one INFO
line. Reading back is ``load_state_dict(assign=True)`` of the same tensors, so
``restore()`` gives PyTorch's bit-identical outputs (``tests/test_parked_weights.py``).
"""

from __future__ import annotations

import ctypes
import io
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

import srsly
import torch
from thinc.api import Model
from thinc.shims import PyTorchShim
from thinc.shims.pytorch import default_deserialize_torch_model

from spacy_accelerate.errors import WeightsUnavailableError

#: Where spaCy saves a trainable component's thinc model, under the component's folder.
MODEL_FILE = "model"
META = torch.device("meta")


class WeightsSource(Protocol):
    """Where a parked module's weights are read back from."""

    def read(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The module's state, on ``device``."""
        ...


def _load_state(data: bytes, device: torch.device) -> dict[str, torch.Tensor]:
    buffer = io.BytesIO(data)
    state: dict[str, torch.Tensor] = torch.load(buffer, map_location=device, weights_only=True)
    return state


def _read_all(file: IO[bytes]) -> bytes:
    """The whole of ``file``, read at explicit offsets: a forked worker shares the file's
    position with its parent, so a seek and a read could interleave with theirs."""
    size, chunks, done = os.fstat(file.fileno()).st_size, [], 0
    while done < size:
        chunk = os.pread(file.fileno(), size - done, done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


@dataclass
class SavedModelFile:
    """The component's thinc ``model`` file in a pipeline folder (see the module's
    docstring); ``node`` is the shim's layer in the model's ``walk()`` order and ``shim``
    its place among that layer's shims, as thinc writes them."""

    file: IO[bytes]
    node: int
    shim: int
    path: Path

    def __post_init__(self) -> None:
        self.identity = _identity(self.file)

    def read(self, device: torch.device) -> dict[str, torch.Tensor]:
        if _identity(self.file) != self.identity:
            raise WeightsUnavailableError(
                f"The PyTorch weights of this accelerated transformer were to be read back "
                f"from {self.path}, which has been rewritten since the pipeline was loaded. "
                "Load the pipeline again (with config={'nlp': {'after_pipeline_creation': "
                "{'enabled': False}}} to keep it on PyTorch), and save accelerated "
                "pipelines with nlp.to_disk, which reads the weights back first."
            )
        saved = srsly.msgpack_loads(_read_all(self.file))
        shim_message = srsly.msgpack_loads(saved["shims"][self.node][self.shim])
        return _load_state(shim_message["state"], device)


def _identity(file: IO[bytes]) -> tuple[int, int, int]:
    status = os.fstat(file.fileno())
    return status.st_ino, status.st_size, status.st_mtime_ns


@dataclass
class TemporaryWeightsFile:
    """The state written once to an unnamed temporary file (see the module's docstring)."""

    file: IO[bytes]

    @classmethod
    def write(cls, module: torch.nn.Module, folder: Path) -> TemporaryWeightsFile:
        file = tempfile.TemporaryFile(dir=folder)
        try:
            torch.save(module.state_dict(), file)
            file.flush()
        except BaseException:
            file.close()
            raise
        return cls(file)

    def read(self, device: torch.device) -> dict[str, torch.Tensor]:
        return _load_state(_read_all(self.file), device)


def return_freed_memory() -> None:
    """Hand the memory freed by parking back to the system. glibc keeps freed blocks below
    its mmap threshold in its heap, where they still count in the process's RSS (177 MiB
    of trf-base's parked weights, measured for issue 54); ``malloc_trim`` returns them. A
    no-op where the C library has none (macOS, musl)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def saved_model_file(
    folder: Path, component: str, model: Model, shim: PyTorchShim
) -> SavedModelFile | None:
    """The source for ``shim`` in ``component``'s folder of the pipeline folder ``folder``
    (``model``: the component's thinc model, as saved there), where thinc's own format
    holds it and the file can be opened; else None."""
    if (
        type(shim) is not PyTorchShim
        or shim._deserialize_model is not default_deserialize_torch_model
    ):
        return None
    node, owner = next((i, layer) for i, layer in enumerate(model.walk()) if shim in layer.shims)
    path = folder / component / MODEL_FILE
    try:
        file = path.open("rb")
    except OSError:
        return None
    return SavedModelFile(file, node=node, shim=owner.shims.index(shim), path=path)


class ParkedWeights:
    """One module's parameters and persistent buffers, parked on the ``meta`` device
    while ``source`` can give them back (see the module's docstring). Thread-safe: a
    proxy's copies share it."""

    def __init__(self, module: torch.nn.Module, source: WeightsSource) -> None:
        self.module = module
        self.source = source
        self._lock = threading.RLock()
        self._device: torch.device | None = None

    @property
    def parked(self) -> bool:
        return self._device is not None

    def park(self) -> None:
        with self._lock:
            if self._device is not None:
                return
            state = self.module.state_dict()
            devices = {tensor.device for tensor in state.values()}
            if len(devices) != 1 or META in devices:
                return  # nothing to park, or spread over devices: left as it is
            self._device = devices.pop()
            empty = {name: torch.empty_like(tensor, device=META) for name, tensor in state.items()}
            self.module.load_state_dict(empty, assign=True)

    def resident(self) -> torch.nn.Module:
        """The module with its weights, read back (and kept) where they were parked."""
        with self._lock:
            if self._device is not None:
                self.module.load_state_dict(self.source.read(self._device), assign=True)
                self._device = None
            return self.module

    @contextmanager
    def briefly_resident(self) -> Iterator[torch.nn.Module]:
        """The module with its weights for the ``with`` block, parked again after it (a save
        reads the state once)."""
        with self._lock:
            was_parked = self.parked
            try:
                yield self.resident()
            finally:
                if was_parked:
                    self.park()

    def copy_for(self, module: torch.nn.Module) -> ParkedWeights:
        """The same source for a copy of the module (``copy.deepcopy`` of the proxy)."""
        copied = ParkedWeights(module, self.source)
        copied._device = self._device
        return copied
