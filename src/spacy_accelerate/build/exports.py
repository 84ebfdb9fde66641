"""The ONNX export of one transformer, made once per ``optimize()`` call.

A search over several plans (``precision="auto"``'s candidates, a fallback chain) builds
several cache entries from the same weights, and every one starts from the same exported
graph: tracing a RoBERTa-base encoder to ONNX takes seconds each time. The first build
exports it into a scratch folder; each backend then reads it there (:class:`Export`):
one that rewrites the graph copies it into its build folder first, one that converts it
(OpenVINO) reads it in place, and what a backend derives from it in memory (OpenVINO's
converted model) is kept for the other builds of the same call, not made again.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from spacy_accelerate import progress
from spacy_accelerate.architectures import DetectedEncoder
from spacy_accelerate.export.onnx import export_onnx

T = TypeVar("T")


class Export:
    """One exported ONNX model in the scratch folder: read by the builds, never written
    (see :class:`spacy_accelerate.backends.base.ExportedGraph`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._derived: dict[str, Any] = {}

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
            shutil.rmtree(export.path.parent, ignore_errors=True)
        self.exports.clear()
