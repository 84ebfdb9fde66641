"""Judging: PyTorch's reference annotations of the calibration texts, and the agreement of
a candidate plan with them.

Every lossy plan (int8, bf16, fp16) is judged on calibration texts: the whole pipeline
annotates them with the candidate in place of the transformer, and every annotation it
sets must agree with PyTorch fp32's (:mod:`spacy_accelerate.verify.agreement`, bounds
from ``min_agreement``); bf16 must also be about as faithful as PyTorch's own bf16
autocast. PyTorch fp32's annotations, and the activations int8 is quantized on, are
recorded (:mod:`.recording`) only when a model is built: a request's
:class:`CalibrationSource` knows its texts' digest (part of the cache key) at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NoReturn

import numpy as np
import torch
from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate.architectures.spec import EncoderSpec
from spacy_accelerate.errors import Advice, AgreementError, InvalidOptionError, OneOf, Said
from spacy_accelerate.options.agreement import AgreementBounds, Annotation
from spacy_accelerate.options.config import OptimizeConfig, Precision, texts_digest
from spacy_accelerate.pipeline.components import transformer_components
from spacy_accelerate.pipeline.patch import scoped
from spacy_accelerate.pipeline.shim import ShimLocation
from spacy_accelerate.planning.annotating import annotate, annotated
from spacy_accelerate.planning.autocast import AutocastModule
from spacy_accelerate.planning.recording import builtin_texts, record_calibration
from spacy_accelerate.runtime.session import Session
from spacy_accelerate.serving.proxy import candidate_proxy
from spacy_accelerate.verify.agreement import AgreementReport, RunningAgreement, compare
from spacy_accelerate.verify.calibration import Calibration, Judge

logger = logging.getLogger("spacy_accelerate")

#: The fewest tokens the calibration texts may hold. The static scales and the agreement
#: gate both come from them: on a handful of pieces a plan can pass the gate and still
#: change many tags of real text (measured: ``docs/openvino.md``, "int8: calibrated on
#: your texts"). (The Wilson rule refuses more on fewer tokens: at
#: 1,000 tokens no plan that changes a single tag clears 99.5%.)
MIN_CALIBRATION_TOKENS = 1000


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
                "[...]}), or pass ",
                Advice("calibration_texts", ...),
                " with the precision you asked for; or copy the cache (SPACY_ACCELERATE_CACHE) "
                "from where it was built.",
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
            Advice("calibration_texts"),
            f" hold {tokens} tokens; a lossy plan's calibration needs at least "
            f"{MIN_CALIBRATION_TOKENS}, or its accuracy gate proves nothing (the built-in "
            "sample holds about 9,000). Pass more texts like the ones you will annotate, or "
            "leave ",
            Advice("calibration_texts"),
            " out to use the built-in sample.",
        )
    return CalibrationSource(nlp, location, spec, texts)


def autocast_agreement(source: CalibrationSource) -> AgreementReport:
    """How faithful PyTorch's own bf16 autocast of the pipeline is on the calibration
    texts: what a bf16 plan is held to."""
    calibration = source.full
    autocast = AutocastModule(source.location.read_pytorch_module(), "cpu", torch.bfloat16)
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
    hopeless = running.hopeless_at(bounds, floor)
    if hopeless is not None:  # stopped early: what was counted already refuses the plan
        so_far = running.so_far().describe() or "none"
        _refuse(hopeless[0], (*hopeless[1], f"; every rate so far: {so_far}"))
    report = running.report(docs)
    if not report.rates:
        logger.warning(
            "spacy-accelerate: the pipeline sets none of the annotations the agreement gate "
            "compares (tags, dependencies, entities, ...), so only the token cosine judged "
            "this plan."
        )
    refused = report.refused(bounds, floor)
    if refused is not None:
        _refuse(refused[0], (*refused[1], f"; every rate: {report.describe()}"))
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


def _refuse(annotation: Annotation, finding: Said) -> NoReturn:
    raise AgreementError(
        "The pipeline's ",
        *finding,
        ", so this plan was not served and the pipeline is unchanged. Use ",
        Advice("precision", OneOf(("fp32", "auto"))),
        " (auto: the fastest plan that passes), calibrate on texts like yours (",
        Advice("calibration_texts", ...),
        "), or lower the bound of that annotation (",
        Advice("min_agreement", item=annotation.value),
        ") if this is enough for you.",
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
        candidate = candidate_proxy(module, session, source.spec)
        with scoped(source.location, candidate):
            return check_agreement(
                source.nlp, source.full, config.min_agreement, floor[0] if floor else None
            )

    return judge
