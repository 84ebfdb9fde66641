"""The library's error messages in the command line's terms.

The library speaks to Python callers: its messages name ``optimize()``'s keyword
arguments (``precision='int8'``, ``fallback=True``, ``calibration_texts=...``). A user of
the command line cannot type those; :func:`cli_terms` rewrites each mention into the flag
that sets the same option (``--precision int8``, ``--fallback``,
``--calibration-file FILE``), so that the advice in a message can be followed as written.
This module imports nothing heavy: the command line uses it before spaCy is loaded.
"""

from __future__ import annotations

import re

#: ``optimize()``'s keyword arguments that the command line sets, and the flag for each.
FLAGS: dict[str, str] = {
    "provider": "--provider",
    "precision": "--precision",
    "cache_dir": "--cache-dir",
    "warmup": "--warmup",
    "verify": "--verify",
    "tolerance": "--tolerance",
    "min_cosine": "--min-cosine",
    "threads": "--threads",
    "device_id": "--device-id",
    "fallback": "--fallback",
    "calibration_texts": "--calibration-file",
    "min_agreement": "--min-agreement",
    "lock_timeout": "--lock-timeout",
    "missing_cache": "--missing-cache",
    "bundle": "--bundle",
    "overlap": "--overlap",
}

#: Options that are on/off switches: ``fallback=False`` is ``--no-fallback``.
SWITCHES = frozenset({"warmup", "verify", "fallback", "bundle", "overlap"})

#: What the command line takes in place of a Python value, for options given otherwise.
PLACEHOLDERS: dict[str, str] = {
    "calibration_texts": "FILE",
    "min_agreement": "ANNOTATION=BOUND",
}

_NAMES = "|".join(sorted(FLAGS, key=len, reverse=True))
#: A value as messages write it: quoted, a literal, a placeholder (``...``, ``[...]``,
#: ``{...: bound}``) or a bare word or number.
_VALUE = r"""'[^']*'|"[^"]*"|\[[^\]]*\]|\{[^}]*\}|\.\.\.|[\w.+-]+"""
#: ``name=value`` or ``name=`` (an option to set, its value left to the reader); a
#: ``config.calibration_texts`` path or ``--flag`` is left alone.
_KEYWORD = re.compile(rf"(?<![\w.-])({_NAMES})=({_VALUE})?")
#: A Python call that only carries the keywords: ``optimize(nlp, ..., calibration_texts=[...])``.
_CALL = re.compile(r"optimize\(nlp, \.\.\., ([^()]*)\)")
#: ``pass fallback=True to optimize()``: on the command line, the flag is the whole advice.
_TO_OPTIMIZE = re.compile(r"(--[a-z-]+(?: \S+)?) to optimize\(\)")
#: ``min_agreement['dep']``: one annotation's bound.
_ITEM = re.compile(rf"(?<![\w.-])({_NAMES})\[('[^']*'|\"[^\"]*\")\]")
#: Names with an underscore are never English words: every bare mention is the option.
_BARE = re.compile(rf"(?<![\w.-])({'|'.join(name for name in FLAGS if '_' in name)})\b(?![=\[])")
#: One-word names are the option only where a message starts with them (``threads must
#: be ...``); elsewhere ``precision`` or ``tolerance`` may be plain English.
_LEADING = re.compile(rf"^({_NAMES})(?= must | has | names )")


def _flag(match: re.Match[str]) -> str:
    name, value = match.group(1), match.group(2)
    flag = FLAGS[name]
    if name in PLACEHOLDERS:
        return f"{flag} {PLACEHOLDERS[name]}" if value not in (None, "None") else flag
    if name in SWITCHES:
        return f"--no-{flag[2:]}" if value == "False" else flag
    if value is None or value in ("...", "None"):
        return flag
    return f"{flag} {value.strip(chr(39) + chr(34))}"


def cli_terms(message: str) -> str:
    """``message`` with each mention of an ``optimize()`` keyword argument the command line
    has a flag for rewritten as that flag (``precision='int8'`` -> ``--precision int8``)."""
    message = _CALL.sub(r"\1", message)
    message = _KEYWORD.sub(_flag, message)
    message = _TO_OPTIMIZE.sub(r"\1", message)
    message = _ITEM.sub(lambda m: f"{FLAGS[m.group(1)]} for {m.group(2)}", message)
    message = _BARE.sub(lambda m: FLAGS[m.group(1)], message)
    return _LEADING.sub(lambda m: FLAGS[m.group(1)], message)
