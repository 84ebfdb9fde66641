"""The package reads like ``optimize()``: one subpackage a stage, imports only downwards.

An ``ast`` walk of ``src/spacy_accelerate`` (type-only imports included): every import
of the library's own modules must go to the same or a lower layer of :data:`LAYERS`, the
import graph has no cycle, the library imports itself lazily only in the command line
(to keep ``--help`` fast), a backend is named only in its folder and in its row of the
provider table, no module lists providers but that table, and no function is longer than
:data:`MAX_FUNCTION_LINES`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from source_scan import docstring_ids

PACKAGE = "spacy_accelerate"
SOURCE = Path(__file__).resolve().parents[1] / "src" / PACKAGE

#: The stages in dependency order; a module's layer is its first package below
#: ``spacy_accelerate`` (or its own name, for the few modules at the top).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "errors", "cpu_features", "cpu_budget", "progress"),
    ("options",),
    ("architectures",),
    ("export",),
    ("runtime",),
    ("cache",),
    ("verify",),
    ("backends",),
    ("provision",),
    ("serving",),
    ("pipeline",),
    ("planning",),
    ("api", "aio"),
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


#: The one registration of every backend: the provider table.
TABLE = f"{PACKAGE}.options.providers"
BACKENDS = f"{PACKAGE}.backends."
#: A function longer than this (decorators and docstring included) is a bug waiting.
MAX_FUNCTION_LINES = 60


def _backend_folder(module: str) -> str | None:
    """The backend folder ``module`` lies in (``...backends.openvino``), or None."""
    if not module.startswith(BACKENDS):
        return None
    folder = BACKENDS + module[len(BACKENDS) :].split(".")[0]
    return folder if (SOURCE.parent / folder.replace(".", "/")).is_dir() else None


def _served_by() -> dict[str, str]:
    """Each registered provider's name, and the backend folder its row names."""
    from spacy_accelerate.options.providers import PROVIDERS

    served = {}
    for row in PROVIDERS:
        folder = _backend_folder(row.backend.partition(":")[0])
        assert folder is not None, f"{row.provider.value}: {row.backend} is not in backends/"
        served[row.provider.value] = folder
    return served


def providers_named(source: str, names: set[str]) -> set[str]:
    """The providers (of ``names``) that ``source`` names as code: ``Provider.CPU``,
    ``Provider("cpu")``, a literal collection of two or more of them, or a message (not a
    docstring) that lists two or more."""
    tree = ast.parse(source)
    docstrings = docstring_ids(tree)
    word = re.compile(rf"\b({'|'.join(map(re.escape, sorted(names)))})\b")
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "Provider" and node.attr.lower() in names:
                found.add(node.attr.lower())
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Provider":
            found |= {a.value for a in node.args if isinstance(a, ast.Constant)} & names
        elif isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            listed = {i.value for i in items if isinstance(i, ast.Constant)} & names
            found |= listed if len(listed) > 1 else set()
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            mentioned = set(word.findall(node.value)) if id(node) not in docstrings else set()
            found |= mentioned if len(mentioned) > 1 else set()
    return found


def test_only_the_table_and_its_backend_name_a_provider():
    served = _served_by()
    outside = {
        f"{module}: {sorted(named)}"
        for module, path in _modules().items()
        if module != TABLE
        for named in [
            {
                name
                for name in providers_named(path.read_text(encoding="utf8"), set(served))
                if served[name] != _backend_folder(module)
            }
        ]
        if named
    }
    assert outside == set()


def test_a_second_provider_list_is_caught():
    names = {"cpu", "cuda", "openvino"}
    assert providers_named("X = (Provider.CPU, Provider.CUDA)", names) == {"cpu", "cuda"}
    assert providers_named("X = {'cpu': 1, 'openvino': 2}", names) == {"cpu", "openvino"}
    assert providers_named("h = 'auto, cpu or openvino'", names) == {"cpu", "openvino"}
    assert providers_named("X = Provider('cuda')", names) == {"cuda"}
    assert providers_named('"""cpu or cuda, a docstring"""\ndevice = "cpu"', names) == set()


def backend_references(module: str, source: str, imports: set[str]) -> set[str]:
    """The backend folders ``module`` reaches outside its own: by importing them or by
    naming their modules in a string."""
    own = _backend_folder(module)
    strings = {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)}
    named = {
        folder
        for text in strings
        if isinstance(text, str)
        for folder in [_backend_folder(text.partition(":")[0])]
        if folder
    }
    imported = {_backend_folder(target) for target in imports} - {None}
    return {folder for folder in named | imported if folder and folder != own}


def test_a_backend_is_named_only_in_its_folder_and_its_registration():
    graph = _graph()
    reaching = {
        f"{module} -> {sorted(found)}"
        for module, path in _modules().items()
        for found in [backend_references(module, path.read_text(encoding="utf8"), graph[module])]
        if found
    }
    assert reaching == {f"{TABLE} -> {sorted(set(_served_by().values()))}"}


def test_a_backend_named_outside_is_caught():
    source = "X = 'spacy_accelerate.backends.openvino.backend:OpenVINOBackend'"
    api = f"{PACKAGE}.api"
    assert backend_references(api, source, set()) == {BACKENDS + "openvino"}
    imported = {BACKENDS + "onnxruntime.session"}
    assert backend_references(api, "", imported) == {BACKENDS + "onnxruntime"}
    inside = BACKENDS + "openvino.session"
    assert backend_references(inside, source, set()) == set()


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of each function in ``source`` longer than ``limit`` lines, counted
    from its first decorator to its last line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = (node.end_lineno or node.lineno) - first + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def test_no_function_is_over_60_lines():
    long = [
        f"{module}.{name}: {lines} lines"
        for module, path in _modules().items()
        for name, lines in long_functions(path.read_text(encoding="utf8"))
    ]
    assert long == []


#: A module longer than this holds more than one job.
MAX_MODULE_LINES = 400
#: The modules over :data:`MAX_MODULE_LINES` before issue 62 split ``pipeline/``, to be split
#: when next changed; no other module may join them.
LONG_BEFORE_ISSUE_62 = {
    "api",
    "backends.onnxruntime.quantize",
    "backends.openvino.quantize",
    "backends.openvino.session",
    "provision.bundle",
    "provision.get_or_export",
    "verify.plan_search",
}


def test_no_module_joins_the_long_ones():
    long = {
        module.removeprefix(f"{PACKAGE}.")
        for module, path in _modules().items()
        if len(path.read_text(encoding="utf8").splitlines()) > MAX_MODULE_LINES
    }
    assert long <= LONG_BEFORE_ISSUE_62, sorted(long - LONG_BEFORE_ISSUE_62)


def test_a_long_function_is_caught():
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    assert long_functions(f"@decorated\ndef f():\n{body}") == [("f", 61)]
    assert long_functions(f"def f():\n{body}") == []


#: A function taking more than this many parameters (``self`` and ``cls`` aside) repacks
#: values that belong together in one object (as a transformer's serving does in
#: :class:`~spacy_accelerate.backends.base.ServeRequest`).
MAX_PARAMETERS = 8
#: The functions allowed more, each with the reason. The public entry points take one
#: keyword per option of ``optimize()``: that list is the documented interface, not
#: values repacked between stages.
MANY_PARAMETERS = {
    f"{PACKAGE}.api.optimize": "optimize()'s options",
    f"{PACKAGE}.api.make_optimize_callback": "spaCy's callback: optimize()'s options, as saved",
    f"{PACKAGE}.api.make_optimize_callback_v1": "spaCy's callback of the first release",
    f"{PACKAGE}.cli.optimize.optimize": "a command: one flag per option",
    f"{PACKAGE}.cli.annotate.annotate": "a command: one flag per option",
    f"{PACKAGE}.cli.bench.bench": "a command: one flag per option",
    f"{PACKAGE}.ray.annotate.annotate": "public API: the dataset, the pipeline, Ray's pool",
    f"{PACKAGE}.architectures.spec.read_bert_like_spec": (
        "keyword-only facts of one encoder family (ALBERT's groups among them), 9"
    ),
}


def many_parameters(source: str, limit: int = MAX_PARAMETERS) -> list[tuple[str, int]]:
    """(qualified name, parameters) of each function in ``source`` taking more than
    ``limit`` parameters: positional, keyword-only, ``*args`` and ``**kwargs`` alike,
    a method's leading ``self`` or ``cls`` aside."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = getattr(child, "name", "")
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                args = child.args
                named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
                names = [a.arg for a in named] + [a.arg for a in (args.vararg, args.kwarg) if a]
                if names[:1] in (["self"], ["cls"]):
                    names = names[1:]
                if len(names) > limit:
                    found.append((prefix + name, len(names)))
            visit(child, f"{prefix}{name}." if name else prefix)

    visit(ast.parse(source), "")
    return found


def test_no_function_takes_more_than_8_parameters():
    many = {
        f"{module}.{name}": count
        for module, path in _modules().items()
        for name, count in many_parameters(path.read_text(encoding="utf8"))
    }
    assert sorted(set(many) - set(MANY_PARAMETERS)) == []
    assert sorted(set(MANY_PARAMETERS) - set(many)) == []  # fixed: leave the list


def test_a_function_with_many_parameters_is_caught():
    nine = ", ".join(f"a{i}" for i in range(9))
    assert many_parameters(f"def f({nine}):\n    pass") == [("f", 9)]
    method = "class C:\n    def m(self, a, /, b, *args, c, **kwargs):\n        pass"
    assert many_parameters(method, limit=4) == [("C.m", 5)]
    eight = ", ".join(f"a{i}" for i in range(8))
    assert many_parameters(f"class C:\n    def m(self, {eight}):\n        pass") == []
    nested = f"def outer():\n    def inner(*, {nine}):\n        pass"
    assert many_parameters(nested) == [("outer.inner", 9)]


def _names_for_type_checkers(init: Path) -> dict[str, str]:
    """The names ``spacy_accelerate/__init__.py`` imports under ``TYPE_CHECKING``, with
    the module each comes from."""
    tree = ast.parse(init.read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    return {
        alias.name: str(statement.module)
        for statement in block.body
        if isinstance(statement, ast.ImportFrom)
        for alias in statement.names
    }


def test_the_public_names_are_listed_alike_in_all_three_places():
    import spacy_accelerate

    init = Path(spacy_accelerate.__file__)
    assert _names_for_type_checkers(init) == spacy_accelerate._SOURCES
    # __all__ stays a literal (linters read it), checked against the same list.
    assert sorted(spacy_accelerate.__all__) == sorted(["__version__", *spacy_accelerate._SOURCES])
