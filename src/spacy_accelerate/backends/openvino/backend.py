"""OpenVINO on the CPU: fp32, bf16 and calibrated int8 (see :mod:`.session`,
:mod:`.quantize`).

The exported ONNX file is converted once to OpenVINO's IR, stored in the cache entry
instead of the ONNX file. OpenVINO's compiled blobs are derived folders
(:mod:`spacy_accelerate.cache.derived`),
``<cache_dir>/openvino/<cpu>-<openvino>/<key>/``, and checked against their recorded
sha256 before each compile (:mod:`.blobs`); they go when the entry is evicted or the
cache cleared.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.backends.base import Backend, BuildJob
from spacy_accelerate.backends.openvino.blobs import SUMS_FILE, checked_blobs
from spacy_accelerate.backends.openvino.quantize import quantize_within_gate
from spacy_accelerate.backends.openvino.session import (
    EXTRA,
    INSTALL_HINT,
    IR_FILE,
    OpenVINOLayout,
    OpenVINOSession,
    check_precision,
    convert_to_ir,
    cpu_capabilities,
    cpu_slug,
    import_openvino,
    openvino_key,
)
from spacy_accelerate.cache.derived import DerivedFolders
from spacy_accelerate.cache.store import ModelCache
from spacy_accelerate.cpu_features import CpuFeatures
from spacy_accelerate.errors import CacheError, SpacyAccelerateError
from spacy_accelerate.options.config import OptimizeConfig, Precision, Provider
from spacy_accelerate.options.providers import PROVIDERS, ProviderSpec
from spacy_accelerate.runtime.buckets import BucketPlan
from spacy_accelerate.runtime.providers import ResolvedProvider
from spacy_accelerate.runtime.session import Session, SessionLayout
from spacy_accelerate.verify.record import BuiltModel

logger = logging.getLogger("spacy_accelerate")


#: OpenVINO's compiled blobs, a folder per CPU model and OpenVINO release, then per key
#: (folders of the release before the mark are known by their record of the blobs).
OPENVINO_BLOBS = DerivedFolders(name="openvino", label="openvino-blobs", legacy_record=SUMS_FILE)


#: The precisions at which OpenVINO beats ONNX Runtime's CPU provider on Intel CPUs:
#: static int8 (ONNX Runtime's CPU int8 is dynamic) and bf16 (ONNX Runtime serves none).
#: At fp32 both run at the same speed, and ONNX Runtime is the lighter dependency
#: (docs/performance.md, benchmarks/results/).
FIRST_ON_INTEL: frozenset[Precision] = frozenset({Precision.INT8, Precision.BF16})


class OpenVINOBackend(Backend):
    """OpenVINO's CPU plugin over the IR of the exported model."""

    derived_folders = (OPENVINO_BLOBS,)

    def auto_rank(self, row: ProviderSpec, precision: Precision, cpu: CpuFeatures) -> float:
        """Before every other CPU provider on an Intel CPU at int8 and bf16, where it uses
        the AMX/VNNI units through static quantization and bf16 kernels; the table's rank
        (after ONNX Runtime) everywhere else: AMD and ARM CPUs, fp32."""
        if cpu.vendor == "GenuineIntel" and precision in FIRST_ON_INTEL:
            cpu_ranks = [other.auto_rank for other in PROVIDERS if not other.gpu]
            return min(cpu_ranks) - 0.5
        return row.auto_rank

    def install_hint(self, provider: Provider) -> str:
        return INSTALL_HINT

    def pip_extra(self, provider: Provider) -> str:
        return EXTRA

    def runtime_name(self, provider: Provider) -> str:
        return "OpenVINO"

    def present(self) -> set[Provider]:
        return {Provider.OPENVINO} if importlib.util.find_spec("openvino") is not None else set()

    def describe(self) -> str:
        version = self.runtime_version()
        if version is None:
            return "OpenVINO: not installed"
        try:
            capabilities = ", ".join(sorted(cpu_capabilities()))
        except Exception:  # OpenVINO broken: doctor's report must still come
            capabilities = "unusable here"
        return f"OpenVINO {version}: CPU plugin runs {capabilities}"

    def runtime_version(self) -> str | None:
        try:
            return str(import_openvino().__version__)
        except SpacyAccelerateError:  # not installed: it reads nothing here
            return None

    def check(self, config: OptimizeConfig) -> None:
        check_precision(config.precision)  # bf16 needs the CPU's bf16 units: said before export

    def model_file(self, config: OptimizeConfig) -> str:
        return IR_FILE

    def key_options(self, config: OptimizeConfig) -> dict[str, Any]:
        return {"openvino": openvino_key(config.precision)}

    def layout(
        self,
        config: OptimizeConfig,
        spec: EncoderSpec,
        buckets: BucketPlan,
        cache: ModelCache | None,
        key: str,
    ) -> SessionLayout:
        compiled_dir = None  # without a cache (a bundle), OpenVINO compiles on every start
        try:  # per key, so that evicting the entry takes its blobs along
            if cache is not None:
                compiled_dir = cache.derived_dir(OPENVINO_BLOBS, key, cpu_slug())
        except CacheError:  # an unwritable cache: OpenVINO compiles on every start
            compiled_dir = None
        return OpenVINOLayout(
            input_names=spec.input_names,
            padding_idx=spec.padding_idx,
            buckets=buckets,
            compiled_dir=compiled_dir,
        )

    def open_session(
        self,
        model: Path,
        provider: ResolvedProvider,
        config: OptimizeConfig,
        layout: SessionLayout,
        cache: ModelCache | None,
    ) -> Session:
        return self.compile(model, provider, config, layout, cache)

    def compile(
        self,
        model: Path | Any,
        provider: ResolvedProvider,
        config: OptimizeConfig,
        layout: SessionLayout,
        cache: ModelCache | None,
    ) -> OpenVINOSession:
        """OpenVINO's compile under its blob folder's lock, the blobs checked first."""
        blobs = layout.compiled_dir if isinstance(layout, OpenVINOLayout) else None
        if blobs is not None and cache is not None:
            try:
                with cache.derived_lock(blobs), checked_blobs(blobs):
                    return OpenVINOSession(model, provider, config, layout, cache_dir=blobs)
            except CacheError as error:
                # A read-only cache serves its entries without locks; its blobs cannot be
                # checked under one, so they are not read: OpenVINO compiles instead.
                logger.warning(
                    "spacy-accelerate: OpenVINO's compiled blobs are not used: %s", error
                )
        return OpenVINOSession(model, provider, config, layout)

    def build(self, job: BuildJob) -> BuiltModel:
        config = job.config
        if config.precision is Precision.INT8:
            return quantize_within_gate(
                job,
                # Candidates keep no compiled blobs: all but one are thrown away.
                lambda model: self.compile(model, job.provider, config, job.layout, None),
            )
        ir = convert_to_ir(job.export, job.path.parent)  # converting costs seconds on every load
        session = self.open_session(ir, job.provider, config, job.layout, job.cache)
        return job.judged(session)
