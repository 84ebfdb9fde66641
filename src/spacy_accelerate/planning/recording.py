"""Recording: what the transformer receives when the pipeline runs on real text.

int8 quantization needs activations that look like the ones the model will see, and
every lossy plan is judged against PyTorch fp32's annotations of the same texts
(:mod:`.judging`). Both are recorded by running the pipeline (on PyTorch) over the
calibration texts with a recorder in the shim, so the batches are exactly the spans,
padding and lengths spaCy produces. Without ``calibration_texts`` a built-in sample of
mixed genres is used (``data/README.md``). The verification's probe rows are recorded
the same way, from the built-in probe texts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from importlib import resources
from typing import Any

import numpy as np
import torch
from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.options.config import texts_digest
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.patch import scoped
from spacy_accelerate.pipeline.shim import ShimLocation, find_shim
from spacy_accelerate.planning.annotating import annotate
from spacy_accelerate.planning.row_groups import call_in_row_groups
from spacy_accelerate.serving.proxy import ALL_LAYERS_KWARG
from spacy_accelerate.verify.calibration import Calibration
from spacy_accelerate.verify.verification import PROBE_TEXTS

#: Rows per calibration item: small batches give the quantizer many samples.
ROWS_PER_ITEM = 8


#: The built-in calibration sample: UD English-EWT dev in five web genres and Python's
#: documentation (``data/README.md``).
BUILTIN_SAMPLE = "calibration_sample.txt"


def builtin_texts() -> list[str]:
    """The built-in calibration sample (see ``data/README.md``)."""
    text = resources.files("spacy_accelerate").joinpath(f"data/{BUILTIN_SAMPLE}")
    return [line for line in text.read_text(encoding="utf8").splitlines() if line.strip()]


class _Recorder(torch.nn.Module):
    """Stands in the shim for one pass: records every call's inputs as spaCy made them,
    runs PyTorch on their rows grouped by length (:mod:`.row_groups`)."""

    def __init__(self, module: torch.nn.Module, spec: EncoderSpec) -> None:
        super().__init__()
        self.module = module
        self.spec = spec
        self.calls: list[EncoderInputs] = []

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop(ALL_LAYERS_KWARG, None)
        ids = (args[0] if args else kwargs["input_ids"]).detach().cpu().numpy().astype(np.int64)
        mask = kwargs.get("attention_mask")
        if mask is None or not isinstance(mask, torch.Tensor):
            inputs = EncoderInputs.from_ids(ids, self.spec.padding_idx)
        else:
            types = kwargs.get("token_type_ids")
            inputs = EncoderInputs(
                ids,
                mask.detach().cpu().numpy().astype(np.int64),
                np.zeros_like(ids) if types is None else types.cpu().numpy().astype(np.int64),
            )
        self.calls.append(inputs)
        return call_in_row_groups(self.module, args, kwargs, inputs.attention_mask)


def recorded_calls(
    location: ShimLocation, spec: EncoderSpec, run: Callable[[], Any]
) -> list[EncoderInputs]:
    """The inputs of each call of the transformer at ``location`` while ``run()`` runs the
    pipeline (on PyTorch, in this thread only: other threads keep the module they run)."""
    recorder = _Recorder(location.read_pytorch_module(), spec)
    with torch.no_grad(), scoped(location, recorder):
        run()
    return [call for call in recorder.calls if call.input_ids.size]


def record_calls(
    nlp: Language, location: ShimLocation, spec: EncoderSpec, texts: Sequence[str]
) -> tuple[list[EncoderInputs], tuple[Doc, ...]]:
    """Run ``nlp`` on PyTorch fp32 over ``texts``: the inputs of each call of the
    transformer at ``location``, as spaCy made them, and the documents. Every other
    transformer of the pipeline runs its PyTorch module too (in this thread only), so
    the reference is fp32 even where another component was accelerated first."""
    docs: list[Doc] = []
    others = [
        other
        for other in (find_shim(component) for component in transformer_components(nlp))
        if other.layer is not location.layer
    ]

    def run() -> None:
        with ExitStack() as stack:
            for other in others:
                stack.enter_context(scoped(other, other.read_pytorch_module()))
            what = "calibrating: PyTorch fp32 annotates the texts"
            docs.extend(annotate(nlp, texts, what, shortest_first=False))

    calls = recorded_calls(location, spec, run)
    return calls, tuple(docs)


def record_probe(
    nlp: Language, location: ShimLocation, spec: EncoderSpec
) -> tuple[EncoderInputs, ...]:
    """The inputs the transformer at ``location`` receives for the built-in probe texts
    (:data:`~spacy_accelerate.verify.verification.PROBE_TEXTS`): each is run through the
    pipeline's components up to that transformer (on PyTorch, in this thread only; other
    threads keep annotating with what they run)."""
    names = nlp.component_names
    upto = names[: names.index(location.component)]
    before = [(name, nlp.get_pipe(name)) for name in upto if name not in nlp.disabled]
    transformer = nlp.get_pipe(location.component)

    def run() -> None:
        for text in PROBE_TEXTS:
            doc = nlp.make_doc(text)
            for _name, component in before:
                doc = component(doc)
            transformer(doc)

    return tuple(recorded_calls(location, spec, run))


def record_calibration(
    nlp: Language, location: ShimLocation, spec: EncoderSpec, texts: Sequence[str] | None
) -> Calibration:
    """The calibration on ``texts`` (the built-in sample when None), in items of a few rows."""
    chosen = tuple(builtin_texts() if texts is None else texts)
    calls, docs = record_calls(nlp, location, spec, chosen)
    items = tuple(
        EncoderInputs(
            call.input_ids[start : start + ROWS_PER_ITEM],
            call.attention_mask[start : start + ROWS_PER_ITEM],
            call.token_type_ids[start : start + ROWS_PER_ITEM],
        )
        for call in calls
        for start in range(0, call.shape[0], ROWS_PER_ITEM)
    )
    return Calibration(texts=chosen, digest=texts_digest(chosen), items=items, docs=docs)
