"""An ONNX Runtime session over an exported encoder, sized for this process."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .config import OptimizeConfig
from .encoder_inputs import EncoderInputs
from .providers import ResolvedProvider, import_onnxruntime


class EncoderSession:
    """Runs the exported encoder: int64 id arrays in, requested hidden states out."""

    def __init__(
        self, model_path: Path, provider: ResolvedProvider, config: OptimizeConfig
    ) -> None:
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = config.intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.provider = provider
        self.config = config
        self._session = ort.InferenceSession(
            str(model_path), sess_options=options, providers=list(provider.ort_providers)
        )
        self.input_names: tuple[str, ...] = tuple(i.name for i in self._session.get_inputs())
        self.output_names: tuple[str, ...] = tuple(o.name for o in self._session.get_outputs())

    def run(self, inputs: EncoderInputs, outputs: Sequence[str]) -> list[np.ndarray]:
        """The requested outputs; the graph's inputs decide which arrays are fed."""
        return self._session.run(list(outputs), inputs.feeds(self.input_names))
