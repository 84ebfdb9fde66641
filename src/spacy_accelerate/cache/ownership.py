"""Which folders under the cache root spacy-accelerate made, so that it removes only those.

A cache folder may be shared with other tools or hold a user's own files, and a path in it
may be a symbolic link to anywhere. Removal therefore follows three rules:

- a folder is removed only if the library made it: it holds the library's mark
  (:data:`MARK`, written when the folder is created), or it is an entry whose manifest
  names it (entries of releases before the mark);
- nothing is ever reached through a link: every path between the cache root and the
  folder is checked with ``lstat`` (:func:`~spacy_accelerate.cache.root.link_on_the_way`,
  the same check that makes the cache refuse links where it creates or writes), a link
  found there is left where it is, and ``shutil.rmtree`` removes a tree without following
  the links inside it;
- the folders that merely group others (a backend's ``<name>/`` and ``<name>/<device>/``,
  see :mod:`.derived`) are removed only when empty.

The same checks guard the derived folders handed to a runtime: a link on the way to one is
a :class:`CacheError` (:func:`~spacy_accelerate.cache.root.refuse_links`), and a real
folder the library did not make is not used for compiled blobs or engines (whose
unrecorded files are deleted before each compile).
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

from spacy_accelerate._version import __version__
from spacy_accelerate.cache.root import link_on_the_way, make_dirs, unwritable
from spacy_accelerate.errors import CacheError

#: The file that marks a folder as made by spacy-accelerate.
MARK = ".spacy-accelerate"


def is_real_dir(path: Path) -> bool:
    """A folder that is not a link (``Path.is_dir`` follows links)."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def reachable(root: Path, folder: Path) -> bool:
    """Whether ``folder`` is a real folder reached from ``root`` without a link: the only
    kind of folder the library lists for removal or removes."""
    return link_on_the_way(root, folder) is None and is_real_dir(folder)


def is_marked(folder: Path) -> bool:
    """Whether ``folder`` is a real folder holding the library's mark (a regular file)."""
    if not is_real_dir(folder):
        return False
    try:
        return stat.S_ISREG((folder / MARK).lstat().st_mode)
    except OSError:
        return False


def write_mark(folder: Path, kind: str) -> None:
    """Mark ``folder`` (which this process just created) as the library's."""
    record = {"made_by": "spacy-accelerate", "version": __version__, "kind": kind}
    (folder / MARK).write_text(json.dumps(record, sort_keys=True), encoding="utf8")


def make_owned_dir(root: Path, folder: Path, kind: str) -> Path | None:
    """Create ``folder`` (and its parents) under ``root`` and mark it; an existing folder is
    returned only if it is the library's. None otherwise: the caller then does without it.
    A :class:`CacheError` where a link is on the way or the folder cannot be made: nothing
    is ever created through a link (:func:`~spacy_accelerate.cache.root.make_dirs`)."""
    if make_dirs(root, folder):
        try:
            write_mark(folder, kind)
        except OSError as err:
            raise unwritable(folder, err) from err
    return folder if is_marked(folder) else None


def remove_tree(root: Path, folder: Path) -> bool:
    """Remove a real folder under ``root`` and everything in it, links inside removed as
    links, never followed; True if something was removed. A link at ``folder`` or on the
    way to it is left alone, so that nothing outside ``root`` is ever deleted."""
    if not reachable(root, folder):
        return False
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        return False
    except OSError as err:
        raise CacheError(
            f"cannot remove {folder} from the model cache ({err.strerror or err}); check its "
            "permissions (or whether another program holds files in it) and clear again"
        ) from err
    return True


def remove_if_empty(root: Path, folder: Path) -> None:
    """Remove ``folder`` when nothing is left in it (another process may be adding); a link
    at it or on the way to it is left alone."""
    if not reachable(root, folder):
        return
    try:
        folder.rmdir()
    except OSError:
        pass


def real_subdirs(root: Path, folder: Path) -> list[Path]:
    """The real folders directly inside ``folder`` (links left out), sorted; none where
    ``folder`` is not reached from ``root`` without a link."""
    if not reachable(root, folder):
        return []
    try:
        return sorted(path for path in folder.iterdir() if is_real_dir(path))
    except OSError:
        return []
