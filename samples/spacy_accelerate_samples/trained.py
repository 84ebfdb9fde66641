"""The MiniLM sample pipeline with briefly trained heads ("minilm-ewt").

The plain ``minilm`` sample has real encoder weights but untrained heads, so its tags, parses
and entities are noise: agreement checks between runtimes pass, but a demo or an accuracy
comparison means nothing.  This module trains the tagger, parser and NER on UD-EWT *dev*
(UNER entities) on top of the frozen all-MiniLM-L6-v2 encoder, so the annotations are real
while the transformer weights stay byte-identical to the checkpoint's.

Why not ``nlp.update`` with the transformer in the loop: spacy-curated-transformers 0.3.1 ends
every update with ``losses[name] = float(cum_loss)`` on a 1-element array, which numpy >= 2.4
rejects ("only 0-dimensional arrays can be converted to Python scalars") - even when the pipe
is ``frozen``.  spaCy's ``annotating_components`` route does not help either: curated
listeners never fall back to ``doc._.trf_data`` while training (they assert that the upstream
pipe pushed its outputs).  So the transformer is excluded from the update and its outputs are
pushed into the listeners directly, with a no-op backprop: exactly what a frozen transformer
would do, without the faulty loss bookkeeping, without patching installed code, and with the
encoder run only once per training document instead of once per epoch.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import spacy
import torch
from spacy.language import Language
from spacy.tokens import Doc
from spacy.training import Example
from spacy.util import fix_random_seed
from thinc.api import Adam, Optimizer
from thinc.types import Ragged

from spacy_accelerate_samples import ewt
from spacy_accelerate_samples.heads import gold_examples
from spacy_accelerate_samples.pipelines import (
    _fingerprint,
    build_cached,
    build_minilm_sample,
    curated_torch_module,
    default_cache_root,
    ensure_sample,
)

TRAINED_SAMPLE_NAME = "minilm-ewt"
# Bump whenever the training recipe changes what is written, so stale caches are never reused.
TRAINED_BUILDER_VERSION = "1"

Logger = Callable[[str], None]


@dataclass(frozen=True)
class HeadTraining:
    """How the heads are trained; every field feeds the cache fingerprint.

    The defaults are sized for a 2-core CPU: the whole build (encoder pass over dev plus head
    epochs) stays within a few minutes.
    """

    train_sentences: int | None = None  # None: all of UD-EWT dev
    max_sentences_per_doc: int = 8  # same grouping the benchmarks and the evaluation use
    epochs: int = 10
    batch_words: int = 250
    learn_rate: float = 0.005
    dropout: float = 0.1
    seed: int = 23
    encoder_batch_size: int = 16


DEFAULT_TRAINING = HeadTraining()


@dataclass
class TrainingReport:
    """What a training run did, written next to the pipeline as ``sample.json``."""

    documents: int
    words: int
    encoder_seconds: float = 0.0
    epoch_seconds: list[float] = field(default_factory=list)
    epoch_losses: list[dict[str, float]] = field(default_factory=list)


def _timestamped(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- frozen encoder


def _no_backprop(_d_outputs: list[list[Ragged]], outputs_to_backprop: tuple[int, ...]) -> Any:
    """The frozen transformer's backprop: gradients stop at the listener."""
    return []


def encode_frozen(nlp: Language, docs: Sequence[Doc], batch_size: int) -> list[list[Ragged]]:
    """Per-doc transformer outputs (piece-level, as listeners receive them), under no_grad.

    ``model.predict`` runs the torch module in inference mode (no dropout, no autograd), so
    these are the very features the saved pipeline will compute at inference time.
    """
    model = nlp.get_pipe("transformer").model
    outputs: list[list[Ragged]] = []
    for start in range(0, len(docs), batch_size):
        outputs.extend(model.predict(list(docs[start : start + batch_size])).all_outputs)
    return outputs


def _push_to_listeners(nlp: Language, docs: Sequence[Doc], outputs: list[list[Ragged]]) -> None:
    """Hand a batch's cached outputs to every listener, as ``CuratedTransformer.update`` does."""
    from spacy_curated_transformers.models.listeners import ListenerStateUtils
    from spacy_curated_transformers.models.output import TransformerModelOutput

    pipe = nlp.get_pipe("transformer")
    last_layer_only = not pipe.all_layer_outputs
    batch = TransformerModelOutput(outputs=outputs, last_layer_only=last_layer_only)
    batch_id = ListenerStateUtils.calculate_batch_id(docs)
    for listener in pipe.listeners:
        ListenerStateUtils.receive(listener, batch_id, batch, _no_backprop)


def _clear_listeners(nlp: Language) -> None:
    """Drop outputs a head did not consume (e.g. NER on a batch without entity annotation)."""
    from spacy_curated_transformers.models.listeners import ListenerStateUtils

    for listener in nlp.get_pipe("transformer").listeners:
        ListenerStateUtils.clear_state(listener)


# --------------------------------------------------------------------------- training


def _batches(indices: list[int], lengths: Sequence[int], batch_words: int) -> Iterator[list[int]]:
    """Consecutive runs of ``indices`` holding about ``batch_words`` words each."""
    batch: list[int] = []
    words = 0
    for i in indices:
        if batch and words + lengths[i] > batch_words:
            yield batch
            batch, words = [], 0
        batch.append(i)
        words += lengths[i]
    if batch:
        yield batch


def train_heads(
    nlp: Language,
    examples: Sequence[Example],
    settings: HeadTraining = DEFAULT_TRAINING,
    *,
    log: Logger = _timestamped,
) -> TrainingReport:
    """Train tagger, parser and NER on ``examples`` with the transformer frozen.

    The encoder runs once over all training docs; each epoch then only costs the heads.
    ``exclude=["transformer"]`` keeps ``nlp.update`` from calling the transformer's update
    (the numpy 2.4 failure) and from touching its parameters.
    """
    fix_random_seed(settings.seed)
    docs = [eg.predicted for eg in examples]
    lengths = [len(doc) for doc in docs]
    report = TrainingReport(documents=len(docs), words=sum(lengths))
    started = time.perf_counter()
    cached = encode_frozen(nlp, docs, settings.encoder_batch_size)
    report.encoder_seconds = round(time.perf_counter() - started, 2)
    log(f"encoded {len(docs)} docs / {report.words} words in {report.encoder_seconds}s")

    optimizer: Optimizer = Adam(settings.learn_rate)
    rng = random.Random(settings.seed)
    order = list(range(len(docs)))
    for epoch in range(settings.epochs):
        started = time.perf_counter()
        rng.shuffle(order)
        losses: dict[str, float] = {}
        for batch in _batches(order, lengths, settings.batch_words):
            _push_to_listeners(nlp, [docs[i] for i in batch], [cached[i] for i in batch])
            nlp.update(
                [examples[i] for i in batch],
                sgd=optimizer,
                drop=settings.dropout,
                losses=losses,
                exclude=["transformer"],
            )
        seconds = round(time.perf_counter() - started, 2)
        report.epoch_seconds.append(seconds)
        report.epoch_losses.append({k: round(float(v), 2) for k, v in losses.items()})
        shown = ", ".join(f"{k} {v:.1f}" for k, v in losses.items())
        log(f"epoch {epoch + 1}/{settings.epochs} in {seconds}s: {shown}")
    _clear_listeners(nlp)
    return report


# --------------------------------------------------------------------------- evaluation


def evaluate_on_ewt_test(
    nlp: Language,
    limit_sentences: int | None = None,
    *,
    max_sentences_per_doc: int = 8,
    batch_size: int = 32,
) -> dict[str, float]:
    """Tag accuracy, UAS/LAS and NER P/R/F of ``nlp`` against gold UD-EWT test (+ UNER).

    Uses ``nlp.evaluate`` (spaCy's ``Scorer``) on Examples whose predicted side is
    unannotated text with the gold tokenisation, so the figures measure the heads, not the
    tokenizer.  Sentences without UNER annotation are ignored by the NER scores.
    """
    gold = ewt.load_documents(
        "test",
        max_sentences=max_sentences_per_doc,
        limit_sentences=limit_sentences,
        vocab=nlp.vocab,
    )
    examples = gold_examples(nlp, gold)
    started = time.perf_counter()
    scores = nlp.evaluate(examples, batch_size=batch_size)
    seconds = time.perf_counter() - started
    keys = ("tag_acc", "dep_uas", "dep_las", "sents_f", "ents_p", "ents_r", "ents_f")
    result: dict[str, float] = {key: float(scores.get(key) or 0.0) for key in keys}
    result["documents"] = float(len(examples))
    result["words"] = float(sum(len(eg.reference) for eg in examples))
    result["seconds"] = round(seconds, 2)
    return result


# --------------------------------------------------------------------------- encoder identity


def encoder_state_digest(nlp: Language) -> str:
    """SHA-256 over the curated encoder's state dict (names, dtypes, shapes and bytes).

    Equal digests mean byte-identical encoder weights, e.g. between ``minilm`` and
    ``minilm-ewt``.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(curated_torch_module(nlp).state_dict().items()):
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def same_encoder_weights(nlp: Language, other: Language) -> bool:
    """Whether two pipelines' curated encoders have equal state dicts (names, dtypes, values).

    The tensor-by-tensor counterpart of comparing :func:`encoder_state_digest` values.
    """
    mine = curated_torch_module(nlp).state_dict()
    theirs = curated_torch_module(other).state_dict()
    return mine.keys() == theirs.keys() and all(
        mine[name].dtype == theirs[name].dtype and torch.equal(mine[name], theirs[name])
        for name in mine
    )


# --------------------------------------------------------------------------- building


def train_docs(settings: HeadTraining = DEFAULT_TRAINING) -> list[Doc]:
    """Gold UD-EWT dev docs the heads are trained (and their labels initialised) on."""
    return ewt.load_documents(
        "dev",
        max_sentences=settings.max_sentences_per_doc,
        limit_sentences=settings.train_sentences,
    )


def build_trained_minilm_sample(
    output_dir: Path,
    settings: HeadTraining = DEFAULT_TRAINING,
    *,
    log: Logger = _timestamped,
) -> Path:
    """Build the MiniLM pipeline, train its heads on EWT dev and save it to ``output_dir``.

    The untrained pipeline comes from :func:`build_minilm_sample` (labels from the training
    docs, real MiniLM weights) written to ``output_dir``, is reloaded with ``spacy.load`` like
    any user pipeline, trained and saved over itself (so any file the builder keeps next to
    the pipeline, and the paths its config names, stay valid).  The encoder digest is checked
    before saving: a regression that lets gradients reach the transformer fails the build
    instead of shipping altered weights.
    """
    started = time.perf_counter()
    gold = train_docs(settings)
    log(f"building untrained MiniLM pipeline ({len(gold)} dev docs for labels)")
    build_minilm_sample(output_dir, train_docs=gold)
    nlp = spacy.load(output_dir)
    before = encoder_state_digest(nlp)
    report = train_heads(nlp, gold_examples(nlp, gold), settings, log=log)
    if encoder_state_digest(nlp) != before:
        raise RuntimeError("head training changed the transformer weights")
    output_dir.mkdir(parents=True, exist_ok=True)
    nlp.to_disk(output_dir)
    info = {
        "name": TRAINED_SAMPLE_NAME,
        "build_seconds": round(time.perf_counter() - started, 2),
        "encoder_sha256": before,
        "settings": asdict(settings),
        "training": asdict(report),
    }
    (output_dir / "sample.json").write_text(json.dumps(info, indent=2), encoding="utf8")
    log(f"saved {TRAINED_SAMPLE_NAME} to {output_dir} in {info['build_seconds']}s")
    return output_dir


# --------------------------------------------------------------------------- caching


def trained_fingerprint(settings: HeadTraining = DEFAULT_TRAINING) -> str:
    """The untrained sample's fingerprint plus everything the training adds."""
    versions = {dist: metadata.version(dist) for dist in ("numpy", "thinc", "torch")}
    payload = {
        "base": _fingerprint("minilm"),
        "builder": TRAINED_BUILDER_VERSION,
        "settings": asdict(settings),
        "versions": versions,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf8"))
    return digest.hexdigest()[:12]


def ensure_trained_sample(
    root: Path | None = None,
    settings: HeadTraining = DEFAULT_TRAINING,
    *,
    log: Logger = _timestamped,
) -> Path:
    """Path of the cached ``minilm-ewt`` pipeline (``spacy.load``-able), built on first use.

    Lives next to the other samples (``default_cache_root()``); a file lock serialises
    concurrent builders (e.g. pytest-xdist workers).
    """
    cache_root = root if root is not None else default_cache_root()
    target = cache_root / f"{TRAINED_SAMPLE_NAME}-{trained_fingerprint(settings)}"
    return build_cached(target, partial(build_trained_minilm_sample, settings=settings, log=log))


def load_trained_sample(root: Path | None = None) -> Language:
    """Convenience: ``spacy.load`` of :func:`ensure_trained_sample`."""
    return spacy.load(ensure_trained_sample(root))


def load_benchmark_pipeline(name: str) -> Language:
    """Any sample pipeline by name (``minilm-ewt`` or one of :func:`ensure_sample`'s),
    built offline on first use: what the benchmarks run."""
    if name == TRAINED_SAMPLE_NAME:
        return load_trained_sample()
    return spacy.load(ensure_sample(name))
