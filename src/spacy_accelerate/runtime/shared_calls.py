"""Concurrent calls of one served encoder, run together while the runtime is busy.

A service calls ``nlp(text)`` from many threads at once (FastAPI's and Starlette's thread
pools, gunicorn's threaded workers): one document each, one encoder call each. Run one by
one, a process serves at most one document per encoder call; run as one batch, a call costs
little more than the longest of its rows. So the proxies send every call through
:class:`SharedCalls`, which batches the way serving systems do (Ray Serve's
``@serve.batch``, Triton's dynamic batcher), with the rule a CPU wants:

- **A lone call never waits.** Where the runtime is idle the call runs at once, alone.
  Calls that arrive while it is busy wait, and the next run takes them all together
  (up to :data:`MAX_ROWS` rows), so batches form only under load.
- **No thread of its own.** The thread whose call finished hands the next batch to one of
  the waiting callers' threads, which runs it for all and hands on in turn: nothing runs
  between two calls that the callers did not start, and nothing is left to stop at exit.
- **A bounded queue.** At most :data:`MAX_WAITING` calls wait; one more raises
  :class:`~spacy_accelerate.errors.QueueFullError` at once, never an unbounded backlog.
- **One call's failure is its own.** Where a batch fails, each of its calls runs again
  alone, so the error reaches the call that caused it and the others get their outputs.
- **A caller that stops waiting** (Ctrl-C in its thread, an exception raised into it) is
  taken out of the queue; where it was to run the next batch, that goes to another caller.

Rows of different lengths are padded to the longest (padding pieces, masked): a row's
outputs are those of the row run alone up to the last bits of float arithmetic (the
runtime's length groups, :mod:`~spacy_accelerate.runtime.length_groups`, regroup the rows
by length within the batch). A cancellable thread (an overlapped pipe's helper, already
running whole batches) runs its calls directly.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from spacy_accelerate.errors import QueueFullError
from spacy_accelerate.runtime.cancellation import is_cancellable

#: Calls that may wait for the runtime at once; one more is refused.
MAX_WAITING = 256
#: How often a waiting caller looks for a signal (Ctrl-C) meant for it.
SIGNAL_CHECK_SECONDS = 0.1
#: The most rows (spans) one shared run takes: more wait for the next run.
MAX_ROWS = 64


def queue_full(waiting: str) -> QueueFullError:
    """The error for one more than :data:`MAX_WAITING` waiting (``waiting``: who waits for
    what), saying what a service does about it."""
    return QueueFullError(
        f"{MAX_WAITING} {waiting} already: this process is over its capacity. Refuse or "
        "retry the request (HTTP 503), or serve with more processes."
    )


RunTensors = Callable[[Mapping[str, torch.Tensor], Sequence[str]], list[torch.Tensor]]


@dataclass(eq=False)
class _Call:
    """One caller's call: its inputs, and what it gets back (outputs, an error, or the
    batch it is to run)."""

    run: RunTensors
    feeds: Mapping[str, torch.Tensor]
    names: tuple[str, ...]
    woken: threading.Event = field(default_factory=threading.Event)
    outputs: list[torch.Tensor] | None = None
    error: BaseException | None = None
    lead: list[_Call] | None = None
    #: The caller stopped waiting (under the lock: never given a batch from then on).
    gone: bool = False

    @property
    def rows(self) -> int:
        return int(self.feeds["input_ids"].shape[0])

    def joins(self, other: _Call) -> bool:
        """Whether this call may run in one batch with ``other``: the same session's run,
        asking for the same outputs."""
        return self.run == other.run and self.names == other.names

    def deliver(self, outputs: list[torch.Tensor] | None, error: BaseException | None) -> None:
        self.outputs, self.error = outputs, error
        self.woken.set()

    @property
    def delivered(self) -> bool:
        return self.outputs is not None or self.error is not None

    def result(self) -> list[torch.Tensor]:
        if self.error is not None:
            raise self.error
        assert self.outputs is not None
        return self.outputs


class SharedCalls:
    """The calls of one session (see the module's docstring). ``padding_idx``: the piece
    the rows are padded with. ``runs`` counts the runtime calls made (tests and stats)."""

    def __init__(self, padding_idx: int) -> None:
        self.padding_idx = padding_idx
        self.runs = 0
        self._start()

    def _start(self) -> None:
        """No call waiting or running, in this process (a forked child's state is its
        parent's, whose threads it has not: it starts afresh)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._busy = False
        self._waiting: deque[_Call] = deque()

    def run(
        self, run: RunTensors, feeds: Mapping[str, torch.Tensor], names: Sequence[str]
    ) -> list[torch.Tensor]:
        """``run(feeds, names)``, alone where the runtime is idle, else with the calls
        waiting beside it."""
        if is_cancellable():
            return run(feeds, names)
        if self._pid != os.getpid():
            self._start()
        call = _Call(run, feeds, tuple(names))
        try:
            self._enter(call)
            # In turns: a blocked wait is interrupted only by a signal the kernel gives
            # this very thread, and with many threads it may give Ctrl-C to another one,
            # which then runs only when this thread is back in Python.
            while call.lead is None and not call.woken.wait(SIGNAL_CHECK_SECONDS):
                pass
            if call.lead is not None:
                self._serve(call)
        except BaseException:  # stopped waiting, at any point: nothing left to the others
            self._leave(call)
            raise
        return call.result()

    def _enter(self, call: _Call) -> None:
        """Lead a batch of ``call`` alone where the runtime is idle; else wait in the queue."""
        with self._lock:
            if self._busy:
                if len(self._waiting) >= MAX_WAITING:
                    raise queue_full("calls are waiting for the accelerated transformer")
                self._waiting.append(call)
            else:
                call.lead = [call]  # before busy: a leaver hands on a batch it leads
                self._busy = True

    def _leave(self, call: _Call) -> None:
        """``call``'s caller stopped waiting: it leaves the queue (never to be given a batch
        from then on), handing on a batch it was given and had not started."""
        with self._lock:
            call.gone = True
            if call in self._waiting:
                self._waiting.remove(call)
            given, call.lead = call.lead, None
            leader = None
            if given is not None:
                leader = self._lead_next([other for other in given if other is not call])
        if leader is not None:
            leader.woken.set()

    def _serve(self, call: _Call) -> None:
        """Run the batch ``call`` leads, give each call its outputs, and hand on the next
        batch: the calls of this one left without outputs (the run interrupted in this
        thread) or the next waiting."""
        batch, call.lead = call.lead or [], None
        try:
            self._run_batch(batch)
        finally:
            with self._lock:
                left = [other for other in batch if other is not call and not other.delivered]
                leader = self._lead_next(left or self._take())
            if leader is not None:
                leader.woken.set()

    def _run_batch(self, batch: list[_Call]) -> None:
        first = batch[0]
        if len(batch) > 1:
            try:
                self.runs += 1
                outputs = first.run(_padded(batch, self.padding_idx), first.names)
            except Exception:
                pass  # run each alone: the error reaches the call that caused it
            else:
                for call, own in zip(batch, _split(batch, outputs), strict=True):
                    call.deliver(own, None)
                return
        for call in batch:
            try:
                self.runs += 1
                call.deliver(call.run(call.feeds, call.names), None)
            except Exception as error:
                call.deliver(None, error)

    def _take(self) -> list[_Call]:
        """The next batch (under the lock): the first waiting call and those that join it,
        up to :data:`MAX_ROWS` rows; none: the runtime is idle."""
        if not self._waiting:
            self._busy = False
            return []
        first = self._waiting.popleft()
        batch, rows = [first], first.rows
        for call in list(self._waiting):
            if call.joins(first) and rows + call.rows <= MAX_ROWS:
                self._waiting.remove(call)
                batch.append(call)
                rows += call.rows
        return batch

    def _lead_next(self, batch: list[_Call]) -> _Call | None:
        """Under the lock: the first caller of ``batch`` still waiting, given the batch (its
        callers still waiting) to run for all; where every one of them stopped waiting, the
        next batch's; None where none waits (the runtime is then idle). The caller wakes it
        once the lock is released."""
        while True:
            waiting = [call for call in batch if not call.gone]
            if waiting:
                waiting[0].lead = waiting
                return waiting[0]
            batch = self._take()
            if not batch:
                return None


def _padded(batch: list[_Call], padding_idx: int) -> dict[str, torch.Tensor]:
    """The calls' rows in one batch, each padded to the longest (masked padding pieces)."""
    longest = max(int(call.feeds["input_ids"].shape[1]) for call in batch)

    def pad(tensor: torch.Tensor, name: str) -> torch.Tensor:
        fill = padding_idx if name == "input_ids" else 0
        return torch.nn.functional.pad(tensor, (0, longest - tensor.shape[1]), value=fill)

    names = batch[0].feeds
    return {name: torch.cat([pad(call.feeds[name], name) for call in batch]) for name in names}


def _split(batch: list[_Call], outputs: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Each call's rows of ``outputs`` (hidden states cut to its own length; a pooled
    output has no length), as tensors of their own."""
    owned, start = [], 0
    for call in batch:
        rows, length = call.rows, int(call.feeds["input_ids"].shape[1])
        mine = [tensor[start : start + rows] for tensor in outputs]
        owned.append([(t[:, :length] if t.dim() == 3 else t).clone() for t in mine])
        start += rows
    return owned
