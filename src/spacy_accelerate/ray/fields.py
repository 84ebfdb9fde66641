"""The annotations :func:`~spacy_accelerate.ray.annotate` can add to a row, and their Arrow types.

Every added column has a fixed Arrow type, whatever the batch holds: a batch whose every
entity list is empty, or whose every row failed, still has the same schema as the others,
so that Ray can concatenate the blocks and a Parquet writer accepts them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spacy.tokens import Doc, DocBin

from spacy_accelerate.errors import InvalidOptionError

if TYPE_CHECKING:
    import pyarrow as pa

#: The annotations a row can get, in the order their columns are added.
FIELDS: tuple[str, ...] = ("tags", "pos", "lemmas", "heads", "deps", "entities", "sents", "docbin")

#: The column that says why a row has no annotations (null where it has them).
ERROR_COLUMN = "error"


def check_fields(fields: Sequence[str] | str) -> tuple[str, ...]:
    """``fields`` without repeats, in the order given; an unknown name raises
    :class:`~spacy_accelerate.errors.InvalidOptionError` naming it and the valid ones."""
    if isinstance(fields, str):  # "entities" is one field, not eight letters
        fields = [fields]
    unknown = [name for name in fields if name not in FIELDS]
    if unknown:
        raise InvalidOptionError(
            f"Unknown annotation field{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(name) for name in unknown)}: choose from {', '.join(FIELDS)}."
        )
    return tuple(dict.fromkeys(fields))


def arrow_type(field: str) -> pa.DataType:
    """The Arrow type of ``field``'s column (``error``'s too)."""
    import pyarrow as pa

    strings = pa.list_(pa.string())
    types = {
        "tags": strings,
        "pos": strings,
        "lemmas": strings,
        "deps": strings,
        "heads": pa.list_(pa.int64()),
        "entities": pa.list_(
            pa.struct(
                [
                    pa.field("start_char", pa.int64()),
                    pa.field("end_char", pa.int64()),
                    pa.field("label", pa.string()),
                ]
            )
        ),
        "sents": pa.list_(pa.list_(pa.int64())),
        "docbin": pa.binary(),
        ERROR_COLUMN: pa.string(),
    }
    return types[field]


def empty_value(field: str) -> Any:
    """What a row that could not be annotated holds in ``field``: an empty list, or null
    for ``docbin``."""
    return None if field == "docbin" else []


def _sentences(doc: Doc) -> list[list[int]]:
    if not (doc.has_annotation("SENT_START") or doc.has_annotation("DEP")):
        return []  # no component sets sentence boundaries: none to report
    return [[sent.start_char, sent.end_char] for sent in doc.sents]


def doc_values(doc: Doc, fields: Sequence[str]) -> dict[str, Any]:
    """``doc``'s annotations in ``fields``, as plain Python values of the columns' types."""
    values: dict[str, Any] = {}
    for field in fields:
        if field == "tags":
            values[field] = [token.tag_ for token in doc]
        elif field == "pos":
            values[field] = [token.pos_ for token in doc]
        elif field == "lemmas":
            values[field] = [token.lemma_ for token in doc]
        elif field == "heads":
            values[field] = [token.head.i for token in doc]
        elif field == "deps":
            values[field] = [token.dep_ for token in doc]
        elif field == "entities":
            values[field] = [
                {"start_char": ent.start_char, "end_char": ent.end_char, "label": ent.label_}
                for ent in doc.ents
            ]
        elif field == "sents":
            values[field] = _sentences(doc)
        elif field == "docbin":
            values[field] = DocBin(docs=[doc], store_user_data=False).to_bytes()
    return values
