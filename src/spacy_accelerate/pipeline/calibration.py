"""Calibration: the transformer's own inputs on real text, and PyTorch's annotations of it.

int8 quantization needs activations that look like the ones the model will
see. They are recorded by running the pipeline (on PyTorch) over the
calibration texts with a recorder in the shim, so the batches are exactly
the spans, padding and lengths spaCy produces. PyTorch's documents are kept
too: the int8 pipeline must annotate them the same way (the agreement gate).
Without ``calibration_texts`` a built-in sample of UD English-EWT is used.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from typing import Any

import numpy as np
import torch
from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.build.get_or_export import ExportedModel
from spacy_accelerate.errors import AgreementError, InvalidOptionError
from spacy_accelerate.options.config import OptimizeConfig, texts_digest
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.patch import scoped
from spacy_accelerate.pipeline.proxy import ALL_LAYERS_KWARG, make_proxy
from spacy_accelerate.pipeline.shim import ShimLocation
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.verify.calibration import Calibration
from spacy_accelerate.verify.verification import PROBE_TEXTS

#: Rows per calibration item: small batches give the quantizer many samples.
ROWS_PER_ITEM = 8

#: The fewest tokens the calibration texts may hold. The static scales and the agreement
#: gate both come from them: on a handful of pieces a plan can pass the gate and change a
#: fifth of the tags of real text. At the default min_agreement (99.5%), 1,000 tokens
#: let five changed tags through; the built-in sample holds 4,913.
MIN_CALIBRATION_TOKENS = 1000


def builtin_texts() -> list[str]:
    """The built-in calibration sample (UD English-EWT dev, see ``data/README.md``)."""
    text = resources.files("spacy_accelerate").joinpath("data/calibration_ewt_dev.txt")
    return [line for line in text.read_text(encoding="utf8").splitlines() if line.strip()]


class _Recorder(torch.nn.Module):
    """Stands in the shim for one pass: records every call's inputs, runs PyTorch."""

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
        return self.module(*args, **kwargs)


def recorded_calls(
    location: ShimLocation, spec: EncoderSpec, run: Callable[[], Any]
) -> list[EncoderInputs]:
    """The inputs of each call of the transformer at ``location`` while ``run()`` runs the
    pipeline (on PyTorch, in this thread only: other threads keep the module they run)."""
    recorder = _Recorder(location.pytorch_module, spec)
    with torch.no_grad(), scoped(location, recorder):
        run()
    return [call for call in recorder.calls if call.input_ids.size]


def record_calls(
    nlp: Language, location: ShimLocation, spec: EncoderSpec, texts: Sequence[str]
) -> tuple[list[EncoderInputs], tuple[Doc, ...]]:
    """Run ``nlp`` on PyTorch over ``texts``: the inputs of each call of the transformer at
    ``location``, as spaCy made them, and the documents."""
    docs: list[Doc] = []
    calls = recorded_calls(location, spec, lambda: docs.extend(nlp.pipe(texts, batch_size=32)))
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


@dataclass(frozen=True)
class CalibrationSource:
    """A request's calibration texts. Their hash is part of the cache key, so it is known
    at once; running the pipeline over them costs seconds, so that happens only when a
    model is built (:attr:`full`)."""

    nlp: Language
    location: ShimLocation
    spec: EncoderSpec
    #: None where only the texts' digest is known: a saved pipeline's own texts, which
    #: were never written to disk. Its cache entry is found by the digest; building it
    #: again needs the texts (:attr:`full` says so).
    texts: tuple[str, ...] | None
    known_digest: str | None = None

    @cached_property
    def digest(self) -> str:
        return texts_digest(self.texts) if self.texts is not None else str(self.known_digest)

    @cached_property
    def judged_by(self) -> str:
        """SHA256 of what decides the plan besides the transformer and the texts: the
        components' settings (span windows shape the calibration batches), the other
        components' weights (the agreement gate judges their annotations), and which are
        disabled: the gate judges only what runs, so a plan judged with the tagger
        disabled must not serve the whole pipeline, whose tags it never saw."""
        digest = hashlib.sha256()
        settings = json.dumps(self.nlp.config.get("components", {}), sort_keys=True, default=str)
        digest.update(settings.encode("utf8"))
        digest.update(json.dumps(sorted(self.nlp.disabled)).encode("utf8"))
        transformers = {id(component.pipe) for component in transformer_components(self.nlp)}
        for name, component in self.nlp.components:
            if id(component) not in transformers:
                digest.update(name.encode("utf8") + b"\0")
                for part in _head_state(component):
                    digest.update(part)
        return digest.hexdigest()

    @cached_property
    def full(self) -> Calibration:
        if self.texts is None:
            raise InvalidOptionError(
                "This pipeline's int8 model was calibrated on texts of your own, which were "
                "not saved with it (only their sha256), and its cache entry is not here, so "
                "it cannot be calibrated again. Give the texts again when loading: "
                "spacy.load(path, config={'nlp.after_pipeline_creation.calibration_texts': "
                "[...]}), or optimize(nlp, 'openvino', 'int8', calibration_texts=[...]); "
                "or copy the cache (SPACY_ACCELERATE_CACHE) from where it was built."
            )
        return record_calibration(self.nlp, self.location, self.spec, self.texts)


def _head_state(component: Any) -> Iterator[bytes]:
    """A component's weights and labels, in a stable order. Not ``to_bytes()``: that
    also holds state that changes as the pipeline runs (the vocab, parser caches)."""
    model = getattr(component, "model", None)
    if model is not None and hasattr(model, "walk"):
        for node in model.walk():
            for name in node.param_names:
                if node.has_param(name):
                    yield name.encode("utf8")
                    yield np.ascontiguousarray(model.ops.to_numpy(node.get_param(name))).tobytes()
    yield json.dumps(sorted(map(str, getattr(component, "labels", ()) or ()))).encode("utf8")


def calibration_for(
    nlp: Language, location: ShimLocation, spec: EncoderSpec, config: OptimizeConfig
) -> CalibrationSource | None:
    """The calibration of ``config``'s request: only OpenVINO's int8 is calibrated."""
    if not config.calibrated:
        return None
    if config.calibration_texts is None:
        builtin = tuple(builtin_texts())
        if config.calibration_sha256 not in (None, texts_digest(builtin)):
            return CalibrationSource(nlp, location, spec, None, config.calibration_sha256)
        return CalibrationSource(nlp, location, spec, builtin)
    texts = tuple(config.calibration_texts)
    tokens = sum(len(nlp.make_doc(text)) for text in texts)
    if tokens < MIN_CALIBRATION_TOKENS:
        raise InvalidOptionError(
            f"calibration_texts hold {tokens} tokens; int8 calibration needs at least "
            f"{MIN_CALIBRATION_TOKENS}, or its accuracy gate proves nothing (the built-in "
            "sample holds 4,913). Pass more texts like the ones you will annotate, or leave "
            "calibration_texts out to use the built-in sample."
        )
    return CalibrationSource(nlp, location, spec, texts)


#: What the agreement gate compares: the tags and the entities the pipeline assigns.
_ANNOTATIONS = {
    "tags": lambda token: token.tag_,
    "entities": lambda token: (token.ent_iob_, token.ent_type_),
}


def check_agreement(nlp: Language, calibration: Calibration, min_agreement: float) -> None:
    """Refuse the accelerated ``nlp`` unless it tags and finds entities in the calibration
    texts like PyTorch did, at least ``min_agreement`` of the tokens each."""
    docs = list(nlp.pipe(calibration.texts, batch_size=32))
    tokens = sum(len(doc) for doc in docs)
    for name, read in _ANNOTATIONS.items():
        same = sum(
            read(a) == read(b)
            for expected, actual in zip(calibration.docs, docs, strict=True)
            for a, b in zip(expected, actual, strict=True)
        )
        rate = same / tokens if tokens else 1.0
        if rate < min_agreement:
            finding = (
                f"{name} agree with PyTorch's on {rate:.2%} of the {tokens} calibration tokens "
                f"(< min_agreement {min_agreement:.2%})"
            )
            raise AgreementError(
                f"The int8 pipeline's {finding}, so it was not served and the pipeline is "
                "unchanged. Use precision='bf16' or 'fp32', calibrate on texts like yours "
                "(calibration_texts=...), or lower min_agreement if this is enough for you.",
                finding=finding,
            )


def agreement_judge(
    source: CalibrationSource, module: torch.nn.Module, min_agreement: float
) -> Callable[[Session, ExportedModel], None]:
    """Judges a candidate session inside the pipeline: one pass over the calibration texts
    with it in place of the transformer, in this thread only (other threads annotating
    with the pipeline meanwhile never run a candidate)."""

    def judge(session: Session, exported: ExportedModel) -> None:
        candidate = make_proxy(module, session, source.spec, exported)
        with scoped(source.location, candidate):
            check_agreement(source.nlp, source.full, min_agreement)

    return judge
