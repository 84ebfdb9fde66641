"""The paths a command writes, checked before it does any work: an optimization or a
benchmark that runs for minutes and then ends in ``Not a directory`` wastes them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: The file that makes a folder a spaCy pipeline (one ``--output`` may replace).
PIPELINE_CONFIG = "config.cfg"


class OutputPathError(ValueError):
    """An output path the command cannot write; the message names the flag and the fix."""


def check_pipeline_folder(path: Path, flag: str) -> None:
    """``path`` can take a saved pipeline: a new folder (made with its parents), an empty
    one, or a pipeline folder to replace, that this process can write into."""
    if os.path.lexists(path):
        if not path.is_dir():
            raise OutputPathError(
                f"{flag} {path} is a file: give a folder to save the pipeline in (it is made "
                "if missing)."
            )
        if any(path.iterdir()) and not (path / PIPELINE_CONFIG).is_file():
            raise OutputPathError(
                f"{flag} {path} is a folder of other files, not a pipeline: give a new or "
                "empty folder, or a pipeline folder to replace."
            )
        _check_writable(path, path, flag)
    else:
        _check_writable(path, _nearest_existing(path), flag)


def check_file(path: Path, flag: str) -> None:
    """``path`` can take a file: not a folder, its folder (made where missing) writable."""
    if path.is_dir():
        raise OutputPathError(f"{flag} {path} is a folder: give a file name.")
    _check_writable(path, _nearest_existing(path.parent), flag)


def _nearest_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _check_writable(path: Path, folder: Path, flag: str) -> None:
    """Tried for real, not by permission bits (``os.access`` says yes to root)."""
    if not folder.is_dir():
        raise OutputPathError(f"{flag} {path} cannot be made: {folder} is a file, not a folder.")
    try:
        handle, probe = tempfile.mkstemp(prefix=".spacy-accelerate-probe-", dir=folder)
    except OSError as error:
        raise OutputPathError(
            f"{flag} {path} cannot be written: {folder} is not writable here "
            f"({error.strerror or error}). Give a path you can write to."
        ) from None
    os.close(handle)
    os.unlink(probe)
