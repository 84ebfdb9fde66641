"""Reading the JSON and array files of a cache entry or a saved pipeline's bundle, which
anyone may have written.

A bundle comes with a pipeline from elsewhere, and a shared cache folder may hold files
another user put there; their SHA256 only proves they match a listing the same hand may
have written. So every such file is parsed as hostile input: bounded in size, nesting and
array shapes, strictly typed, with no ``NaN`` or infinity, no pickles, and any failure of
the parsers (a ``RecursionError`` from deep nesting, a broken zip, a bad numpy header) turned
into :class:`CorruptEntry` naming the file. Callers turn
that into the error of the interface the user called (``BundleError``, ``CacheError``).
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: The largest JSON file read (the manifests, ``bundle.json``, ``parity.json``...): this
#: release writes a few kilobytes; room for a model of many files.
MAX_JSON_BYTES = 16 * 1024 * 1024
#: The deepest nesting of lists and objects read: this release writes under 10 levels.
MAX_JSON_DEPTH = 32
#: The most digits of a whole number read (this release writes sizes and counts).
MAX_INT_DIGITS = 20
#: The most bytes the arrays of one ``.npz`` file may unpack to (what this release
#: writes: a few batches of token ids).
MAX_ARRAY_BYTES = 256 * 1024 * 1024


class CorruptEntry(Exception):
    """A folder exists but must not be served (or a bundle that must not be loaded): a
    file missing, changed, or not what this release writes. The message says why."""


def read_json(path: Path, name: str | None = None) -> Any:
    """The JSON value in ``path`` (``name``: what to call it, default its file name), or
    :class:`CorruptEntry`. An ``OSError`` (missing, unreadable) passes through."""
    called = name or path.name
    with open(path, "rb") as handle:
        raw = handle.read(MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:
        raise CorruptEntry(f"{called} is larger than {MAX_JSON_BYTES:,} bytes")
    try:
        value = json.loads(
            raw.decode("utf-8"),
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_short_int,
        )
    except RecursionError:
        raise CorruptEntry(f"{called} is nested too deeply") from None
    except (ValueError, MemoryError) as error:  # UnicodeDecodeError, JSONDecodeError
        raise CorruptEntry(f"{called} is not valid JSON ({_short(error)})") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise CorruptEntry(f"{called} is nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def read_json_object(path: Path, name: str | None = None) -> dict[str, Any]:
    """:func:`read_json` of a file that must hold a JSON object."""
    value = read_json(path, name)
    if not isinstance(value, dict):
        raise CorruptEntry(f"{name or path.name} is not a JSON object")
    return value


def _refuse_constant(constant: str) -> Any:
    raise ValueError(f"{constant} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def _short_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise ValueError(f"a whole number of {len(text)} digits")
    return int(text)


def _short(error: BaseException) -> str:
    return str(error)[:200]


def _depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value, without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in _children(item))
    return deepest


def _children(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        yield from value.values()
    elif isinstance(value, list):
        yield from value


def read_int_arrays(path: Path, name: str | None = None) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` file ``path`` by name, each two-dimensional and of an
    integer type, read without pickles, or :class:`CorruptEntry`."""
    called = name or path.name
    try:
        with zipfile.ZipFile(path) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
        if unpacked > MAX_ARRAY_BYTES:
            raise CorruptEntry(f"{called} unpacks to more than {MAX_ARRAY_BYTES:,} bytes")
        with np.load(path, allow_pickle=False) as stored:
            arrays = {key: stored[key] for key in stored.files}
    except CorruptEntry:
        raise
    except Exception as error:  # noqa: BLE001 - any failure of zip or numpy's parser
        raise CorruptEntry(
            f"{called} is not an archive of numpy arrays ({type(error).__name__}: {_short(error)})"
        ) from None
    for key, array in arrays.items():
        # numpy hands back the raw bytes of a member that is not an .npy array.
        if not isinstance(array, np.ndarray) or array.ndim != 2 or array.dtype.kind not in "iu":
            raise CorruptEntry(f"{called} holds {key!r} as something else than a table of integers")
    return arrays
