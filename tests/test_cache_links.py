"""The cache's own folders refuse links (issue 53, item 6).

A link planted anywhere under the cache root (the lock folder, a lock file, a build's
staging folder, an entry's place, a derived folder or a folder above one) must never carry
a ``mkdir``, a lock file, a write or a deletion outside the root. Where the cache would
make, lock or write there, it raises :class:`CacheError` naming the link and saying what to
do; clearing never follows one. Each test checks that the folder the link points to is
exactly as it was.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import spacy_accelerate
from spacy_accelerate.backends.onnxruntime.backend import TENSORRT_ENGINES
from spacy_accelerate.backends.openvino.backend import OPENVINO_BLOBS
from spacy_accelerate.cache.store import OWNER_MARK, ModelCache
from spacy_accelerate.errors import CacheError

KEY = hashlib.sha256(b"model-a").hexdigest()
OTHER_KEY = hashlib.sha256(b"model-b").hexdigest()
INPUTS = {"model": "en_core_web_trf", "opset": 17, "precision": "fp32"}


class Builder:
    """A builder that counts its runs and writes one small model file."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, tmp_dir: Path) -> None:
        self.calls += 1
        (tmp_dir / "model.onnx").write_bytes(b"onnx-model")


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` (links not followed), with the bytes of its files."""
    found: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            regular = path.is_file() and not path.is_symlink()
            found[str(path.relative_to(folder))] = path.read_bytes() if regular else None
    return found


@pytest.fixture
def cache(tmp_path: Path) -> ModelCache:
    return ModelCache(tmp_path / "cache", lock_timeout=5)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the cache root holding someone's file."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "precious.txt").write_text("the user's own words")
    return folder


def _assert_names_the_link(err: CacheError, link: Path) -> None:
    message = str(err)
    assert str(link) in message and "symbolic link" in message, message
    assert "cache_dir=" in message and "SPACY_ACCELERATE_CACHE" in message, message


def test_a_linked_lock_folder_is_refused(
    cache: ModelCache, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = cache.get_or_build(KEY, INPUTS, Builder()).entry
    shutil.rmtree(cache.root / ".locks")
    os.symlink(outside, cache.root / ".locks")
    before = _snapshot(outside)
    builder = Builder()
    with pytest.raises(CacheError) as info:
        cache.get_or_build(OTHER_KEY, INPUTS, builder)
    _assert_names_the_link(info.value, cache.root / ".locks")
    with pytest.raises(CacheError):
        cache.evict(KEY)
    monkeypatch.setenv("SPACY_ACCELERATE_CACHE", str(cache.root))  # as the report had it
    with pytest.raises(CacheError):
        spacy_accelerate.clear_cache()
    assert builder.calls == 0
    assert _snapshot(outside) == before  # no <key>.lock, no .owner record out there
    assert cache.lookup(KEY) == built  # and nothing was removed either


def test_a_linked_lock_file_is_refused(cache: ModelCache, outside: Path) -> None:
    (cache.root / ".locks").mkdir(parents=True)
    link = cache.root / ".locks" / f"{KEY}.lock"
    os.symlink(outside / "precious.txt", link)
    before = _snapshot(outside)
    builder = Builder()
    with pytest.raises(CacheError) as info:
        cache.get_or_build(KEY, INPUTS, builder)
    _assert_names_the_link(info.value, link)
    assert builder.calls == 0 and _snapshot(outside) == before


def test_a_link_at_a_staging_folder_is_refused(
    cache: ModelCache, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(secrets, "token_hex", lambda n=16: "ab" * n)
    cache.root.mkdir(parents=True)
    link = cache.root / f".tmp-{KEY}-{'ab' * 8}"  # the build folder get_or_build makes
    os.symlink(outside, link)
    before = _snapshot(outside)
    builder = Builder()
    with pytest.raises(CacheError) as info:
        cache.get_or_build(KEY, INPUTS, builder)
    _assert_names_the_link(info.value, link)
    assert builder.calls == 0 and _snapshot(outside) == before and link.is_symlink()


def test_a_link_at_an_entrys_place_is_refused(
    cache: ModelCache, outside: Path, tmp_path: Path
) -> None:
    # Outside: a whole, valid entry of the key, so that following the link would pay.
    elsewhere = ModelCache(tmp_path / "elsewhere")
    shutil.copytree(elsewhere.get_or_build(KEY, INPUTS, Builder()).entry.path, outside / KEY)
    cache.root.mkdir(parents=True)
    link = cache.root / KEY
    os.symlink(outside / KEY, link)
    before = _snapshot(outside)
    builder = Builder()
    assert cache.lookup(KEY) is None  # never served
    with pytest.raises(CacheError) as info:
        cache.get_or_build(KEY, INPUTS, builder)
    _assert_names_the_link(info.value, link)
    assert cache.evict(KEY) is False and spacy_accelerate.clear_cache(cache.root) == 0
    assert builder.calls == 0 and _snapshot(outside) == before and link.is_symlink()


@pytest.mark.parametrize(
    ("linked", "make"),
    [
        ("openvino", lambda c: c.derived_dir(OPENVINO_BLOBS, KEY, "cpu")),
        ("openvino/cpu", lambda c: c.derived_dir(OPENVINO_BLOBS, KEY, "cpu")),
        (f"openvino/cpu/{KEY}", lambda c: c.derived_dir(OPENVINO_BLOBS, KEY, "cpu")),
        ("tensorrt/gpu0", lambda c: c.derived_dir(TENSORRT_ENGINES, KEY, "gpu0", "abcd")),
        ("tensorrt/gpu0/timing", lambda c: c.shared_dir(TENSORRT_ENGINES, "gpu0", "timing")),
    ],
    ids=["kind", "device", "key", "variant-parent", "shared"],
)
def test_a_derived_folder_with_a_link_on_the_way_is_refused(
    cache: ModelCache,
    outside: Path,
    linked: str,
    make: Callable[[ModelCache], Path | None],
) -> None:
    link = cache.root / linked
    link.parent.mkdir(parents=True)
    os.symlink(outside, link)
    before = _snapshot(outside)
    with pytest.raises(CacheError) as info:
        make(cache)
    _assert_names_the_link(info.value, link)
    assert _snapshot(outside) == before


def test_clearing_never_follows_a_link_out_of_the_root(
    cache: ModelCache, outside: Path, tmp_path: Path
) -> None:
    # Outside: what looks like the library's own folders (marked), reached through links
    # at a derived kind, a leftover build and an entry's place.
    for made in (f"cpu/{KEY}", f".tmp-{KEY}-crashed"):
        (outside / made).mkdir(parents=True)
        (outside / made / OWNER_MARK).write_text('{"made_by": "spacy-accelerate"}')
    built = cache.get_or_build(KEY, INPUTS, Builder()).entry
    os.symlink(outside, cache.root / "openvino")
    os.symlink(outside / f".tmp-{KEY}-crashed", cache.root / f".tmp-{KEY}-crashed")
    os.symlink(outside / f"cpu/{KEY}", cache.root / OTHER_KEY)
    before = _snapshot(outside)
    assert cache.evict(OTHER_KEY) is False
    assert spacy_accelerate.clear_cache(cache.root) == 1
    assert not built.path.exists() and _snapshot(outside) == before
    for name in ("openvino", f".tmp-{KEY}-crashed", OTHER_KEY):
        assert (cache.root / name).is_symlink()
