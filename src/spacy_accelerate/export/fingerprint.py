"""The cache key: what makes two exported models interchangeable.

The key hashes the weights' bytes, not the pipeline's name or version: a
fine-tuned model with the same metadata must not reuse a stale export. The
spec, the export options and the versions of every package that shapes the
exported file are hashed with them.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Mapping
from typing import Any

import torch

from spacy_accelerate._version import __version__
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.export.onnx import EXPORT_FORMAT_VERSION

#: Modules whose version changes the exported file or how it is run. Read from
#: the imported module, not the distribution metadata: onnxruntime comes as
#: onnxruntime, onnxruntime-gpu or onnxruntime-openvino, all importing as one.
KEY_MODULES = ("torch", "transformers", "onnx", "onnxruntime")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"spacy-accelerate": __version__}
    for name in KEY_MODULES:
        try:
            versions[name] = importlib.import_module(name).__version__
        except ImportError:
            versions[name] = None
    return versions


def weights_digest(module: torch.nn.Module) -> str:
    """SHA256 over every tensor of ``module``'s state, in name order."""
    return state_digest(module.state_dict())


def state_digest(state: Mapping[str, torch.Tensor]) -> str:
    """SHA256 over every tensor of a module's ``state`` (names, dtypes, shapes and bytes),
    in name order: :func:`weights_digest`, for a state read back without its module
    (:mod:`spacy_accelerate.serving.parked_weights`). About 1.5 GB/s on one core."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        data = tensor.detach().to("cpu").contiguous()
        header = json.dumps([name, str(data.dtype), list(data.shape)])
        digest.update(header.encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def key_inputs(
    module: torch.nn.Module, spec: EncoderSpec, export_options: Mapping[str, Any]
) -> dict[str, Any]:
    """Everything the key is made of, kept readable in the cache manifest."""
    return {
        "weights_sha256": weights_digest(module),
        "encoder": {"class": type(module).__qualname__, **spec.as_dict()},
        "export": {"format": EXPORT_FORMAT_VERSION, **export_options},
        "versions": package_versions(),
    }


def cache_key(inputs: Mapping[str, Any]) -> str:
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
