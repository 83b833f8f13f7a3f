"""Reading the package's own source as syntax trees."""

from __future__ import annotations

import ast
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """``ast.parse`` of a file, asked again when CPython 3.11 raises a spurious ``SystemError``.

    CPython 3.11 keeps the AST constructor's recursion depth per interpreter, so a module that
    another thread compiles at the same moment (an import from a server thread) can make the
    parse raise "AST constructor recursion depth mismatch" (python/cpython#106905); the source
    itself is fine, and a second parse succeeds.
    """
    for attempt in range(5):
        try:
            return ast.parse(path.read_text(), str(path))
        except SystemError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")
