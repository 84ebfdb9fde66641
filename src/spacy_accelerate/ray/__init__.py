"""Scale out on Ray Data: annotate a corpus on a pool of actors, each running the
accelerated pipeline (extra ``ray``: ``pip install 'spacy-accelerate[ray]'``).

>>> import ray, spacy_accelerate.ray as sar
>>> rows = ray.data.read_parquet("texts.parquet")
>>> sar.annotate(rows, "en_core_web_trf", fields=("entities",), concurrency=4)

Importing this package does not import Ray; :func:`annotate` does, and says how to
install it where it is missing.
"""

from spacy_accelerate.ray.annotate import INSTALL_RAY, annotate
from spacy_accelerate.ray.fields import ERROR_COLUMN, FIELDS

__all__ = ["ERROR_COLUMN", "FIELDS", "INSTALL_RAY", "annotate"]
