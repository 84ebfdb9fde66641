"""What a saved accelerated pipeline requires where it is installed: spacy-accelerate, with
the extras that install the runtimes serving it.

``spacy package`` copies ``meta.json``'s ``requirements`` into the wheel's metadata, so
``pip install`` of a packaged pipeline brings the library and the runtime its bundle runs
on (a bundle served by OpenVINO cannot be served where OpenVINO is missing). A requirement
the user wrote for this library keeps its version pin; only missing extras are added.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import srsly
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from spacy_accelerate._version import __version__
from spacy_accelerate.backends.registry import pip_extra
from spacy_accelerate.options.config import Provider

LIBRARY = "spacy-accelerate"


def runtime_extras(providers: Iterable[str]) -> set[str]:
    """The extras that install the runtimes of ``providers`` (served provider names)."""
    return {pip_extra(Provider(provider)) for provider in providers}


def with_requirement(requirements: Sequence[str], extras: Iterable[str] = ()) -> list[str]:
    """``requirements`` (a ``meta.json`` list) requiring this library with ``extras``: a
    requirement naming it gets the extras it lacks; otherwise one is added, at this
    release's major.minor or newer."""
    wanted = set(extras)
    found = False
    result: list[str] = []
    for given in requirements:
        try:
            requirement = Requirement(given)
        except InvalidRequirement:
            result.append(given)
            continue
        if canonicalize_name(requirement.name) != LIBRARY:
            result.append(given)
            continue
        found = True
        if wanted <= requirement.extras:
            result.append(given)
            continue
        requirement.extras |= wanted
        result.append(str(requirement))
    if not found:
        listed = f"[{','.join(sorted(wanted))}]" if wanted else ""
        result.append(f"{LIBRARY}{listed}>={'.'.join(__version__.split('.')[:2])}")
    return result


def require_library(meta: dict[str, Any], folder: Path, extras: Iterable[str]) -> None:
    """Make a pipeline saved in ``folder`` (and its ``meta``, ``nlp.meta``) require this
    library with ``extras``."""
    meta["requirements"] = with_requirement(meta.get("requirements") or [], extras)
    meta_file = folder / "meta.json"
    if not meta_file.is_file():  # saved with exclude=["meta"]
        return
    saved = srsly.read_json(meta_file)
    saved["requirements"] = meta["requirements"]
    srsly.write_json(meta_file, saved)
