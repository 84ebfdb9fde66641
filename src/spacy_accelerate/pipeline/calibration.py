"""Calibration: the transformer's own inputs on real text, and PyTorch's annotations of it.

Every lossy plan (int8, bf16, fp16) is judged on calibration texts: the whole pipeline
annotates them with the candidate in place of the transformer, and every annotation it
sets must agree with PyTorch fp32's (:mod:`spacy_accelerate.verify.agreement`, bounds
from ``min_agreement``); bf16 must also be about as faithful as PyTorch's own bf16
autocast. int8 quantization also needs activations that look like the ones the model
will see. They are recorded by running the pipeline (on PyTorch) over the calibration
texts with a recorder in the shim, so the batches are exactly the spans, padding and
lengths spaCy produces. Without ``calibration_texts`` a built-in sample of mixed genres
is used (``data/README.md``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate import progress
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.errors import AgreementError, InvalidOptionError
from spacy_accelerate.options.agreement import AgreementBounds
from spacy_accelerate.options.config import OptimizeConfig, Precision, texts_digest
from spacy_accelerate.pipeline.autocast import AutocastModule
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.patch import scoped
from spacy_accelerate.pipeline.proxy import ALL_LAYERS_KWARG, make_proxy
from spacy_accelerate.pipeline.row_groups import call_in_row_groups
from spacy_accelerate.pipeline.shim import ShimLocation, find_shim
from spacy_accelerate.provision.get_or_export import ExportedModel, Origin
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.verify.agreement import AgreementReport, RunningAgreement, compare
from spacy_accelerate.verify.calibration import Calibration, Judge
from spacy_accelerate.verify.verification import PROBE_TEXTS

logger = logging.getLogger("spacy_accelerate")

#: Rows per calibration item: small batches give the quantizer many samples.
ROWS_PER_ITEM = 8

#: The fewest tokens the calibration texts may hold. The static scales and the agreement
#: gate both come from them: on a handful of pieces a plan can pass the gate and change a
#: fifth of the tags of real text. (The Wilson rule refuses more on fewer tokens: at
#: 1,000 tokens no plan that changes a single tag clears 99.5%.)
MIN_CALIBRATION_TOKENS = 1000


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
    recorder = _Recorder(location.pytorch_module, spec)
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
                stack.enter_context(scoped(other, other.pytorch_module))
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
                "This pipeline's lossy plan was judged on calibration texts of your own, "
                "which were not saved with it (only their sha256), and its cache entry is not "
                "here, so it cannot be judged again. Give the texts again when loading: "
                "spacy.load(path, config={'nlp.after_pipeline_creation.calibration_texts': "
                "[...]}), or optimize(nlp, ..., calibration_texts=[...]) with the precision "
                "you asked for; or copy the cache (SPACY_ACCELERATE_CACHE) from where it was "
                "built."
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


class CalibrationSources:
    """The calibration source of each transformer for one ``optimize()`` call, made once
    per component and texts: a search over several candidates (``precision="auto"``, a
    fallback chain) records the texts, running PyTorch over them, only once."""

    def __init__(self, nlp: Language) -> None:
        self.nlp = nlp
        self.known: dict[tuple[str, tuple[str, ...] | None, str | None], CalibrationSource] = {}

    def of(
        self, location: ShimLocation, spec: EncoderSpec, config: OptimizeConfig
    ) -> CalibrationSource | None:
        """The calibration of ``config``'s request: every lossy plan has one, fp32 none."""
        return self.texts_of(location, spec, config) if config.calibrated else None

    def texts_of(
        self, location: ShimLocation, spec: EncoderSpec, config: OptimizeConfig
    ) -> CalibrationSource:
        """The calibration texts ``config`` names, whatever its precision (``auto`` times
        its candidates on them)."""
        texts = tuple(config.calibration_texts) if config.calibration_texts is not None else None
        key = (location.component, texts, config.calibration_sha256)
        if key not in self.known:
            self.known[key] = calibration_source(self.nlp, location, spec, config)
        return self.known[key]


def calibration_source(
    nlp: Language, location: ShimLocation, spec: EncoderSpec, config: OptimizeConfig
) -> CalibrationSource:
    """The calibration texts ``config`` names (its own, or the built-in sample), checked,
    whatever its precision (``precision="auto"`` times its candidates on them)."""
    if config.calibration_texts is None:
        builtin = tuple(builtin_texts())
        if config.calibration_sha256 not in (None, texts_digest(builtin)):
            return CalibrationSource(nlp, location, spec, None, config.calibration_sha256)
        return CalibrationSource(nlp, location, spec, builtin)
    texts = tuple(config.calibration_texts)
    tokens = sum(len(nlp.make_doc(text)) for text in texts)
    if tokens < MIN_CALIBRATION_TOKENS:
        raise InvalidOptionError(
            f"calibration_texts hold {tokens} tokens; a lossy plan's calibration needs at "
            f"least {MIN_CALIBRATION_TOKENS}, or its accuracy gate proves nothing (the "
            "built-in sample holds about 9,000). Pass more texts like the ones you will "
            "annotate, or leave calibration_texts out to use the built-in sample."
        )
    return CalibrationSource(nlp, location, spec, texts)


def annotate(
    nlp: Language, texts: Sequence[str], what: str | None = None, *, shortest_first: bool = True
) -> list[Doc]:
    """``nlp``'s documents for ``texts``, in their order, as the autocast reference and the
    timing run it (see :func:`annotated`)."""
    by_index = dict(annotated(nlp, texts, what, shortest_first=shortest_first))
    return [by_index[index] for index in range(len(texts))]


def annotated(
    nlp: Language, texts: Sequence[str], what: str | None = None, *, shortest_first: bool = True
) -> Generator[tuple[int, Doc], None, None]:
    """``nlp``'s document of each of ``texts`` with the text's index, as each is done; said
    as the progress step ``what`` where given (not where it is timed).

    With ``shortest_first`` the texts go through the pipeline in order of length: spaCy
    pads every span of a batch to its longest one and PyTorch runs the padding, so texts
    of like length batched together cost less (measured in ``docs/performance.md``).
    Which texts share a batch changes annotations only through float rounding (the
    attention mask keeps padding out). The calibration's own pass keeps the texts' order
    (:func:`record_calls`): its batches are the items int8 is quantized on."""
    order = list(range(len(texts)))
    if shortest_first:
        order.sort(key=lambda index: len(texts[index]))
    # spaCy's own pipe, never the overlapped one (.pipe): the module judged is scoped to
    # this thread, and a helper thread would run the one served instead.
    stream: Iterator[Doc] = Language.pipe(nlp, (texts[index] for index in order), batch_size=32)
    with ExitStack() as stack:  # a pass stopped early still closes its progress step
        if what is not None:
            stream = stack.enter_context(closing(progress.track(stream, what, len(texts))))
        yield from zip(order, stream, strict=True)


def autocast_agreement(source: CalibrationSource) -> AgreementReport:
    """How faithful PyTorch's own bf16 autocast of the pipeline is on the calibration
    texts: what a bf16 plan is held to."""
    calibration = source.full
    autocast = AutocastModule(source.location.pytorch_module, "cpu", torch.bfloat16)
    with torch.no_grad(), scoped(source.location, autocast):
        docs = annotate(
            source.nlp, calibration.texts, "PyTorch bf16 autocast annotates the calibration texts"
        )
    return compare(calibration.docs, docs)


def check_agreement(
    nlp: Language,
    calibration: Calibration,
    bounds: AgreementBounds,
    floor: AgreementReport | None = None,
) -> AgreementReport:
    """The accelerated ``nlp``'s agreement with PyTorch fp32 on the calibration texts,
    or an :class:`AgreementError` naming the first annotation whose 95% lower bound is
    below its bound in ``bounds`` (or, with ``floor``, that falls further below it than
    :data:`~spacy_accelerate.verify.agreement.AUTOCAST_MARGIN`)."""
    running = RunningAgreement(calibration.docs)
    docs = _judged_docs(nlp, calibration.texts, running, bounds, floor)
    hopeless = running.hopeless(bounds, floor)
    if hopeless is not None:  # stopped early: what was counted already refuses the plan
        _refuse(f"{hopeless}; every rate so far: {running.so_far().describe() or 'none'}")
    report = running.report(docs)
    if not report.rates:
        logger.warning(
            "spacy-accelerate: the pipeline sets none of the annotations the agreement gate "
            "compares (tags, dependencies, entities, ...), so only the token cosine judged "
            "this plan."
        )
    finding = report.refusal(bounds, floor)
    if finding is not None:
        _refuse(f"{finding}; every rate: {report.describe()}")
    return report


def _judged_docs(
    nlp: Language,
    texts: Sequence[str],
    running: RunningAgreement,
    bounds: AgreementBounds,
    floor: AgreementReport | None,
) -> list[Doc]:
    """The candidate's documents of ``texts`` in their order, each counted in ``running``;
    fewer where a document leaves the plan no way to pass (:meth:`RunningAgreement.hopeless`):
    the pass stops there."""
    docs: dict[int, Doc] = {}
    if running.hopeless(bounds, floor) is None:
        judging = "judging the plan: the pipeline annotates the calibration texts with it"
        with closing(annotated(nlp, texts, judging)) as stream:
            for index, doc in stream:
                docs[index] = doc
                running.add(index, doc)
                if running.hopeless(bounds, floor) is not None:
                    break
    return [docs[index] for index in sorted(docs)]


def _refuse(finding: str) -> NoReturn:
    raise AgreementError(
        f"The pipeline's {finding}, so this plan was not served and the pipeline is "
        "unchanged. Use precision='fp32' (or 'auto', the fastest plan that passes), "
        "calibrate on texts like yours (calibration_texts=...), or lower min_agreement "
        "for that annotation (min_agreement={...: bound}) if this is enough for you.",
        finding=finding,
    )


def agreement_judge(
    source: CalibrationSource, module: torch.nn.Module, config: OptimizeConfig
) -> Judge:
    """Judges a candidate session inside the pipeline: one pass over the calibration texts
    with it in place of the transformer, in this thread only (other threads annotating
    with the pipeline meanwhile never run a candidate). A bf16 plan is also held to
    PyTorch's bf16 autocast on the same texts (measured once, when first needed)."""
    floor: list[AgreementReport] = []

    def judge(session: Session) -> AgreementReport:
        if config.precision is Precision.BF16 and not floor:
            floor.append(autocast_agreement(source))
        candidate = make_proxy(module, session, source.spec, _JUDGED)
        with scoped(source.location, candidate):
            return check_agreement(
                source.nlp, source.full, config.min_agreement, floor[0] if floor else None
            )

    return judge


#: What the proxy of a candidate being judged says of its provenance (nothing is cached yet).
_JUDGED = ExportedModel(
    key="candidate", path=Path(), origin=Origin.EXPORTED, seconds=0.0, parity=None
)
