"""Primitives for writing spaCy config text.

The samples render their configs as text (rather than nested dicts) so that a config can be
read, diffed and pasted into an issue.  Every family shares these two helpers.
"""

from __future__ import annotations

import json


def render_value(value: object) -> str:
    """Render a config value; JSON is what spaCy's config parser reads back."""
    return json.dumps(value)


def section(name: str, values: dict[str, object]) -> str:
    """One ``[name]`` block with ``key = value`` lines in insertion order."""
    lines = [f"[{name}]"]
    lines.extend(f"{key} = {render_value(val)}" for key, val in values.items())
    return "\n".join(lines)


def loader_section_name(component: str) -> str:
    """Where a curated transformer component's piece-encoder loader is configured."""
    return f"initialize.components.{component}.piecer_loader"
