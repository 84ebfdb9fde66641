"""A throwaway backend, to show that a backend is one folder plus one registration.

:class:`FakeBackend` serves fp32 by opening ONNX Runtime's CPU session over the exported
file; :data:`FAKE` is the provider a test registers for it (:func:`registered`), in one
place, after which ``optimize()``, ``auto``, ``doctor`` and the command line know it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.backends.base import Backend, BuildJob
from spacy_accelerate.backends.onnxruntime.session import EncoderSession
from spacy_accelerate.cache.store import ModelCache
from spacy_accelerate.export.onnx import MODEL_FILE
from spacy_accelerate.options.config import OptimizeConfig, Precision, Provider
from spacy_accelerate.options.providers import PROVIDERS, ProviderSpec
from spacy_accelerate.runtime.buckets import BucketPlan
from spacy_accelerate.runtime.providers import ResolvedProvider
from spacy_accelerate.runtime.session import Session, SessionLayout
from spacy_accelerate.verify.record import BuiltModel

FAKE = Provider("fake-cpu")

#: The one registration: ranked before every built-in provider, so ``auto`` picks it.
ROW = ProviderSpec(
    provider=FAKE,
    backend="fake_backend:FakeBackend",
    precisions=(Precision.FP32,),
    fallback=Provider.CPU,
    auto_rank=1,
    summary="a test's throwaway backend (ONNX Runtime's CPU session)",
)


class FakeBackend(Backend):
    """fp32 only, through ONNX Runtime's CPU provider; counts the sessions it opens."""

    opened = 0

    def install_hint(self, provider: Provider) -> str:
        return "nothing to install (a test's backend)"

    def pip_extra(self, provider: Provider) -> str:
        return "cpu"

    def runtime_name(self, provider: Provider) -> str:
        return "the test's fake runtime"

    def present(self) -> set[Provider]:
        return {FAKE}

    def model_file(self, config: OptimizeConfig) -> str:
        return MODEL_FILE

    def runtime_version(self) -> str | None:
        return "0.1"

    def layout(
        self,
        config: OptimizeConfig,
        spec: EncoderSpec,
        buckets: BucketPlan,
        cache: ModelCache | None,
        key: str,
    ) -> SessionLayout:
        return SessionLayout(
            input_names=spec.input_names, padding_idx=spec.padding_idx, buckets=buckets
        )

    def open_session(
        self,
        model: Path,
        provider: ResolvedProvider,
        config: OptimizeConfig,
        layout: SessionLayout,
        cache: ModelCache | None,
    ) -> Session:
        type(self).opened += 1
        on_cpu = ResolvedProvider(Provider.CPU, Precision.FP32)
        return EncoderSession(model, on_cpu, replace(config, provider=Provider.CPU), layout)

    def build(self, job: BuildJob) -> BuiltModel:
        job.export.copy_to(job.path)
        return job.judged(self.open_session(job.path, job.provider, job.config, job.layout, None))


@contextmanager
def registered() -> Iterator[Provider]:
    """:data:`FAKE` in the provider table while the block runs."""
    PROVIDERS.register(ROW)
    try:
        yield FAKE
    finally:
        PROVIDERS.remove(FAKE)
