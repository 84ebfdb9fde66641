"""The spacy-accelerate command line.

Commands kept in modules of their own register themselves on ``app.app`` when imported;
importing them here, after ``app`` (which they import), means every entry point
(``spacy-accelerate``, ``python -m spacy_accelerate``) sees them.
"""

from spacy_accelerate.cli import annotate as _annotate  # noqa: F401
