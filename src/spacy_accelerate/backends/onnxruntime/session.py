"""An ONNX Runtime session over an exported encoder, on the provider it was asked for.

The session is created with the provider options of
:mod:`spacy_accelerate.backends.onnxruntime.provider_options` and then checked: ONNX Runtime
quietly falls back to the CPU when a GPU provider cannot start (no device,
a driver or library mismatch), which would leave an "accelerated" pipeline
running somewhere nobody asked for. That, and any failure to build or run
the model on a GPU provider, is an :class:`~spacy_accelerate.errors.EngineBuildError`,
which ``optimize(..., fallback=True)`` answers with the next provider.

Two ways to feed it: :meth:`EncoderSession.run` takes numpy arrays (the
parity gate and warm-up of the CPU provider), :meth:`EncoderSession.run_tensors`
takes torch tensors (the proxy's hot path): on the CPU through host arrays,
on a GPU through IO binding on device buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.backends.onnxruntime.cuda_graphs import GraphBook
from spacy_accelerate.backends.onnxruntime.io_binding import BoundRunner
from spacy_accelerate.backends.onnxruntime.provider_options import (
    ORT_PROVIDER_NAMES,
    execution_providers,
    import_onnxruntime,
)
from spacy_accelerate.errors import Advice, EngineBuildError, SpacyAccelerateError
from spacy_accelerate.options.config import OptimizeConfig, Precision, Provider
from spacy_accelerate.runtime.cancellation import runtime_call
from spacy_accelerate.runtime.length_groups import run_by_length
from spacy_accelerate.runtime.providers import ResolvedProvider
from spacy_accelerate.runtime.session import SessionLayout, cpu_warm_shapes, host_arrays
from spacy_accelerate.runtime.working_memory import releases_memory


class TensorRunner(Protocol):
    def run(
        self, feeds: Mapping[str, torch.Tensor], names: Sequence[str], *, graphs: bool = True
    ) -> list[torch.Tensor]: ...


class HostRunner:
    """The CPU provider's path: torch tensors to numpy (no copy on the CPU) and back,
    the rows run in groups of similar length (:mod:`~spacy_accelerate.runtime.length_groups`)."""

    def __init__(self, session: Any, ort: Any) -> None:
        self.session = session
        self._ort = ort
        self._shrink_next = False
        self.input_names = tuple(i.name for i in session.get_inputs())

    def run(
        self, feeds: Mapping[str, torch.Tensor], names: Sequence[str], *, graphs: bool = True
    ) -> list[torch.Tensor]:
        arrays = host_arrays(feeds, self.input_names)
        return [torch.from_numpy(array) for array in self.run_arrays(arrays, names)]

    def run_arrays(self, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        return run_by_length(self.run_whole, feeds, names, borrowed=False)

    def run_whole(self, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
        """One call over the whole padded batch; a helper told to stop aborts it
        (``RunOptions.terminate``, :mod:`~spacy_accelerate.runtime.cancellation`). A large
        run shrinks the arena after it, and so does the next run: the large run's outputs
        still held their regions when it ended
        (:mod:`~spacy_accelerate.runtime.working_memory`)."""
        options = self._ort.RunOptions()
        options.log_severity_level = _QUIET  # an aborted run is not an error to log
        large = releases_memory(feeds)
        if large or self._shrink_next:
            options.add_run_config_entry(ARENA_SHRINKAGE, "cpu:0")
        self._shrink_next = large
        with runtime_call(lambda: setattr(options, "terminate", True)):
            return self.session.run(list(names), dict(feeds), options)


#: The run option that gives the CPU arena's free regions back after the run
#: (:mod:`~spacy_accelerate.runtime.working_memory`).
ARENA_SHRINKAGE = "memory.enable_memory_arena_shrinkage"
#: ONNX Runtime's FATAL severity: only what ends the process is logged for a run.
_QUIET = 4


def _ort_failure_types(ort: Any) -> tuple[type[BaseException], ...]:
    # ONNX Runtime's errors (Fail, EPFail, RuntimeException, ...) come from its
    # pybind module, deriving from plain Exception; run_with_iobinding reports
    # failures as RuntimeError instead.
    module = getattr(getattr(ort, "capi", None), "onnxruntime_pybind11_state", None)
    found = [
        value
        for value in (vars(module).values() if module is not None else ())
        if isinstance(value, type) and issubclass(value, Exception)
    ]
    return (*found, RuntimeError)


@contextmanager
def engine_failures(provider: Provider, what: str, ort: Any) -> Iterator[None]:
    """On a GPU provider, turn ONNX Runtime's failures into an ``EngineBuildError``."""
    if provider is Provider.CPU:
        yield
        return
    try:
        yield
    except SpacyAccelerateError:
        raise
    except _ort_failure_types(ort) as error:
        raise EngineBuildError(
            f"ONNX Runtime's {ORT_PROVIDER_NAMES[provider]} failed to {what}: {error}. Check "
            "`spacy-accelerate doctor` (driver, CUDA, TensorRT versions); pass ",
            Advice("fallback", True),
            " to fall back to the next provider instead.",
        ) from error


#: ONNX Runtime's intra-op threads sleep as soon as a run ends instead of spinning for the
#: next one: between two runs the caller's thread annotates (spaCy's components, torch's
#: own threads), and on a machine of few CPUs a spinning thread takes a CPU from it. One
#: document at a time on minilm-ewt, 2 CPUs (issue 54): median 14.7 against 16.8 ms, 99th
#: percentile 48.5 against 64.8 ms; ``nlp.pipe``'s batches took the same time either way.
THREAD_POOL_ENTRIES = {"session.intra_op.allow_spinning": "0"}


class EncoderSession:
    """Runs the exported encoder: int64 id arrays in, requested hidden states out."""

    def __init__(
        self,
        model_path: Path,
        provider: ResolvedProvider,
        config: OptimizeConfig,
        layout: SessionLayout,
    ) -> None:
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = config.intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        for entry, value in THREAD_POOL_ENTRIES.items():
            options.add_session_config_entry(entry, value)
        self.provider = provider
        self.config = config
        self.layout = layout
        self._ort = ort
        with engine_failures(provider.provider, "create a session", ort):
            self._session = ort.InferenceSession(
                str(model_path),
                sess_options=options,
                providers=execution_providers(config, layout),
            )
        check_active(self._session, provider.provider)
        self.input_names: tuple[str, ...] = tuple(i.name for i in self._session.get_inputs())
        self.output_names: tuple[str, ...] = tuple(o.name for o in self._session.get_outputs())
        self.runner: TensorRunner = make_runner(self._session, ort, config, layout)

    @property
    def rows_independent(self) -> bool:
        """Not under int8: ONNX Runtime's int8 is dynamic, each call's activations scaled
        together, so a row's outputs depend on the rows beside it."""
        return self.provider.precision is not Precision.INT8

    def run(self, inputs: EncoderInputs, outputs: Sequence[str]) -> list[np.ndarray]:
        """The requested outputs as host arrays, run the way the proxy runs (buckets and
        all on a GPU), so that the parity gate checks what will be served."""
        feeds = {name: torch.from_numpy(a) for name, a in inputs.feeds(self.input_names).items()}
        tensors = self.run_tensors(feeds, outputs, graphs=False)
        return [tensor.cpu().numpy() for tensor in tensors]

    def run_tensors(
        self, feeds: Mapping[str, torch.Tensor], outputs: Sequence[str], *, graphs: bool = True
    ) -> list[torch.Tensor]:
        """The requested outputs as torch tensors, on the session's device (``graphs``:
        whether this run may capture or replay a CUDA graph)."""
        with engine_failures(self.provider.provider, "run the model", self._ort):
            return self.runner.run(feeds, outputs, graphs=graphs)

    def warm_shapes(self, window: int, batch_size: int) -> list[tuple[int, int]]:
        """The CPU: one row (:func:`~spacy_accelerate.runtime.session.cpu_warm_shapes`); a
        GPU: every bucket (with CUDA graphs, each bucket's first run captures its graph)."""
        if isinstance(self.runner, BoundRunner):
            return self.runner.plan.warm_shapes()
        longest = self.layout.buckets.longest
        return cpu_warm_shapes(window, batch_size, longest)


def check_active(session: Any, provider: Provider) -> None:
    """Refuse a session on which ONNX Runtime did not register the provider asked for."""
    expected = ORT_PROVIDER_NAMES[provider]
    active = list(session.get_providers())
    if expected not in active:
        raise EngineBuildError(
            f"ONNX Runtime could not start {expected} (it runs on {', '.join(active)} instead), "
            "so the model would not run where you asked. Check that a GPU is visible "
            "(nvidia-smi, CUDA_VISIBLE_DEVICES) and that the CUDA/cuDNN/TensorRT libraries match "
            "your onnxruntime-gpu (`spacy-accelerate doctor`); pass ",
            Advice("fallback", True),
            " to fall back to the next provider instead.",
        )


def _host_runner(session: Any, ort: Any, config: OptimizeConfig, layout: SessionLayout):
    return HostRunner(session, ort)


def _device_runner(session: Any, ort: Any, config: OptimizeConfig, layout: SessionLayout):
    return BoundRunner(
        session,
        ort,
        device=torch.device("cuda", config.gpu.device_id),
        plan=layout.buckets,
        padding_idx=layout.padding_idx,
        graphs=GraphBook(enabled=config.gpu.cuda_graph, plan=layout.buckets),
    )


_RUNNERS: dict[Provider, Callable[[Any, Any, OptimizeConfig, SessionLayout], TensorRunner]] = {
    Provider.CPU: _host_runner,
    Provider.CUDA: _device_runner,
    Provider.TENSORRT: _device_runner,
}


def make_runner(
    session: Any, ort: Any, config: OptimizeConfig, layout: SessionLayout
) -> TensorRunner:
    """Host arrays for the CPU provider, IO binding on device buffers for the GPU ones."""
    return _RUNNERS[config.provider](session, ort, config, layout)
