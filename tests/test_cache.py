"""Tests of the on-disk model cache: hits, verification, eviction, locking, locations."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import filelock
import pytest

import spacy_accelerate
from spacy_accelerate.backends.onnxruntime.backend import TENSORRT_ENGINES
from spacy_accelerate.backends.openvino.backend import OPENVINO_BLOBS
from spacy_accelerate.cache.store import (
    MANIFEST_NAME,
    OWNER_MARK,
    CacheEntry,
    ModelCache,
    default_cache_dir,
    resolve_cache_dir,
)
from spacy_accelerate.errors import CacheError

KEY = hashlib.sha256(b"model-a").hexdigest()
OTHER_KEY = hashlib.sha256(b"model-b").hexdigest()
INPUTS = {"model": "en_core_web_trf", "opset": 17, "precision": "fp32"}
MODEL_BYTES = b"onnx-model-" * 1000
EXTRA_BYTES = b"external-data" * 500


class CountingBuilder:
    """A builder that records how often it ran, writing a model and an external-data file."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, tmp_dir: Path) -> None:
        self.calls += 1
        (tmp_dir / "model.onnx").write_bytes(MODEL_BYTES)
        (tmp_dir / "weights").mkdir()
        (tmp_dir / "weights" / "data.bin").write_bytes(EXTRA_BYTES)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _crashed_build(root: Path, key: str, suffix: str = "crashed") -> Path:
    """The folder a build of the library leaves when it is killed: marked, half written."""
    folder = root / f".tmp-{key}-{suffix}"
    folder.mkdir(parents=True)
    (folder / OWNER_MARK).write_text('{"made_by": "spacy-accelerate"}')
    return folder


def _manifest_with(folder: Path, **record: object) -> None:
    """The entry's manifest with ``record`` merged into model.onnx's record."""
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    manifest["files"]["model.onnx"].update(record)
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".tmp-"))


def _entry_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


@pytest.fixture
def cache(tmp_path: Path) -> ModelCache:
    return ModelCache(tmp_path / "cache")


@pytest.fixture
def built(cache: ModelCache) -> CacheEntry:
    return cache.get_or_build(KEY, INPUTS, CountingBuilder()).entry


# --------------------------------------------------------------------------- hit / miss


def test_miss_then_hit_builds_once(cache: ModelCache) -> None:
    builder = CountingBuilder()
    first = cache.get_or_build(KEY, INPUTS, builder)
    second = cache.get_or_build(KEY, INPUTS, builder)
    assert (first.hit, second.hit) == (False, True)
    assert builder.calls == 1
    assert first.entry.path == second.entry.path == cache.root / KEY
    assert second.entry.file("model.onnx").read_bytes() == MODEL_BYTES
    assert first.seconds >= 0 and second.seconds >= 0
    assert cache.lookup(KEY) is not None
    assert cache.lookup(OTHER_KEY) is None


def test_manifest_records_files_and_inputs(built: CacheEntry) -> None:
    on_disk = json.loads((built.path / MANIFEST_NAME).read_text())
    assert on_disk == built.manifest
    assert on_disk["key"] == KEY
    assert on_disk["key_inputs"] == INPUTS
    assert on_disk["spacy_accelerate_version"] == spacy_accelerate.__version__
    assert on_disk["format_version"] == 1
    mark = (built.path / OWNER_MARK).read_bytes()
    assert on_disk["files"] == {
        "model.onnx": {"size": len(MODEL_BYTES), "sha256": _sha256(MODEL_BYTES)},
        "weights/data.bin": {"size": len(EXTRA_BYTES), "sha256": _sha256(EXTRA_BYTES)},
        OWNER_MARK: {"size": len(mark), "sha256": _sha256(mark)},  # the library made it
    }
    created = datetime.fromisoformat(built.created)
    assert created.utcoffset() is not None and created.utcoffset().total_seconds() == 0
    manifest_size = (built.path / MANIFEST_NAME).stat().st_size
    assert built.size_bytes == len(MODEL_BYTES) + len(EXTRA_BYTES) + len(mark) + manifest_size


def test_entry_file_refuses_unlisted_names(built: CacheEntry) -> None:
    assert built.file("weights/data.bin") == built.path / "weights" / "data.bin"
    with pytest.raises(CacheError, match="not a file of the cache entry"):
        built.file("other.onnx")
    with pytest.raises(CacheError):
        built.file(MANIFEST_NAME)


def test_key_inputs_must_be_json(cache: ModelCache) -> None:
    builder = CountingBuilder()
    with pytest.raises(TypeError, match="JSON"):
        cache.get_or_build(KEY, {"path": Path("x")}, builder)
    assert builder.calls == 0


# --------------------------------------------------------------------------- locations


def test_argument_beats_env_beats_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPACY_ACCELERATE_CACHE", str(tmp_path / "from-env"))
    assert default_cache_dir() == tmp_path / "from-env"
    assert resolve_cache_dir(None) == tmp_path / "from-env"
    assert ModelCache().root == tmp_path / "from-env"
    assert resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"
    assert ModelCache(str(tmp_path / "arg")).root == tmp_path / "arg"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG layout is Linux's")
def test_default_is_user_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPACY_ACCELERATE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "spacy-accelerate"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ModelCache().root == tmp_path / "xdg" / "spacy-accelerate"


def test_lookup_does_not_create_the_folder(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "absent")
    assert cache.lookup(KEY) is None
    assert cache.entries() == []
    assert cache.size_bytes() == 0
    assert cache.clear() == 0
    assert not (tmp_path / "absent").exists()


def test_unwritable_parent_is_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    cache = ModelCache(blocker / "cache")
    builder = CountingBuilder()
    with pytest.raises(CacheError, match="SPACY_ACCELERATE_CACHE") as info:
        cache.get_or_build(KEY, INPUTS, builder)
    assert str(blocker / "cache") in str(info.value)
    assert "cache_dir=" in str(info.value)
    assert builder.calls == 0


# --------------------------------------------------------------------------- corruption


def _assert_rebuilt(
    cache: ModelCache, caplog: pytest.LogCaptureFixture, reason: str | None = None
) -> None:
    builder = CountingBuilder()
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        result = cache.get_or_build(KEY, INPUTS, builder)
    assert result.hit is False
    assert builder.calls == 1
    assert result.entry.file("model.onnx").read_bytes() == MODEL_BYTES
    messages = [r.getMessage() for r in caplog.records if r.name == "spacy_accelerate"]
    assert any("Evicted" in m and KEY in m for m in messages), messages
    if reason is not None:
        assert any(reason in m for m in messages), messages
    assert _leftovers(cache.root) == []
    assert cache.get_or_build(KEY, INPUTS, builder).hit is True


def test_truncated_model_is_evicted_and_rebuilt(
    cache: ModelCache, built: CacheEntry, caplog: pytest.LogCaptureFixture
) -> None:
    model = built.file("model.onnx")
    model.write_bytes(model.read_bytes()[:100])
    _assert_rebuilt(cache, caplog, reason="model.onnx has 100 bytes")


def test_same_size_corruption_is_caught_by_sha256(
    cache: ModelCache, built: CacheEntry, caplog: pytest.LogCaptureFixture
) -> None:
    model = built.file("model.onnx")
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    assert cache.lookup(KEY) is None
    assert not (cache.root / KEY).exists()
    _assert_rebuilt(cache, caplog)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: (p / MANIFEST_NAME).unlink(), "manifest.json is missing"),
        (lambda p: (p / MANIFEST_NAME).write_text('{"key": "'), "not valid JSON"),
        (lambda p: (p / MANIFEST_NAME).write_text("[1, 2]"), "not a JSON object"),
        (lambda p: (p / "weights" / "data.bin").unlink(), "weights/data.bin is missing"),
        (lambda p: (p / MANIFEST_NAME).write_text("[" * 200_000 + "]" * 200_000), "too deeply"),
        (lambda p: (p / MANIFEST_NAME).write_text('{"a": ' * 40 + "1" + "}" * 40), "deeper"),
        (lambda p: (p / MANIFEST_NAME).write_text('{"created": NaN}'), "NaN is not a number"),
        (lambda p: (p / MANIFEST_NAME).write_bytes(b'{"key": "\xff"}'), "not valid JSON"),
        (lambda p: _manifest_with(p, size=True), "record of 'model.onnx' is malformed"),
    ],
    ids=[
        "missing-manifest",
        "garbled-manifest",
        "manifest-not-object",
        "extra-file-missing",
        "nested-past-the-parser",
        "nested-past-the-bound",
        "nan",
        "not-utf8",
        "bool-size",
    ],
)
def test_damaged_entry_is_rebuilt(
    cache: ModelCache,
    built: CacheEntry,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[Path], None],
    reason: str,
) -> None:
    damage(built.path)
    _assert_rebuilt(cache, caplog, reason=reason)


def test_manifest_for_another_key_is_not_served(
    cache: ModelCache, built: CacheEntry, caplog: pytest.LogCaptureFixture
) -> None:
    os.rename(built.path, cache.root / OTHER_KEY)  # folder OTHER_KEY, manifest says KEY
    assert cache.lookup(OTHER_KEY) is None
    builder = CountingBuilder()
    result = cache.get_or_build(OTHER_KEY, INPUTS, builder)
    assert (result.hit, builder.calls) == (False, 1)
    assert result.entry.manifest["key"] == OTHER_KEY


def test_manifest_pointing_outside_the_entry_is_not_served(
    cache: ModelCache, built: CacheEntry, tmp_path: Path
) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"secret")
    manifest = dict(built.manifest)
    manifest["files"] = {"../../secret.txt": {"size": 6, "sha256": _sha256(b"secret")}}
    (built.path / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert cache.lookup(KEY) is None


def test_leftover_temp_dir_is_never_served_and_is_swept(cache: ModelCache) -> None:
    crashed = _crashed_build(cache.root, KEY)
    (crashed / "model.onnx").write_bytes(b"half")
    _crashed_build(cache.root, OTHER_KEY)
    assert cache.lookup(KEY) is None
    assert cache.entries() == []
    builder = CountingBuilder()
    assert cache.get_or_build(KEY, INPUTS, builder).hit is False
    assert builder.calls == 1
    assert _leftovers(cache.root) == []


def test_temp_dir_of_a_live_build_is_kept(cache: ModelCache) -> None:
    live = _crashed_build(cache.root, OTHER_KEY, "inprogress")
    lock = filelock.FileLock(str(cache.root / ".locks" / f"{OTHER_KEY}.lock"))
    with lock:  # stands in for another process that is building OTHER_KEY right now
        assert cache.get_or_build(KEY, INPUTS, CountingBuilder()).hit is False
        assert live.exists()
    cache.evict(KEY)  # once the lock is free, the next miss sweeps it
    cache.get_or_build(KEY, INPUTS, CountingBuilder())
    assert not live.exists()


# --------------------------------------------------------------------------- builder failure


class BuildFailed(Exception):
    pass


def test_failing_builder_leaves_cache_unchanged(cache: ModelCache) -> None:
    original = BuildFailed("export crashed")

    def build(tmp_dir: Path) -> None:
        (tmp_dir / "model.onnx").write_bytes(b"partial")
        raise original

    with pytest.raises(BuildFailed) as info:
        cache.get_or_build(KEY, INPUTS, build)
    assert info.value is original
    assert _entry_dirs(cache.root) == []
    assert _leftovers(cache.root) == []
    assert cache.lookup(KEY) is None


def test_failing_rebuild_keeps_other_entries(cache: ModelCache) -> None:
    cache.get_or_build(OTHER_KEY, INPUTS, CountingBuilder())

    def build(tmp_dir: Path) -> None:
        raise BuildFailed

    with pytest.raises(BuildFailed):
        cache.get_or_build(KEY, INPUTS, build)
    assert [e.key for e in cache.entries()] == [OTHER_KEY]


def test_builder_writing_nothing_is_an_error(cache: ModelCache) -> None:
    with pytest.raises(CacheError, match="no files"):
        cache.get_or_build(KEY, INPUTS, lambda tmp_dir: None)
    assert _entry_dirs(cache.root) == [] and _leftovers(cache.root) == []


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize(
    "bad_key",
    ["../x", KEY.upper(), KEY[:-1], KEY + "0", "", f"../{KEY[3:]}", KEY[:-1] + "g"],
    ids=["traversal", "uppercase", "short", "long", "empty", "traversal-64", "non-hex"],
)
def test_invalid_keys_are_rejected(cache: ModelCache, bad_key: str) -> None:
    builder = CountingBuilder()
    with pytest.raises(ValueError, match="invalid cache key"):
        cache.get_or_build(bad_key, INPUTS, builder)
    with pytest.raises(ValueError):
        cache.lookup(bad_key)
    with pytest.raises(ValueError):
        cache.evict(bad_key)
    assert builder.calls == 0


# --------------------------------------------------------------------------- management


def test_entries_size_evict_and_clear(cache: ModelCache, built: CacheEntry) -> None:
    other = cache.get_or_build(OTHER_KEY, {"model": "b"}, CountingBuilder()).entry
    (cache.root / "junk.txt").write_text("not an entry")
    (cache.root / hashlib.sha256(b"broken").hexdigest()).mkdir()  # no manifest, empty
    assert [e.key for e in cache.entries()] == sorted([KEY, OTHER_KEY])
    assert (cache.root / hashlib.sha256(b"broken").hexdigest()).exists()  # listing is read-only

    expected = built.size_bytes + other.size_bytes + len("not an entry")
    assert cache.size_bytes() == expected
    linked = cache.root / "linked.txt"  # a file in two places takes its room once
    os.link(cache.root / "junk.txt", linked)
    assert cache.size_bytes() == expected
    linked.unlink()

    assert cache.evict(OTHER_KEY) is True
    assert cache.evict(OTHER_KEY) is False
    assert [e.key for e in cache.entries()] == [KEY]

    stale = _crashed_build(cache.root, OTHER_KEY)
    (stale / "model.onnx").write_bytes(b"x" * 10)
    assert cache.clear() == 1  # KEY; the empty folder goes too, but held no entry
    assert cache.entries() == []
    assert _entry_dirs(cache.root) == ["junk.txt"]
    assert _leftovers(cache.root) == []
    assert cache.size_bytes() == len("not an entry")
    assert cache.get_or_build(KEY, INPUTS, CountingBuilder()).hit is False


# --------------------------------------------------------------------------- processes

_WORKER = """
import json, sys, time
from pathlib import Path
from spacy_accelerate.cache.store import ModelCache

root, key, counter, ready, go = sys.argv[1:6]
Path(ready).touch()
deadline = time.monotonic() + 30
while not Path(go).exists():
    if time.monotonic() > deadline:
        sys.exit("never got the go signal")
    time.sleep(0.005)

def build(tmp_dir):
    with open(counter, "a") as handle:
        handle.write("built\\n")
    time.sleep(1.0)
    (tmp_dir / "model.onnx").write_bytes(b"shared model")

result = ModelCache(root).get_or_build(key, {"worker": True}, build)
print(json.dumps({"hit": result.hit, "path": str(result.entry.path)}))
"""


def test_two_processes_build_once(tmp_path: Path) -> None:
    root = tmp_path / "shared-cache"
    counter = tmp_path / "counter.txt"
    go = tmp_path / "go"
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    readies = [tmp_path / f"ready-{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(root), KEY, str(counter), str(ready), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for ready in readies
    ]
    try:
        deadline = time.monotonic() + 20
        while not all(r.exists() for r in readies):
            assert time.monotonic() < deadline, "workers did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        go.touch()  # release both at once so their builds would overlap without the lock
        outputs = [p.communicate(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    results = [json.loads(out.strip().splitlines()[-1]) for out, _err in outputs]
    assert sorted(r["hit"] for r in results) == [False, True]
    assert {r["path"] for r in results} == {str(root / KEY)}
    assert counter.read_text().splitlines() == ["built"]
    assert _entry_dirs(root) == [KEY]
    assert _leftovers(root) == []
    assert ModelCache(root).lookup(KEY) is not None


# --------------------------------------------------------------------------- only its own files


def _user_file(path: Path, text: str = "the user's own words") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_clear_and_evict_remove_only_what_the_library_made(
    cache: ModelCache, built: CacheEntry, tmp_path: Path
) -> None:
    root = cache.root
    # What the library made: an entry (built), OpenVINO blobs, TensorRT engines and timing.
    blobs = cache.derived_dir(OPENVINO_BLOBS, KEY, "cpu-a")
    (blobs / "123.blob").write_bytes(b"blob")
    (blobs / "blobs.json").write_text("{}")
    engines = cache.derived_dir(TENSORRT_ENGINES, KEY, "gpu0", "abcd")
    (engines / "model.engine").write_bytes(b"engine")
    timing = cache.shared_dir(TENSORRT_ENGINES, "gpu1", "timing")
    (timing / "cache.timing").write_bytes(b"timing")
    # What it did not make: a user's files and folders, and links to folders outside.
    thesis = tmp_path / "thesis"
    chapters = [_user_file(thesis / f"chapter-{i}.tex") for i in range(3)]
    (root / "openvino").mkdir(exist_ok=True)
    os.symlink(thesis, root / "openvino" / "some-cpu")
    os.symlink(thesis, root / "openvino" / "cpu-a" / OTHER_KEY)
    os.symlink(thesis, root / OTHER_KEY)
    os.symlink(thesis, root / "tensorrt" / "gpu9")
    kept = [
        _user_file(root / "openvino" / "notes.txt"),
        _user_file(root / "openvino" / "cpu-b" / KEY / "mine.txt"),  # key-named, not marked
        _user_file(root / "tensorrt" / "gpu0" / "timing" / "user.txt"),  # not marked
        _user_file(root / ".tmp-notes" / "keep.txt"),
        _user_file(root / f".tmp-{KEY}-lookalike" / "keep.txt"),
        _user_file(root / hashlib.sha256(b"user").hexdigest() / "keep.txt"),
    ]

    assert cache.evict(OTHER_KEY) is False  # a link at the entry's place: not followed
    assert cache.clear() == 1
    assert [path.read_text() for path in [*chapters, *kept]] == ["the user's own words"] * 9
    assert sorted(p.name for p in thesis.iterdir()) == [
        "chapter-0.tex",
        "chapter-1.tex",
        "chapter-2.tex",
    ]
    for made in (built.path, blobs, engines, timing):
        assert not made.exists(), made
    assert (root / OTHER_KEY).is_symlink() and (root / "openvino" / "some-cpu").is_symlink()


def test_derived_folders_are_never_made_or_used_through_a_link(
    cache: ModelCache, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "outside"
    precious = _user_file(outside / "precious.txt")
    cache.root.mkdir(parents=True)
    os.symlink(outside, cache.root / "openvino")
    os.symlink(outside, cache.root / "tensorrt")
    # A link on the way is refused by name (the backends then do without the folder).
    with pytest.raises(CacheError, match="openvino is a symbolic link"):
        cache.derived_dir(OPENVINO_BLOBS, KEY, "cpu")
    with pytest.raises(CacheError, match="tensorrt is a symbolic link"):
        cache.derived_dir(TENSORRT_ENGINES, KEY, "gpu0", "abcd")
    with pytest.raises(CacheError, match="tensorrt is a symbolic link"):
        cache.shared_dir(TENSORRT_ENGINES, "gpu0", "timing")
    assert [p.name for p in outside.iterdir()] == ["precious.txt"]  # nothing made in there
    assert precious.read_text() == "the user's own words"
    # A folder at a blob folder's place that the library did not make is not used.
    (cache.root / "openvino").unlink()
    _user_file(cache.root / "openvino" / "cpu" / KEY / "mine.txt")
    with caplog.at_level(logging.WARNING, logger="spacy_accelerate"):
        assert cache.derived_dir(OPENVINO_BLOBS, KEY, "cpu") is None
    assert "not using" in caplog.text
    assert (
        cache.derived_dir(OPENVINO_BLOBS, OTHER_KEY, "cpu")
        == cache.root / "openvino" / "cpu" / OTHER_KEY
    )


def test_a_foreign_folder_at_an_entrys_place_is_never_served_or_removed(
    cache: ModelCache,
) -> None:
    mine = _user_file(cache.root / KEY / "model.onnx", "not a model")
    builder = CountingBuilder()
    with pytest.raises(CacheError, match="not made by spacy-accelerate") as info:
        cache.get_or_build(KEY, INPUTS, builder)
    assert str(cache.root / KEY) in str(info.value) and "cache_dir=" in str(info.value)
    assert builder.calls == 0 and mine.read_text() == "not a model"
    assert cache.lookup(KEY) is None and cache.clear() == 0 and mine.exists()


# --------------------------------------------------------------------------- complete entries


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ("weights.bin", "weights.bin"),
        ("weights/other.bin", "weights/other.bin"),
        ("sub/x.bin", "sub"),
    ],
    ids=["top", "beside", "deep"],
)
def test_a_file_the_manifest_does_not_list_refuses_the_entry(
    cache: ModelCache,
    built: CacheEntry,
    caplog: pytest.LogCaptureFixture,
    extra: str,
    named: str,
) -> None:
    # A runtime loads files it finds beside the model (ONNX external data): never unverified.
    _user_file(built.path / extra, "corrupted weights")
    assert cache.lookup(KEY) is None
    _assert_rebuilt(
        cache, caplog, reason=f"{named} is in {built.path} but not listed in manifest.json"
    )
    assert not (cache.root / KEY / extra).exists()


def test_an_entry_without_a_file_its_user_needs_is_rebuilt(
    cache: ModelCache, built: CacheEntry, caplog: pytest.LogCaptureFixture
) -> None:
    assert cache.lookup(KEY, required=("model.onnx",)) is not None
    assert cache.lookup(KEY, required=("model.onnx", "parity.json")) is None

    def build(tmp_dir: Path) -> None:
        CountingBuilder()(tmp_dir)
        (tmp_dir / "parity.json").write_text("{}")

    result = cache.get_or_build(KEY, INPUTS, build, required=("parity.json",))
    assert result.hit is False and result.entry.file("parity.json").read_text() == "{}"
    assert cache.get_or_build(KEY, INPUTS, build, required=("parity.json",)).hit is True


# --------------------------------------------------------------------------- waiting


def test_a_lock_wait_says_who_holds_it_and_lock_timeout_ends_it(
    cache: ModelCache, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spacy_accelerate.cache import lock as cache_lock

    monkeypatch.setattr(cache_lock, "NOTICE_AFTER", 0.2)
    cache._ensure_root()
    waiting = ModelCache(cache.root, lock_timeout=0.6)
    with cache._lock(KEY), caplog.at_level(logging.INFO, logger="spacy_accelerate"):
        with pytest.raises(CacheError, match="lock_timeout") as info:
            waiting.get_or_build(KEY, INPUTS, CountingBuilder())
    notices = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert notices and all(
        r.levelno == logging.INFO for r in caplog.records if "waiting" in r.getMessage()
    )
    assert f"pid {os.getpid()} on this machine" in notices[0]
    assert f"pid {os.getpid()}" in str(info.value)
    # Released: the record goes with the lock, and the next call builds at once.
    assert not list((cache.root / ".locks").glob("*.owner"))
    assert waiting.get_or_build(KEY, INPUTS, CountingBuilder()).hit is False
