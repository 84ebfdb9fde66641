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
same annotations.

**Memory is bounded**, in batches of the call's ``batch_size``: at most
:data:`INBOX_BATCHES` batches of tokenized documents wait for the helper; the helper runs
one batch, and hands its documents over :data:`OUTBOX_DOCUMENTS` at a time, waiting while
the caller's thread has not taken them, so at most one finished batch of transformer
output waits ahead of the batch the components run (without overlap: none).

**torch's threads.** Where every transformer is served by a runtime, torch does only glue
on both threads (moving arrays, the heads' layer weighting), and runs on one thread during
the library's work: torch's OpenMP pool, entered from two threads at once, keeps a team of
spinning workers for each, which took the cores from the runtime and the components
(measured: ``benchmarks/results/overlap-*.json``, docs/performance.md). The change lasts
only while a document is being made (:func:`~spacy_accelerate.cpu_budget.glue_threads`),
never across a ``yield``: between two documents, and in threads started meanwhile, torch
runs on the caller's count (:mod:`spacy_accelerate.cpu_budget`).

**Ending.** An exception in the helper is raised in the caller's thread at the document it
stopped at. The end of the documents, an exception behind the transformer (Ctrl-C
included), ``close()``, or the pipe being collected unfinished (abandoned, in a reference
cycle, on whatever thread the collector runs) stop the helper inside the runtime call it is
in, which is aborted (:mod:`spacy_accelerate.runtime.cancellation`), not at the end of its
batch; the caller's thread then waits for it (never the helper itself), so no thread
outlives the call. Ctrl-C (``KeyboardInterrupt``) and ``SystemExit`` do not wait there: the
exception goes on at once. Whatever ended the caller's code (the end of a script that left
a pipe unfinished, ``sys.exit``, an uncaught error, Ctrl-C), the process's exit stops and
joins every helper still running (:class:`Helpers`, at ``atexit``) before the interpreter
finalizes: a daemon thread still inside a runtime's C++ call then aborted the process
(``std::terminate``, exit status 134) instead of ending it with the caller's own status.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from spacy.language import Language
from spacy.tokens import Doc

from spacy_accelerate.cpu_budget import (
    callers_threads,
    glue_threads,
    helper_threads,
    on_fork_in_child,
)
from spacy_accelerate.runtime.cancellation import Cancelled, StopSignal, cancellable


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

#: Tokenized documents waiting for the helper, in batches: the caller's thread tokenizes
#: ahead while the helper runs the transformer.
INBOX_BATCHES = 2
#: Documents the helper hands over at a time: it waits while the caller's thread has not
#: taken them, so that its finished batch is the only one ahead of the components.
OUTBOX_DOCUMENTS = 1
#: Seconds a blocked hand-over waits before it looks again whether the call ended.
_POLL = 0.05


@dataclass
class _Failure:
    error: BaseException


@dataclass
class _Channel:
    """What the caller's thread and the helper share. The helper holds this and never the
    :class:`OverlappedPipe`, so that an abandoned pipe is collected (and its helper
    stopped) like any object."""

    batch_size: int
    inbox: queue.Queue[Any] = field(default_factory=queue.Queue)
    outbox: queue.Queue[Any] = field(default_factory=lambda: queue.Queue(maxsize=OUTBOX_DOCUMENTS))
    stop: StopSignal = field(default_factory=StopSignal)
    ready: threading.Event = field(default_factory=threading.Event)

    def hand_over(self, item: Any) -> bool:
        """Put ``item`` in the outbox once there is room; False where the call ended."""
        while not self.stop.is_set():
            try:
                self.outbox.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def fed(self) -> Iterator[Doc]:
        """The helper's input: documents the caller's thread tokenized, until the end or
        a stop. Where none is waiting it says so (:data:`_HUNGRY`) before it waits."""
        while not self.stop.is_set():
            try:
                doc = self.inbox.get_nowait()
            except queue.Empty:
                if not self.hand_over(_HUNGRY):
                    return
                doc = self.inbox.get()
            if doc is _END:
                return
            yield doc

    def finished(self, front: Iterator[Doc]) -> Iterator[Doc]:
        """The helper's output, in order, on the caller's thread, which tokenizes ahead
        (at most :data:`INBOX_BATCHES` batches waiting); not by counting documents in and
        out, since an error handler may drop some."""
        ended = False
        while True:
            while not ended and self.inbox.qsize() < INBOX_BATCHES * self.batch_size:
                doc = next(front, _END)
                ended = doc is _END
                self.inbox.put(doc)
            item = self.outbox.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            if item is not _HUNGRY:
                yield item

    def shut(self) -> None:
        """End the helper's work: at its next runtime call or hand-over, whichever thread
        calls this (a collector may run in the helper itself)."""
        self.stop.set()
        self.inbox.put(_END)
        while True:  # room for the helper's last hand-over
            try:
                self.outbox.get_nowait()
            except queue.Empty:
                return


def _run_helper(nlp: Language, channel: _Channel, options: dict[str, Any], glue_only: bool) -> None:
    """The helper thread: the transformer stage over the channel's input."""
    helper_threads(glue_only)
    channel.ready.set()
    try:
        with cancellable(channel.stop):
            for doc in type(nlp).pipe(nlp, channel.fed(), **options):
                if not channel.hand_over(doc):
                    return
        channel.hand_over(_END)
    except Cancelled:
        return
    except BaseException as error:  # raised again in the caller's thread
        channel.hand_over(_Failure(error))


class Helpers:
    """The helper threads started and not yet ended, each with its channel: the process's
    exit stops them (aborting the runtime call in flight) and joins them all before the
    interpreter finalizes (see the module's docstring).

    A helper counts as running until its thread has ended, not until its work returned:
    what the thread holds is destroyed as it ends (OpenVINO's infer request, kept in a
    thread-local). A helper stopped by its pipe's finalizer (abandoned, or left by
    ``sys.exit``, an error or Ctrl-C), which does not join it, may still be ending when the
    caller's code ends: the exit waits for it too. The channel is held weakly: a finished
    helper keeps no documents alive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: dict[threading.Thread, weakref.ref[_Channel]] = {}

    def start(self, thread: threading.Thread, channel: _Channel) -> None:
        """Start ``thread``, the helper of ``channel``; forget those that have ended."""
        with self._lock:
            self._started = {
                started: held for started, held in self._started.items() if started.is_alive()
            }
            self._started[thread] = weakref.ref(channel)
            thread.start()

    def stop_all(self) -> None:
        """Stop every helper and wait until each thread has ended (at exit, with the
        caller's code done)."""
        with self._lock:
            started = list(self._started.items())
        for _, held in started:
            channel = held()
            if channel is not None:
                channel.shut()
        for thread, _ in started:
            if thread is not threading.current_thread():
                thread.join()

    def after_fork(self) -> None:
        """In a forked child: none of the parent's threads runs here."""
        self._lock = threading.Lock()
        self._started = {}


#: This process's helpers.
HELPERS = Helpers()
atexit.register(HELPERS.stop_all)
on_fork_in_child(HELPERS.after_fork)


class OverlappedPipe:
    """The documents of ``texts``, annotated by ``nlp`` in :class:`Stages` (see the
    module's docstring); an iterator, like the generator spaCy's ``pipe`` returns.

    ``options``: ``Language.pipe``'s other keyword arguments (batch_size, component_cfg,
    disable). ``glue_only``: torch does only glue here (every transformer served by a
    runtime), so the library's own work runs it on one thread (see the module's
    docstring)."""

    def __init__(
        self,
        nlp: Language,
        texts: Iterable[Any],
        stages: Stages,
        options: dict[str, Any],
        glue_only: bool = False,
    ) -> None:
        self.nlp = nlp
        self.stages = stages
        self.options = options
        self.glue_only = glue_only
        size = options.get("batch_size")
        self._channel = _Channel(size if size is not None else nlp.batch_size)
        self._texts = texts
        self._docs: Iterator[Doc] | None = None
        self._helper: threading.Thread | None = None
        self._closed = False
        # Collected unfinished (abandoned, in a cycle, on any thread): the helper stops.
        self._finalizer = weakref.finalize(self, self._channel.shut)

    def __iter__(self) -> OverlappedPipe:
        return self

    def __next__(self) -> Doc:
        if self._closed:
            raise StopIteration
        with glue_threads(self.glue_only):
            try:
                if self._docs is None:
                    self._docs = self._start()
                return next(self._docs)
            except (KeyboardInterrupt, SystemExit):
                # The process is likely ending: the helper stops at its next runtime
                # call, without keeping Ctrl-C waiting for the call it is in.
                self._closed = True
                self._finalizer()
                raise
            except BaseException:  # the end, an error: the helper stops, joined
                self.close()
                raise

    def close(self) -> None:
        """Stop the helper (at its next runtime call) and wait for it, unless called in
        the helper itself; idempotent."""
        self._closed = True
        self._finalizer()
        helper = self._helper
        if helper is not None and helper is not threading.current_thread():
            helper.join()

    def _start(self) -> Iterator[Doc]:
        """Start the helper and chain the stages (inside :func:`glue_threads`)."""
        pipe = type(self.nlp).pipe
        texts = _callers_texts(self._texts)
        front = pipe(self.nlp, texts, **self._stage(self.stages.front))
        self._helper = threading.Thread(
            target=_run_helper,
            args=(self.nlp, self._channel, self._stage(self.stages.helper), self.glue_only),
            name=HELPER_NAME,
            daemon=True,
        )
        HELPERS.start(self._helper, self._channel)
        self._channel.ready.wait()  # its torch set up while this thread holds the lease
        return pipe(self.nlp, self._channel.finished(front), **self._stage(self.stages.behind))

    def _stage(self, kept: tuple[str, ...]) -> dict[str, Any]:
        disabled = [*self.options.get("disable", ()), *self.stages.others(kept)]
        return {**self.options, "disable": disabled}


#: The helper thread's name.
HELPER_NAME = "spacy-accelerate-transformer"


def _callers_texts(texts: Iterable[Any]) -> Iterator[Any]:
    """``texts``, each pulled with the caller's own torch threads (it is the caller's
    code, run inside the library's work)."""
    iterator = iter(texts)
    while True:
        with callers_threads():
            item = next(iterator, _END)
        if item is _END:
            return
        yield item
