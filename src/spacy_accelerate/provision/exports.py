"""The ONNX export of one transformer, made once per ``optimize()`` call.

A search over several plans (``precision="auto"``'s candidates, a fallback chain) builds
several cache entries from the same weights, and every one starts from the same exported
graph: tracing a RoBERTa-base encoder to ONNX takes seconds each time. The first build
exports it into a scratch folder; each backend then reads it there (:class:`Export`):
one that rewrites the graph copies it into its build folder first, one that converts it
(OpenVINO) reads it in place, and what a backend derives from it in memory (OpenVINO's
converted model) is kept for the other builds of the same call, not made again. Files a
backend writes from it that are the same for several entries (OpenVINO's IR, the same
for its fp32 and bf16 plans) are written by the first build and hard-linked into the
next (:meth:`Export.written`): entries never change a file after it is stored, and
removing one entry leaves the other's links whole.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from spacy_accelerate import progress
from spacy_accelerate.architectures import DetectedEncoder
from spacy_accelerate.export.onnx import export_onnx

T = TypeVar("T")

logger = logging.getLogger("spacy_accelerate")


class Export:
    """One exported ONNX model in the scratch folder: read by the builds, never written
    (see :class:`spacy_accelerate.backends.base.ExportedGraph`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._derived: dict[str, Any] = {}
        #: Per name, a scratch folder of hard links to the files :meth:`written` wrote
        #: (None: they could not be linked there).
        self._written: dict[str, Path | None] = {}

    def copy_to(self, path: Path) -> None:
        """The exported files (the graph, and any external weights beside it) in
        ``path``'s folder, the graph named as ``path``."""
        for exported in self.path.parent.iterdir():
            target = path if exported == self.path else path.parent / exported.name
            shutil.copyfile(exported, target)

    def derived(self, name: str, make: Callable[[Path], T]) -> T:
        """``make(path)``, made once per export: each caller must leave it unchanged."""
        if name not in self._derived:
            self._derived[name] = make(self.path)
        return cast(T, self._derived[name])

    def written(self, name: str, folder: Path, write: Callable[[Path], None]) -> None:
        """The files ``write(folder)`` writes into ``folder``, written once per export:
        a later call links the first call's files into its folder. Where they cannot be
        linked (the cache on another filesystem than the scratch folders), each call
        writes its own."""
        kept = self._written.get(name)
        if kept is not None and _linked(kept, folder):
            return
        before = set(folder.iterdir())
        write(folder)
        if name not in self._written:
            self._written[name] = _kept(sorted(set(folder.iterdir()) - before))

    def close(self) -> None:
        """Remove the export's scratch folders (the entries' links stay whole)."""
        for kept in self._written.values():
            if kept is not None:
                shutil.rmtree(kept, ignore_errors=True)
        self._written.clear()
        shutil.rmtree(self.path.parent, ignore_errors=True)


def _kept(files: list[Path]) -> Path | None:
    """A scratch folder holding a hard link to each of ``files`` (None where one cannot
    be made there)."""
    kept = Path(tempfile.mkdtemp(prefix="spacy-accelerate-written-"))
    try:
        for file in files:
            os.link(file, kept / file.name)
    except OSError as error:
        logger.debug("spacy-accelerate: %s not kept for the next build (%s)", files, error)
        shutil.rmtree(kept, ignore_errors=True)
        return None
    return kept


def _linked(kept: Path, folder: Path) -> bool:
    """Whether every file of ``kept`` could be hard-linked into ``folder`` (if not, none
    is left there)."""
    files = sorted(kept.iterdir())
    try:
        for file in files:
            os.link(file, folder / file.name)
    except OSError as error:
        logger.debug("spacy-accelerate: %s not linked into %s (%s)", kept, folder, error)
        for file in files:
            (folder / file.name).unlink(missing_ok=True)
        return False
    return True


class SharedExport:
    """One encoder's export per opset, kept in a scratch folder until :meth:`close`."""

    def __init__(self, detected: DetectedEncoder) -> None:
        self.detected = detected
        self.exports: dict[int, Export] = {}

    def at(self, opset: int, name: str) -> Export:
        """The export for ``opset`` (its graph named ``name``), exported on first use."""
        export = self.exports.get(opset)
        if export is None:
            folder = Path(tempfile.mkdtemp(prefix="spacy-accelerate-export-"))
            spec = self.detected.spec
            with progress.step(f"exporting the {spec.family} encoder to ONNX"):
                model = self.detected.architecture.to_hugging_face(self.detected.encoder, spec)
                export_onnx(model, spec, folder / name, opset=opset)
            export = self.exports[opset] = Export(folder / name)
        return export

    def close(self) -> None:
        for export in self.exports.values():
            export.close()
        self.exports.clear()
