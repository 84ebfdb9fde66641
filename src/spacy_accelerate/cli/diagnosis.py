"""What this machine can run, and what to install for the rest: the report of the
``doctor`` command, gathered here and printed by :mod:`spacy_accelerate.cli.doctor`."""

from __future__ import annotations

import importlib
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from spacy_accelerate._version import __version__
from spacy_accelerate.backends.registry import (
    auto_order,
    backends,
    check_provider,
    install_hint,
    listed_providers,
)
from spacy_accelerate.cache.root import default_cache_dir
from spacy_accelerate.cli.terms import cli_message
from spacy_accelerate.cpu_features import cpu_features
from spacy_accelerate.errors import ProviderUnavailableError
from spacy_accelerate.options.config import Precision, Provider
from spacy_accelerate.options.providers import PROVIDERS
from spacy_accelerate.options.request import build_config
from spacy_accelerate.provision.listing import cache_size, list_cached

#: Packages whose versions matter for a report (each backend reports its runtime's).
PACKAGES = (
    "spacy",
    "spacy_curated_transformers",
    "spacy_transformers",
    "thinc",
    "torch",
    "transformers",
    "onnx",
    "nncf",
)


@dataclass(frozen=True)
class ProviderStatus:
    provider: Provider
    available: bool
    detail: str


@dataclass(frozen=True)
class Diagnosis:
    versions: dict[str, str | None]
    providers: list[ProviderStatus]
    gpu: str
    cache_dir: Path
    cache_entries: int
    cache_bytes: int
    #: Each backend's line: its runtime, release and what it says it can run here.
    runtimes: list[str] = field(default_factory=list)
    cpu: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The report as ``doctor --json`` prints it (plain JSON types only)."""
        return {
            "versions": dict(self.versions),
            "providers": [
                {"provider": s.provider.value, "available": s.available, "detail": s.detail}
                for s in self.providers
            ],
            "runtimes": list(self.runtimes),
            "cpu": self.cpu,
            "gpu": self.gpu,
            "cache": {
                "dir": str(self.cache_dir),
                "entries": self.cache_entries,
                "bytes": self.cache_bytes,
            },
        }


def _version(module: str) -> str | None:
    """The module's own version (onnxruntime ships under several distribution names),
    else its distribution's; None when it is not installed."""
    try:
        return str(importlib.import_module(module).__version__)
    except AttributeError:
        try:
            return metadata.version(module.replace("_", "-"))
        except metadata.PackageNotFoundError:
            return "installed (version unknown)"
    except Exception:  # an optional package may be missing or broken
        return None


def _gpu() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0)
            return f"{name} (CUDA {torch.version.cuda}, driver {_driver() or 'unknown'})"
    except Exception:  # a broken CUDA install must not break the report
        pass
    driver = _driver()
    return f"no CUDA device visible to torch (driver {driver})" if driver else "none"


def _driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def _cpu() -> str:
    """The CPU as the library's detection sees it (what int8 and bf16 run on), and where
    ``auto`` sends int8 on a CPU."""
    auto_int8 = next(
        provider.value
        for provider in auto_order(Precision.INT8)
        if not PROVIDERS.on_gpu(provider) and PROVIDERS.serves(provider, Precision.INT8)
    )
    return f"{cpu_features().describe()}; auto serves int8 with {auto_int8} first"


def _provider_status(provider: Provider) -> ProviderStatus:
    row = PROVIDERS[provider]
    try:
        check_provider(build_config(provider, row.precisions[0]))
    except ProviderUnavailableError as error:
        if provider in listed_providers():  # installed, but it cannot run here
            return ProviderStatus(provider, False, f"unusable: {cli_message(error)}")
        return ProviderStatus(provider, False, f"missing: {install_hint(provider)}")
    return ProviderStatus(provider, True, f"available ({row.summary})")


def diagnose(cache_dir: Path | None = None) -> Diagnosis:
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    versions: dict[str, str | None] = {
        "python": platform.python_version(),
        "spacy-accelerate": __version__,
    }
    versions.update({name.replace("_", "-"): _version(name) for name in PACKAGES})
    providers = [_provider_status(provider) for provider in PROVIDERS.names()]
    return Diagnosis(
        versions=versions,
        providers=providers,
        gpu=_gpu(),
        cpu=_cpu(),
        cache_dir=folder,
        cache_entries=len(list_cached(folder)),
        cache_bytes=cache_size(folder),
        runtimes=[backend.describe() for backend in backends()],
    )
