"""The spacy-accelerate command line: one module a command, as spaCy's own ``spacy/cli/``.

The app and what the commands share are in :mod:`._util`; each command's module
registers it on the app when imported, which this package does for every entry point
(``spacy-accelerate``, ``python -m spacy_accelerate``: :func:`main`).
"""

from spacy_accelerate.cli import annotate, bench, cache, doctor, optimize  # noqa: F401
from spacy_accelerate.cli._util import app, main

__all__ = ["app", "main"]
