"""The package reads like ``optimize()``: one subpackage a stage, imports only downwards.

An ``ast`` walk of ``src/spacy_accelerate`` (type-only imports included): every import
of the library's own modules must go to the same or a lower layer of :data:`LAYERS`, the
import graph has no cycle, the library imports itself lazily only in the command line
(to keep ``--help`` fast), and only the provider registry reaches into a backend's folder.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "spacy_accelerate"
SOURCE = Path(__file__).resolve().parents[1] / "src" / PACKAGE

#: The stages in dependency order; a module's layer is its first package below
#: ``spacy_accelerate`` (or its own name, for the few modules at the top).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "errors", "cpu_features", "progress"),
    ("options",),
    ("architectures",),
    ("export",),
    ("runtime",),
    ("cache",),
    ("verify",),
    ("backends",),
    ("provision",),
    ("pipeline",),
    ("api",),
    ("__init__",),
    ("bench",),
    ("ray",),
    ("cli", "__main__"),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(SOURCE.rglob("*.py"))}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """(imported library module, whether at module level) for each import in ``path``."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf8"))
    top_level = {id(node) for node in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` blocks count as module level
        if isinstance(node, ast.If):
            top_level |= {id(child) for child in node.body}
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name in known and name != module and name != PACKAGE:
                found.append((name, id(node) in top_level))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {
        module: {name for name, _ in _imports(module, path, known)}
        for module, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_belongs_to_a_layer():
    assert {_layer(module) for module in _modules()} <= set(RANK)


def test_the_import_graph_has_no_cycle():
    assert _cycles(_graph()) == []


def test_a_cycle_is_caught():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_imports_go_down_the_layers():
    upward = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if RANK[_layer(target)] > RANK[_layer(module)]
    ]
    assert upward == []


def test_the_library_imports_itself_lazily_only_in_the_command_line():
    modules = _modules()
    known = set(modules)
    lazy = [
        f"{module} -> {name}"
        for module, path in modules.items()
        if _layer(module) != "cli"
        for name, top in _imports(module, path, known)
        if not top
    ]
    assert lazy == []


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_only_the_registry_reaches_into_a_backend(backend: str):
    folder = f"{PACKAGE}.backends.{backend}"
    reaching = sorted(
        module
        for module, targets in _graph().items()
        if not module.startswith(folder)
        and any(target == folder or target.startswith(folder + ".") for target in targets)
    )
    assert reaching == [f"{PACKAGE}.backends.registry"]
