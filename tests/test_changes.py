"""One module owns every change to an object the library does not own (issue 62, item 1):
``pipeline/changes.py``'s table, each change with its undo. A change without an undo fails
here, and so does a change to spaCy's, thinc's or a shim's objects made anywhere but in
the modules of the table's functions (and the swap guard's primitives they call)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import spacy
from test_restore_equality import _state

from spacy_accelerate.pipeline import changes
from spacy_accelerate.pipeline.changes import CHANGES

SOURCE = Path(changes.__file__).resolve().parents[1]

#: Attributes of objects we do not own that only the table's modules may set or delete:
#: a thinc layer's forward and attributes, a shim's module, an object's ``__dict__`` (a
#: method stood in for on ``nlp``), a config's sections.
FOREIGN_ATTRIBUTES = frozenset({"_func", "_model", "attrs", "__dict__", "config"})
#: The swap guard's primitives, which the table's functions call.
PRIMITIVES = "spacy_accelerate.pipeline.swap"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _changed(target: ast.expr) -> str | None:
    """The foreign attribute ``target`` (an assignment's or ``del``'s) changes, if any."""
    while isinstance(target, ast.Subscript):
        target = target.value
    if isinstance(target, ast.Attribute) and target.attr in FOREIGN_ATTRIBUTES:
        if not (isinstance(target.value, ast.Name) and target.value.id == "self"):
            return target.attr
    return None


def _names_a_pipeline(node: ast.expr) -> bool:
    """Whether ``node`` is ``nlp`` or ``<anything>.nlp`` (a ``setattr`` on a pipeline)."""
    return (isinstance(node, ast.Name) and node.id == "nlp") or (
        isinstance(node, ast.Attribute) and node.attr == "nlp"
    )


def foreign_changes(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every change to a foreign object in ``source``: assignments and
    deletions of :data:`FOREIGN_ATTRIBUTES` (not on ``self``), and ``setattr`` on a pipeline."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            if _names_a_pipeline(node.args[0]):
                found.append((node.lineno, "setattr"))
        for target in targets:
            for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                what = _changed(element)
                if what is not None:
                    found.append((node.lineno, what))
    return found


def _owners() -> set[str]:
    functions: list[Callable[..., object]] = [f for c in CHANGES for f in (c.install, c.undo)]
    return {function.__module__ for function in functions} | {PRIMITIVES}


def test_every_change_has_an_undo_of_its_own():
    assert CHANGES
    for change in CHANGES:
        assert callable(change.install) and callable(change.undo), change.what
        assert change.install is not change.undo, change.what


def test_every_undo_leaves_a_plain_pipeline_as_it_is(sample_path: Callable[[str], Path]):
    nlp = spacy.load(sample_path("roberta"))
    before = _state(nlp)
    for change in CHANGES:
        change.undo(nlp)
    assert _state(nlp) == before


def test_objects_we_do_not_own_change_only_in_the_tables_modules():
    owners = _owners()
    outside = {
        f"{_module_name(path)}:{line} ({what})"
        for path in SOURCE.rglob("*.py")
        if _module_name(path) not in owners
        for line, what in foreign_changes(path.read_text())
    }
    assert not outside, sorted(outside)


def test_a_change_outside_the_table_is_caught():
    source = "def install(layer, nlp):\n    layer._func = wrapped\n    setattr(nlp, 'pipe', x)\n"
    assert foreign_changes(source) == [(2, "_func"), (3, "setattr")]
    assert foreign_changes("def ok(self):\n    self.config = {}\n") == []
