"""A saved pipeline's bundle is input from someone else: every file the library parses
(``bundle.json``, each entry's ``manifest.json`` and ``parity.json``, the listing, a lossy
plan's ``spot_check.npz``) is mutated, its hashes written again so that only the parsing
stands between it and the runtime, and the bundle is read. It is read as before, or
refused with ``BundleError`` (``Unservable`` for a later format), never another exception;
and no file outside the pipeline's folder is opened."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import spacy
from annotations import annotations, run
from conftest import always_faster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spacy_accelerate
from spacy_accelerate.architectures import detect_architecture
from spacy_accelerate.architectures.inputs import EncoderInputs
from spacy_accelerate.backends.registry import backends
from spacy_accelerate.cache.untrusted import CorruptEntry
from spacy_accelerate.errors import BundleError
from spacy_accelerate.options.request import build_config
from spacy_accelerate.pipeline.components import find_transformer_components
from spacy_accelerate.pipeline.shim import find_shim
from spacy_accelerate.provision import bundle as bundle_module
from spacy_accelerate.provision.bundle import (
    BUNDLE_DIR,
    BUNDLE_FILE,
    RELEASE_PATTERN,
    Unservable,
    read_bundle,
)
from spacy_accelerate.verify import speed
from spacy_accelerate.verify.spot_check import (
    ITEM_ARRAYS,
    SPOT_CHECK_FILE,
    check_items,
    load_spot_check,
    save_spot_check,
)

#: The files of an entry whose records the rehashing writes again.
MANIFEST, PARITY = "manifest.json", "parity.json"

#: Any JSON value, NaN and infinities included (json.dumps writes them).
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def pristine(
    sample_path: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
    ewt_texts: list[str],
) -> dict[str, Any]:
    """A pipeline saved with an int8 bundle (it has a spot check), the annotations of the
    process that saved it, and what serving its spot check needs."""
    nlp = spacy.load(sample_path("roberta"))
    cache = tmp_path_factory.mktemp("fuzz-cache")
    with pytest.MonkeyPatch.context() as patched:  # a module's fixture: as the tests' own
        patched.setattr(speed, "race", always_faster)
        spacy_accelerate.optimize(nlp, "cpu", "int8", cache_dir=cache)
    folder = tmp_path_factory.mktemp("fuzz") / "saved"
    nlp.to_disk(folder)
    shutil.rmtree(cache)
    (transformer,) = find_transformer_components(nlp)
    detected = detect_architecture(find_shim(transformer).read_pytorch_module())
    component = transformer.name
    texts = ewt_texts[:6]
    return {
        "folder": folder,
        "expected": [annotations(doc) for doc in run(nlp, texts, 8)],
        "texts": texts,
        "detected": detected,
        "config": build_config("cpu", "int8"),
        "key": json.loads((folder / BUNDLE_DIR / BUNDLE_FILE).read_text())["models"][component][
            "key"
        ],
    }


# --------------------------------------------------------------------------- mutations


DEPTHS = [33, 100, 5_000, 100_000]
RAW_VALUES = [b"1e999", b"-1e999", b"9" * 5_000, b'"' + b"9" * 5_000 + b'"', b"-0.0", b"1e-400"]


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@st.composite
def json_mutations(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` (a JSON file) changed: a value replaced, a key removed, a deep nesting
    put in, NaN, or its bytes broken."""
    kind = draw(st.sampled_from(["replace", "remove", "nest", "raw", "bytes", "whole"]))
    if kind == "bytes":
        return draw(byte_mutations(original))
    if kind == "whole":
        depth = draw(st.sampled_from([33, 1_000, 200_000]))
        return _deep(depth)
    value = json.loads(original)
    parent, key = _pick(draw, value)
    if parent is None:
        return json.dumps(draw(JSON_VALUES)).encode()
    if kind == "remove" and isinstance(parent, dict):
        del parent[key]
        return json.dumps(value).encode()
    marker = "\x00marker\x00"
    parent[key] = marker if kind in ("nest", "raw") else draw(JSON_VALUES)
    text = json.dumps(value).encode()
    if kind == "nest":
        return text.replace(json.dumps(marker).encode(), _deep(draw(st.sampled_from(DEPTHS))))
    if kind == "raw":  # what json.dumps never writes: overflowing numbers, huge ones
        return text.replace(json.dumps(marker).encode(), draw(st.sampled_from(RAW_VALUES)))
    return text


def _pick(draw: st.DrawFn, value: Any) -> tuple[Any, Any]:
    """A container inside ``value`` and one of its keys (None, None: the whole value)."""
    parent, key = None, None
    node = value
    while isinstance(node, dict | list) and node and draw(st.booleans()):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, draw(st.sampled_from(keys))
        node = node[key]
    return parent, key


@st.composite
def byte_mutations(draw: st.DrawFn, original: bytes) -> bytes:
    data = bytearray(original)
    kind = draw(st.sampled_from(["truncate", "flip", "insert"]))
    at = draw(st.integers(0, max(0, len(data) - 1)))
    if kind == "truncate":
        return bytes(data[:at])
    if kind == "flip" and data:
        data[at] ^= draw(st.integers(1, 255))
        return bytes(data)
    return bytes(data[:at]) + draw(st.binary(min_size=1, max_size=16)) + bytes(data[at:])


@st.composite
def array_mutations(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` (an .npz file) changed: an array of another type, shape or values, one
    missing or added, a pickled object array, or its bytes broken."""
    if draw(st.booleans()):
        return draw(byte_mutations(original))
    with np.load(io.BytesIO(original)) as stored:
        arrays = {name: stored[name] for name in stored.files}
    name = draw(st.sampled_from(sorted(arrays)))
    kinds = ["dtype", "shape", "values", "remove", "add", "object", "not-npy", "rows"]
    kind = draw(st.sampled_from(kinds))
    if kind == "not-npy":  # a member of the right name that is no .npy array
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for member in arrays:
                archive.writestr(f"{member}.npy", b"x" if member == name else b"")
        return buffer.getvalue()
    if kind == "dtype":
        arrays[name] = arrays[name].astype(draw(st.sampled_from(["float32", "uint8", "bool"])))
    elif kind == "shape":
        arrays[name] = arrays[name].reshape(-1) if draw(st.booleans()) else arrays[name][:, :1]
    elif kind == "values":
        arrays[name] = np.full_like(arrays[name], draw(st.sampled_from([-1, 2, 10**6, 2**62])))
    elif kind == "remove":
        del arrays[name]
    elif kind == "add":
        arrays["9.input_ids"] = arrays[name]
    elif kind == "rows":
        arrays[name] = np.zeros((2_000_000, 1), dtype=np.uint8)
    else:
        arrays[name] = np.array([{"not": "ids"}], dtype=object)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _rehash(bundle: Path, key: str, changed: str) -> None:
    """Write the records of ``changed`` (a bundle file's name) again where they can be, so
    that only its contents are wrong: in the entry's manifest, then in bundle.json."""
    listing_path = bundle / BUNDLE_FILE
    names = [f"{key}/{changed}"] if changed != BUNDLE_FILE else []
    if changed not in (BUNDLE_FILE, MANIFEST):
        try:
            manifest = json.loads((bundle / key / MANIFEST).read_text())
            manifest["files"][changed] = _record(bundle / key / changed)
            (bundle / key / MANIFEST).write_text(json.dumps(manifest))
            names.append(f"{key}/{MANIFEST}")
        except (ValueError, KeyError, TypeError):
            pass
    try:
        listing = json.loads(listing_path.read_text())
        for name in names:
            listing["files"][name] = _record(bundle / name)
        listing_path.write_text(json.dumps(listing))
    except (ValueError, KeyError, TypeError, RecursionError):
        pass


def _record(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@st.composite
def mutated_files(draw: st.DrawFn, bundle: Path, key: str) -> tuple[str, bytes]:
    """One parsed file of ``bundle`` (by its name there) and its mutated contents."""
    name = draw(
        st.sampled_from(
            [BUNDLE_FILE, f"{key}/{MANIFEST}", f"{key}/{PARITY}"] + [f"{key}/{SPOT_CHECK_FILE}"]
        )
    )
    original = (bundle / name).read_bytes()
    mutate = array_mutations if name.endswith(".npz") else json_mutations
    return name, draw(mutate(original))


# --------------------------------------------------------------------------- reading


@contextmanager
def opened_files() -> Iterator[list[str]]:
    """The paths Python opens or lists while the block runs (an audit hook: it cannot be
    removed, so one hook serves every test, switched by this context)."""
    found: list[str] = []
    _RECORDING.append(found)
    try:
        yield found
    finally:
        _RECORDING.remove(found)


_RECORDING: list[list[str]] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _RECORDING and event in ("open", "os.listdir", "os.scandir") and args:
        path = args[0]
        if isinstance(path, str | bytes | Path):
            _RECORDING[-1].append(str(Path(path.decode() if isinstance(path, bytes) else path)))


sys.addaudithook(_audit)


def fuzzed(examples: int) -> Any:
    """Hypothesis's settings for ``examples`` mutations, the same on every run (CI)."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def _mutated_copy(pristine: dict[str, Any], data: st.DataObject, root: Path) -> Path:
    """A pipeline folder holding a copy of the bundle with one file mutated and rehashed."""
    source = pristine["folder"] / BUNDLE_DIR
    folder = root / "pipeline"
    shutil.copytree(source, folder / BUNDLE_DIR)
    name, contents = data.draw(mutated_files(folder / BUNDLE_DIR, pristine["key"]))
    (folder / BUNDLE_DIR / name).write_bytes(contents)
    _rehash(folder / BUNDLE_DIR, pristine["key"], name.split("/")[-1])
    return folder


@pytest.mark.slow
@fuzzed(2000)
@given(data=st.data())
def test_a_mutated_bundle_is_read_as_before_or_refused_with_a_bundle_error(
    pristine: dict[str, Any], data: st.DataObject
):
    with tempfile.TemporaryDirectory() as temporary:
        folder = _mutated_copy(pristine, data, Path(temporary))
        inside = str(folder.resolve())
        with opened_files() as opened:
            try:
                bundle = read_bundle(folder)
                assert bundle is not None
                for component in bundle.models:
                    bundle_module._spot_check(
                        bundle, component, pristine["config"], pristine["detected"]
                    )
            except (BundleError, Unservable):
                pass
        outside = [path for path in opened if not str(Path(path).resolve()).startswith(inside)]
        assert outside == []


@fuzzed(12)
@given(data=st.data())
def test_a_mutated_bundle_that_is_read_serves_the_same_annotations(
    pristine: dict[str, Any], data: st.DataObject, cache_dir: Path
):
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        shutil.copytree(
            pristine["folder"], root / "whole", ignore=shutil.ignore_patterns(BUNDLE_DIR)
        )
        folder = _mutated_copy(pristine, data, root)
        shutil.copytree(root / "whole", folder, dirs_exist_ok=True)
        try:
            loaded = spacy.load(folder)
        except BundleError:
            return
        assert [annotations(doc) for doc in run(loaded, pristine["texts"], 8)] == pristine[
            "expected"
        ]


def test_spot_check_items_are_read_without_pickles_and_checked_against_the_encoder(
    pristine: dict[str, Any], tmp_path: Path
):
    spec = pristine["detected"].spec
    items = [EncoderInputs.uniform(spec, 2, 5)]
    save_spot_check(items, tmp_path)
    (read,) = load_spot_check(tmp_path / SPOT_CHECK_FILE)
    assert np.array_equal(read.input_ids, items[0].input_ids)
    check_items([read], spec)
    too_far = replace(read, input_ids=np.full_like(read.input_ids, spec.vocab_size))
    with pytest.raises(CorruptEntry, match="cannot take"):
        check_items([too_far], spec)
    arrays = {f"0.{name}": np.array([[{"pickled": 1}]], dtype=object) for name in ITEM_ARRAYS}
    np.savez(tmp_path / SPOT_CHECK_FILE, **arrays)  # type: ignore[arg-type]
    with pytest.raises(CorruptEntry, match="not an archive of numpy arrays"):
        load_spot_check(tmp_path / SPOT_CHECK_FILE)


def test_every_installed_runtime_names_its_release_as_a_bundle_may_record_it():
    versions = {backend.runtime_version() for backend in backends()}
    assert versions - {None}  # ONNX Runtime and OpenVINO are installed in CI
    for version in versions - {None}:
        assert RELEASE_PATTERN.fullmatch(version), version
