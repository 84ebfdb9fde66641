"""How much the library says while it works: its own progress for long steps, and whether
third-party output (NNCF's bars and tables, ...) reaches the user.

The command line sets the level from ``--quiet`` / ``--verbose``; Python callers may call
:func:`set_verbosity` themselves.
"""

from __future__ import annotations

import enum


class Verbosity(enum.IntEnum):
    """QUIET: errors only. NORMAL: the library's own progress. VERBOSE: third-party output
    too."""

    QUIET = 0
    NORMAL = 1
    VERBOSE = 2


_level = Verbosity.NORMAL


def set_verbosity(level: Verbosity) -> None:
    """Set how much the library says from now on (process-wide)."""
    global _level
    _level = Verbosity(level)


def verbosity() -> Verbosity:
    """The level :func:`set_verbosity` set last (NORMAL by default)."""
    return _level
