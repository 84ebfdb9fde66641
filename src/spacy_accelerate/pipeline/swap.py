"""Swapping the module in a thinc shim while other threads annotate with it.

thinc's PyTorch layer reads the shim's module several times per batch (its ``convert_inputs``
decides the call's arguments, then the shim puts the module in eval mode, calls it and puts
it back in train mode). A swap between those reads would run a batch half on one module and
half on another: an accelerated module's keyword given to the PyTorch one (``TypeError``),
or the PyTorch module run in train mode (dropout: silently different annotations).

So from ``optimize()`` on, a layer's forward is a :class:`GuardedForward`: every batch
holds its layer's :class:`SwapGuard` for reading, and a swap takes it for writing, waiting
until the batches in flight are done. A batch in flight finishes on the module it started
with. ``restore()`` takes the guard off once no batch is in flight (the pipeline as it was);
only the batches already running when ``optimize()`` installs it are not covered, and a
swap among them is harmless (the whole batch runs on one module, the accelerated one
without the all-layers flag, whose default is every layer); a ``restore()`` while such a
batch still runs is not (thinc may then call the PyTorch module in train mode).

Reference outputs of the PyTorch module are computed with the layer to one thread alone
(:func:`held_exclusively`), because thinc puts the module back in train mode after every batch
another thread runs on it.

Calibration and the agreement gate run the pipeline with a module of their own (a recorder,
a candidate int8 model) for one thread only (:func:`scoped_module`): that thread's batches run
exclusively, with its module swapped in for the batch and out again, so other threads never
see it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from thinc.api import Model
from thinc.shims import PyTorchShim

from spacy_accelerate.cpu_budget import on_fork_in_child


class SwapGuard:
    """A readers-writer lock (writers first, so a swap is not starved by a busy pipeline),
    and the modules threads run in place of the shim's own (:func:`scoped_module`)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self.local = threading.local()

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._writer:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            while self._writer:
                self._cond.wait()
            self._writer = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()

    @property
    def scoped_module(self) -> torch.nn.Module | None:
        return getattr(self.local, "module", None)


_GUARDS: weakref.WeakKeyDictionary[PyTorchShim, SwapGuard] = weakref.WeakKeyDictionary()
_GUARDS_LOCK = threading.Lock()


def _forget_guards_in_child() -> None:
    # A fork copies the guards' state but not the threads holding them: start afresh.
    global _GUARDS_LOCK
    _GUARDS_LOCK = threading.Lock()
    _GUARDS.clear()


on_fork_in_child(_forget_guards_in_child)


def guard_of(shim: PyTorchShim) -> SwapGuard:
    with _GUARDS_LOCK:
        guard = _GUARDS.get(shim)
        if guard is None:
            guard = _GUARDS[shim] = SwapGuard()
        return guard


def _pytorch_shim(layer: Model) -> PyTorchShim:
    return next(shim for shim in layer.shims if isinstance(shim, PyTorchShim))


@dataclass(frozen=True)
class GuardedForward:
    """A PyTorch layer's forward, run under its shim's :class:`SwapGuard`."""

    inner: Callable[..., Any]

    def __call__(self, model: Model, X: Any, is_train: bool = False) -> Any:
        shim = _pytorch_shim(model)
        guard = guard_of(shim)
        module = guard.scoped_module
        if module is None:
            with guard.reading():
                return self.inner(model, X, is_train)
        with guard.writing():
            previous, shim._model = shim._model, module
            try:
                return self.inner(model, X, is_train)
            finally:
                shim._model = previous


def install_guard(layer: Model) -> None:
    """Guard ``layer``'s forward (idempotent)."""
    if not isinstance(layer._func, GuardedForward):
        layer._func = GuardedForward(layer._func)


def remove_guard(layer: Model) -> None:
    """``layer``'s own forward back (the caller holds the layer exclusively)."""
    if isinstance(layer._func, GuardedForward):
        layer._func = layer._func.inner


def swap_module(layer: Model, module: torch.nn.Module) -> None:
    """Put ``module`` in ``layer``'s shim once no batch is in flight there."""
    shim = _pytorch_shim(layer)
    with guard_of(shim).writing():
        shim._model = module


@contextmanager
def scoped_module(layer: Model, module: torch.nn.Module) -> Iterator[None]:
    """Run ``layer`` with ``module`` in this thread only (see the module's docstring)."""
    guard = guard_of(_pytorch_shim(layer))
    install_guard(layer)
    outer = guard.scoped_module
    guard.local.module = module
    try:
        yield
    finally:
        guard.local.module = outer


@contextmanager
def held_exclusively(layer: Model) -> Iterator[None]:
    """No batch runs on ``layer`` (in another thread) while this is held."""
    with guard_of(_pytorch_shim(layer)).writing():
        yield
