"""Step 8: swap the proxy into the shim, and undo it.

The state lives on the proxy itself (it keeps the original module), so
``restore()`` and ``is_optimized()`` need no registry that could drift from
the pipeline.
"""

from __future__ import annotations

from thinc.shims import PyTorchShim

from .proxy import AcceleratedEncoder


def patch(shim: PyTorchShim, proxy: AcceleratedEncoder) -> None:
    shim._model = proxy


def is_patched(shim: PyTorchShim) -> bool:
    return isinstance(shim._model, AcceleratedEncoder)


def unpatch(shim: PyTorchShim) -> bool:
    """Put the original module back; return whether there was anything to undo."""
    proxy = shim._model
    if not isinstance(proxy, AcceleratedEncoder):
        return False
    shim._model = proxy.original
    return True
