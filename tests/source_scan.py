"""What the source-scanning tests share: which string literals are docstrings."""

from __future__ import annotations

import ast


def docstring_ids(tree: ast.AST) -> set[int]:
    """``id()`` of each docstring's constant in ``tree`` (a module's, class's or
    function's first statement, where it is a string)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found
