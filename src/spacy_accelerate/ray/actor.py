"""The callable class of the actor pool: load the pipeline once, accelerate it, annotate
Arrow batches with every bad row isolated."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import spacy
from spacy.language import Language
from spacy.tokens import Doc
from spacy.util import import_file

from spacy_accelerate.api import accelerated_components, is_optimized, optimize
from spacy_accelerate.cpu_budget import BUDGET
from spacy_accelerate.ray.fields import ERROR_COLUMN, arrow_type, doc_values, empty_value

if TYPE_CHECKING:
    import pyarrow as pa

logger = logging.getLogger("spacy_accelerate")


def load_pipeline(pipeline: str, code: str | None) -> Language:
    """``pipeline`` as ``spacy.load`` finds it, after importing ``code`` (the file that
    registers its custom components), as ``spacy train --code`` does."""
    if code is not None:
        import_file("python_code", Path(code))
    return spacy.load(pipeline)


def _error(error: BaseException) -> str:
    return f"the pipeline raised {type(error).__name__}: {error}"


class Annotator:
    """One actor: the pipeline loaded and optimized once, then called on batches.

    ``optimize_options`` None: a pipeline that loads accelerated (saved optimized, served
    from its bundle or its cache) is kept as it loaded, with no second build; any other
    is optimized with ``default_options``."""

    def __init__(
        self,
        pipeline: str,
        text_column: str,
        fields: Sequence[str],
        optimize_options: Mapping[str, Any] | None,
        code: str | None = None,
        default_options: Mapping[str, Any] | None = None,
        cpus: float | None = None,
    ) -> None:
        BUDGET.confine(cpus)  # Ray reserves CPUs for the actor but sets no affinity
        self.nlp = load_pipeline(pipeline, code)
        if optimize_options is not None or not is_optimized(self.nlp):
            optimize(self.nlp, **(optimize_options or default_options or {}))
        for name, proxy in accelerated_components(self.nlp).items():
            logger.info("ray actor: %s served by %s", name, proxy.exported.summary)
        self.text_column = text_column
        self.fields = tuple(fields)

    def __call__(self, batch: pa.Table) -> pa.Table:
        import pyarrow as pa

        texts = batch.column(self.text_column).to_pylist()
        errors: list[str | None] = [None] * len(texts)
        docs: list[Doc | None] = [None] * len(texts)
        good: list[int] = []
        for row, text in enumerate(texts):
            if text is None:
                errors[row] = f"the text ({self.text_column!r}) is null"
            elif not isinstance(text, str):
                errors[row] = (
                    f"the text ({self.text_column!r}) is a {type(text).__name__}, not a string"
                )
            else:
                good.append(row)
        try:
            annotated = list(
                self.nlp.pipe([texts[row] for row in good], batch_size=max(1, len(good)))
            )
        except Exception:  # some row makes the pipeline raise: find it, one row at a time
            for row in good:
                try:
                    docs[row] = self.nlp(texts[row])
                except Exception as error:
                    errors[row] = _error(error)
        else:
            for row, doc in zip(good, annotated, strict=True):
                docs[row] = doc
        columns: dict[str, list[Any]] = {field: [] for field in self.fields}
        for row, doc in enumerate(docs):
            values: dict[str, Any] | None = None
            if doc is not None:
                try:
                    values = doc_values(doc, self.fields)
                except Exception as error:  # a component left the doc in a state we can't read
                    errors[row] = f"reading the annotations raised {type(error).__name__}: {error}"
            for field in self.fields:
                columns[field].append(values[field] if values is not None else empty_value(field))
        for field in self.fields:
            batch = batch.append_column(
                pa.field(field, arrow_type(field)), pa.array(columns[field], arrow_type(field))
            )
        return batch.append_column(
            pa.field(ERROR_COLUMN, arrow_type(ERROR_COLUMN)),
            pa.array(errors, arrow_type(ERROR_COLUMN)),
        )
