"""Where a parked module's weights are read back from (:mod:`.parked_weights`): the
component's ``model`` file in the pipeline folder it was loaded from or saved to
(:class:`SavedModelFile`, held open and checked by size, inode and modification time), or
an unnamed temporary file in the cache folder (:class:`TemporaryWeightsFile`); and the
memory parking frees, handed back to the system (:func:`return_freed_memory`)."""

from __future__ import annotations

import ctypes
import io
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
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

#: What to do about weights that cannot be read back.
RELOAD_ADVICE = (
    "Load the pipeline again (with config={'nlp': {'after_pipeline_creation': "
    "{'enabled': False}}} to keep it on PyTorch), and save accelerated "
    "pipelines with nlp.to_disk, which reads the weights back first."
)

#: What a model file that is not thinc's PyTorch format (any more) raises when parsed.
_UNREADABLE = (ValueError, KeyError, IndexError, TypeError, RuntimeError, pickle.UnpicklingError)


class WeightsSource(Protocol):
    """Where a parked module's weights are read back from."""

    @property
    def where(self) -> str:
        """The source, as a message names it."""
        ...

    def read(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The module's state, on ``device``."""
        ...


def load_state(data: bytes, device: torch.device) -> dict[str, torch.Tensor]:
    """A state saved by ``torch.save``, read onto ``device`` (tensors only)."""
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


def changed_since_parked(where: str) -> WeightsUnavailableError:
    """The error for a source that no longer holds the weights parked with it."""
    return WeightsUnavailableError(
        f"The PyTorch weights of this accelerated transformer were to be read back from "
        f"{where}, which no longer holds the weights parked there: what was read differs "
        f"from them (it was changed after they were parked). {RELOAD_ADVICE}"
    )


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

    @property
    def where(self) -> str:
        return str(self.path)

    def read(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The shim's state from the file; refused where the file visibly changed (its
        size, inode or modification time), before it is parsed. A change that kept those
        is caught by the digest :class:`ParkedWeights` checks."""
        if _identity(self.file) != self.identity:
            raise WeightsUnavailableError(
                f"The PyTorch weights of this accelerated transformer were to be read back "
                f"from {self.path}, which has been rewritten since the pipeline was loaded. "
                f"{RELOAD_ADVICE}"
            )
        try:
            saved = srsly.msgpack_loads(_read_all(self.file))
            shim_message = srsly.msgpack_loads(saved["shims"][self.node][self.shim])
            return load_state(shim_message["state"], device)
        except _UNREADABLE as error:
            raise changed_since_parked(self.where) from error

    def record(self) -> SavedFileRecord:
        """Where this file is, for a pickle (:meth:`SavedFileRecord.reopen`)."""
        return SavedFileRecord(self.path, self.node, self.shim, self.identity)


def _identity(file: IO[bytes]) -> tuple[int, int, int]:
    status = os.fstat(file.fileno())
    return status.st_ino, status.st_size, status.st_mtime_ns


@dataclass(frozen=True)
class SavedFileRecord:
    """A :class:`SavedModelFile` as a pickle carries it: its path, place and identity."""

    path: Path
    node: int
    shim: int
    identity: tuple[int, int, int]

    def reopen(self) -> SavedModelFile | None:
        """The same file, opened again where it is the very one recorded (same inode, size
        and modification time: an unpickled copy on the same machine); else None."""
        try:
            file = self.path.open("rb")
        except OSError:
            return None
        source = SavedModelFile(file, node=self.node, shim=self.shim, path=self.path)
        if source.identity != self.identity:
            file.close()
            return None
        return source


@dataclass
class TemporaryWeightsFile:
    """The state written once to an unnamed temporary file (see the module's docstring)."""

    file: IO[bytes]

    @classmethod
    def write(cls, module: torch.nn.Module, folder: Path) -> TemporaryWeightsFile:
        """``module``'s state, written to a new file in ``folder``."""
        return cls._written(folder, lambda file: torch.save(module.state_dict(), file))

    @classmethod
    def holding(cls, data: bytes, folder: Path) -> TemporaryWeightsFile:
        """A state already serialised by ``torch.save`` (a pickle's), written as it is."""
        return cls._written(folder, lambda file: file.write(data))

    @classmethod
    def _written(cls, folder: Path, write: Callable[[IO[bytes]], object]) -> TemporaryWeightsFile:
        file = tempfile.TemporaryFile(dir=folder)
        try:
            write(file)
            file.flush()
        except BaseException:
            file.close()
            raise
        return cls(file)

    @property
    def where(self) -> str:
        return "its temporary file in the cache folder"

    def read(self, device: torch.device) -> dict[str, torch.Tensor]:
        try:
            return load_state(_read_all(self.file), device)
        except _UNREADABLE as error:
            raise changed_since_parked(self.where) from error


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
