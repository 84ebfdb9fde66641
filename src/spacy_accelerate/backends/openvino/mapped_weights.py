"""The IR's weights OpenVINO keeps mapped once its CPU plugin has packed its own copy.

OpenVINO reads an IR's ``model.bin`` (and imports a compiled blob from ``CACHE_DIR``) by
mapping the file, and its compiled model keeps that mapping for good. Its CPU plugin packs
the weights of every MatMul into a layout of its own at the first inference (bf16 under
the bf16 hint), so a served process held the weights twice: the mapped fp32 originals
(every page read once, while compiling) beside the packed copy. Bundled trf-base served on
OpenVINO bf16 took 1,233 MiB after annotating, 574 MiB of it file-backed, against 928 MiB
for the plain pipeline (issue 61).

After the first inference the mapped pages are given back (``madvise(MADV_DONTNEED)``
over each read-only mapping of those files): the mapping stays, so a page OpenVINO reads
again comes back from the file, unchanged, on its own. Under the bf16 hint no page came
back over shapes from one row of 7 pieces to 32 rows of 300, and the outputs stayed
bit-identical; under f32 the plugin reads some originals in place, and they come back as it
does (measured: docs/performance.md, "Issue 61: one model copy on OpenVINO"). The pages
stay in the system's page cache, shared by every process mapping the file, and
reclaimable.

Linux only (``/proc/self/maps``); elsewhere nothing is given back.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

logger = logging.getLogger("spacy_accelerate")

#: ``MADV_DONTNEED`` (asm-generic/mman-common.h): a private or shared file mapping's pages
#: are dropped from this process, and read from the file again where they are touched.
_MADV_DONTNEED = 4

_MAPS = Path("/proc/self/maps")

#: A file as ``/proc/self/maps`` names it whatever its path now: device and inode (a cache
#: entry's IR is mapped from its temporary folder, renamed to the entry's name after).
FileId = tuple[int, int, int]


def file_ids(paths: Sequence[Path]) -> frozenset[FileId]:
    """The files at ``paths`` (a folder: every file in it) as :func:`give_back` finds
    their mappings; a path that is gone is left out."""
    found = set()
    for path in paths:
        for file in sorted(path.iterdir()) if path.is_dir() else [path]:
            try:
                status = file.stat()
            except OSError:
                continue
            found.add((os.major(status.st_dev), os.minor(status.st_dev), status.st_ino))
    return frozenset(found)


def read_only_mappings(files: frozenset[FileId]) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` addresses of this process's read-only mappings of ``files``."""
    try:
        lines = _MAPS.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or "w" in fields[1] or fields[4] == "0":
            continue  # anonymous, or writable: its pages may hold what no file has
        major, minor = (int(part, 16) for part in fields[3].split(":"))
        if (major, minor, int(fields[4])) in files:
            start, end = (int(address, 16) for address in fields[0].split("-"))
            yield start, end


def give_back(files: frozenset[FileId]) -> int:
    """Drop this process's pages of its read-only mappings of ``files``; the bytes of
    address space covered (0 where there is none, or not on Linux)."""
    spans = list(read_only_mappings(files))
    if not spans:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    madvise = libc.madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    covered = 0
    for start, end in spans:
        if madvise(start, end - start, _MADV_DONTNEED) == 0:
            covered += end - start
        else:  # the mapping went meanwhile: nothing of it is held
            logger.debug("spacy-accelerate: madvise failed, errno %d", ctypes.get_errno())
    return covered
