"""The ONNX export of one transformer, made once per ``optimize()`` call.

A search over several plans (``precision="auto"``'s candidates, a fallback chain) builds
several cache entries from the same weights, and every one starts from the same exported
graph: tracing a RoBERTa-base encoder to ONNX takes seconds each time. The first build
exports it into a scratch folder; the others copy it into their own build folder.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from spacy_accelerate import progress
from spacy_accelerate.architectures import DetectedEncoder
from spacy_accelerate.export.onnx import export_onnx


class SharedExport:
    """One encoder's export per opset, kept in a scratch folder until :meth:`close`."""

    def __init__(self, detected: DetectedEncoder) -> None:
        self.detected = detected
        self.folders: dict[int, Path] = {}

    def write(self, path: Path, opset: int) -> None:
        """The exported model at ``path`` (its files beside it), exported on first use."""
        folder = self.folders.get(opset)
        if folder is None:
            folder = Path(tempfile.mkdtemp(prefix="spacy-accelerate-export-"))
            spec = self.detected.spec
            with progress.step(f"exporting the {spec.family} encoder to ONNX"):
                model = self.detected.architecture.to_hugging_face(self.detected.encoder, spec)
                export_onnx(model, spec, folder / path.name, opset=opset)
            self.folders[opset] = folder
        for exported in folder.iterdir():  # the graph, and any external weights beside it
            shutil.copyfile(exported, path.parent / exported.name)

    def close(self) -> None:
        for folder in self.folders.values():
            shutil.rmtree(folder, ignore_errors=True)
        self.folders.clear()
