"""One ``nlp.pipe`` call in three stages, so that spaCy's components annotate batch k while
the accelerated transformer already runs batch k+1.

- **Main thread, in front**: the tokenizer and the components before the first
  transformer. Tokenizing writes new lexemes into the shared ``Vocab`` and
  ``StringStore``, so it stays on the caller's thread.
- **One helper thread**: the transformer components (and whatever sits between them).
  The runtimes release the GIL while they run (ONNX Runtime's ``run``, OpenVINO's
  ``infer``), which is what lets the main thread work meanwhile. A transformer component
  writes nothing to the vocabulary: it reads the tokens' text and sets ``doc._.trf_data``
  on its own documents; the listeners of the downstream components read that attribute
  when they predict, never state stored in the listener (spacy-curated-transformers
  ``listeners.py``), so they never see another batch's output.
- **Main thread, behind**: every component after the last transformer (tagger, parser,
  NER, lemmatizer...), which may write strings too.

Each stage is spaCy's own ``Language.pipe`` with the other stages' components disabled, so
batching, ``component_cfg``, error handlers and the order of the documents are spaCy's:
every document meets every component in the same batches as without overlap, and gets the
same annotations. The main thread keeps the helper at most two batches ahead.

Where every transformer is served by a runtime, torch does only glue on both threads
(moving arrays, the heads' layer weighting), and the call runs it on one thread: torch's
OpenMP pool, entered from two threads at once, keeps a team of spinning workers for each,
which took the cores from the runtime and the components (measured:
``benchmarks/results/overlap-*.json``, docs/performance.md). The caller's setting is put
back when the call ends; meanwhile the caller's own torch work between documents runs on
one thread too.

An exception in the helper is raised in the caller's thread at the document it stopped
at; a generator closed early, or an exception behind, stops the helper, and the helper
thread is joined before the call returns: no thread outlives it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from spacy.language import Language
from spacy.tokens import Doc


@dataclass(frozen=True)
class Stages:
    """The components of one ``pipe`` call (those not disabled), by stage."""

    front: tuple[str, ...]
    helper: tuple[str, ...]
    behind: tuple[str, ...]

    @classmethod
    def of(cls, nlp: Language, transformers: Sequence[str], disable: Iterable[str]) -> Stages:
        """Split ``nlp``'s enabled components around its transformers (``transformers``)."""
        off = set(disable)
        names = [name for name in nlp.pipe_names if name not in off]
        used = [index for index, name in enumerate(names) if name in transformers]
        if not used:
            return cls(tuple(names), (), ())
        first, last = used[0], used[-1]
        return cls(tuple(names[:first]), tuple(names[first : last + 1]), tuple(names[last + 1 :]))

    @property
    def overlaps(self) -> bool:
        """Whether there is work to overlap: a transformer, and components behind it."""
        return bool(self.helper and self.behind)

    def others(self, kept: tuple[str, ...]) -> list[str]:
        """Every component of the call but the stage ``kept``'s (that stage's ``disable``)."""
        every = (*self.front, *self.helper, *self.behind)
        return [name for name in every if name not in kept]


#: The end of a stream.
_END = object()
#: The helper waits for input.
_HUNGRY = object()


@dataclass
class _Failure:
    error: BaseException


@dataclass
class OverlappedPipe:
    """The documents of ``texts``, annotated by ``nlp`` in :class:`Stages` (see the
    module's docstring). Iterate it once."""

    nlp: Language
    texts: Iterable[Any]
    stages: Stages
    #: ``Language.pipe``'s other keyword arguments (batch_size, component_cfg, disable).
    options: dict[str, Any]
    batch_size: int
    #: Whether torch does only glue here (every transformer served by a runtime): it then
    #: runs on one thread while the call lasts (see the module's docstring).
    glue_only: bool = False
    _inbox: queue.Queue[Any] = field(default_factory=queue.Queue, init=False)
    _outbox: queue.Queue[Any] = field(default_factory=queue.Queue, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)

    def __iter__(self) -> Iterator[Doc]:
        pipe = type(self.nlp).pipe
        front = pipe(self.nlp, self.texts, **self._stage(self.stages.front))
        helper = threading.Thread(
            target=self._run_helper, name="spacy-accelerate-transformer", daemon=True
        )
        previous = torch.get_num_threads()
        torch.set_num_threads(1 if self.glue_only else previous)
        helper.start()
        try:
            yield from pipe(self.nlp, self._finished(front), **self._stage(self.stages.behind))
        finally:
            self._stop.set()
            self._inbox.put(_END)
            helper.join()
            torch.set_num_threads(previous)

    def _stage(self, kept: tuple[str, ...]) -> dict[str, Any]:
        disabled = [*self.options.get("disable", ()), *self.stages.others(kept)]
        return {**self.options, "disable": disabled}

    def _run_helper(self) -> None:
        pipe = type(self.nlp).pipe
        if self.glue_only:
            torch.set_num_threads(1)  # this thread's own OpenMP setting too
        try:
            for doc in pipe(self.nlp, self._fed(), **self._stage(self.stages.helper)):
                self._outbox.put(doc)
            self._outbox.put(_END)
        except BaseException as error:  # raised again in the caller's thread
            self._outbox.put(_Failure(error))

    def _fed(self) -> Iterator[Doc]:
        """The helper's input: documents the main thread tokenized, until the end or a
        stop. Where none is waiting it says so (:data:`_HUNGRY`) before it waits."""
        while not self._stop.is_set():
            try:
                doc = self._inbox.get_nowait()
            except queue.Empty:
                self._outbox.put(_HUNGRY)
                doc = self._inbox.get()
            if doc is _END:
                return
            yield doc

    def _finished(self, front: Iterator[Doc]) -> Iterator[Doc]:
        """The helper's output, in order. Tokenizes ahead (on this thread), keeping two
        batches waiting for the helper; not by counting documents in and out, since an
        error handler may drop some."""
        ended = False
        while True:
            while not ended and self._inbox.qsize() < 2 * self.batch_size:
                doc = next(front, _END)
                ended = doc is _END
                self._inbox.put(doc)
            item = self._outbox.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            if item is not _HUNGRY:
                yield item
