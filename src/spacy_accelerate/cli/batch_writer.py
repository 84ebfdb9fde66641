"""``annotate``'s OUTPUT, written batch by batch as the annotated rows arrive: one
Parquet file (one schema for every batch) or one JSONL file (a JSON object a line).

pyarrow comes with Ray Data: it is imported when a batch is written, never with the
command line.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spacy_accelerate.cli._util import CommandError

if TYPE_CHECKING:
    import pyarrow as pa


def _has_null_type(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_null(data_type):
        return True
    return any(_has_null_type(data_type.field(i).type) for i in range(data_type.num_fields))


class BatchWriter:
    """OUTPUT written batch by batch into a hidden file beside it, renamed into place once
    complete: a failed run leaves neither half a file nor a name that blocks the rerun.

    Parquet needs one schema for the whole file, while a batch whose rows all lack a
    value (every ``error`` empty, every entity list empty) has Arrow's ``null`` type
    there: batches are held back until every column has a real type (or
    :attr:`HOLD_ROWS` rows are held), and every batch is cast to the unified schema."""

    HOLD_ROWS = 10_000

    def __init__(self, output: Path) -> None:
        self.output = output
        self.partial = output.with_name(f".{output.name}.{os.getpid()}.partial")
        self.rows = 0
        self.errors = 0
        self._held: list[pa.Table] = []
        self._schema: pa.Schema | None = None
        self._parquet: Any = None
        self._jsonl: Any = None

    def __enter__(self) -> BatchWriter:
        self.output.parent.mkdir(parents=True, exist_ok=True)
        if self.output.suffix.lower() == ".jsonl":
            self._jsonl = self.partial.open("w", encoding="utf8")
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is None and self.rows == 0:
                raise CommandError("The input has no rows: nothing to write.")
            if kind is None:
                self._flush(final=True)
            if self._parquet is not None:
                self._parquet.close()
            if self._jsonl is not None:
                self._jsonl.close()
            if kind is None:
                os.replace(self.partial, self.output)
        finally:
            self.partial.unlink(missing_ok=True)

    def write(self, batch: pa.Table) -> None:
        import pyarrow.compute as pc

        self.rows += batch.num_rows
        if "error" in batch.column_names:
            self.errors += int(pc.sum(pc.is_valid(batch.column("error"))).as_py() or 0)
        if self._jsonl is not None:
            for row in batch.to_pylist():
                self._jsonl.write(json.dumps(row, ensure_ascii=False, default=_json_value))
                self._jsonl.write("\n")
            return
        self._held.append(batch)
        self._flush(final=False)

    def _flush(self, final: bool) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._held:
            return
        if self._parquet is None:
            schema = pa.unify_schemas(
                [table.schema for table in self._held], promote_options="permissive"
            )
            held = sum(table.num_rows for table in self._held)
            if (
                not final
                and held < self.HOLD_ROWS
                and any(_has_null_type(field.type) for field in schema)
            ):
                return  # a later batch says what the empty columns hold
            if "error" in schema.names and pa.types.is_null(schema.field("error").type):
                schema = schema.set(schema.get_field_index("error"), pa.field("error", pa.string()))
            self._schema = schema
            self._parquet = pq.ParquetWriter(self.partial, schema)
        schema = self._schema
        assert schema is not None  # set with the writer
        for table in self._held:
            try:
                table = table.select(schema.names).cast(schema)
            except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise CommandError(
                    f"A batch does not fit the Parquet schema of the first ones ({error}); "
                    "write .jsonl instead."
                ) from None
            self._parquet.write_table(table)
        self._held = []


def _json_value(value: Any) -> Any:
    """What ``json`` cannot write: bytes (``docbin``) as base64, anything else as text."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)
