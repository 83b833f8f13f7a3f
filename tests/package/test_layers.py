"""The package's import graph has layers, and nothing runs back up them.

core (record, protocol, clock, timing, errors, backoff) <- storage <- lock <- the edges
(fencing, OS signal handlers, preemption, repair, runner, CLI, integrations, ...) <- testing
(the emulator and fault proxy) <- the demo, which may run on the bundled emulator.
Imports under ``if TYPE_CHECKING:`` never run and may name any layer; every other import,
at module level or inside a function, must go to the same layer or one below. The
modules must not import each other in a circle, TYPE_CHECKING imports included: a
circle that survives only because one side is hidden from the interpreter is still
two modules that cannot be read (or type-checked) apart. A ``typing.Protocol`` in the
lower module is how such a circle is broken.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from sources import parse

PACKAGE = Path(__file__).resolve().parents[2] / "handofflock"
LAYERS = ["core", "storage", "lock", "edges", "testing", "demo", "package"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    if module == "handofflock":
        return "package"
    if parts[1] in ("core", "_version"):
        return "core"
    if parts[1] in ("storage", "lock", "testing", "demo"):
        return parts[1]
    return "edges"


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return parse(path)


def _runtime_imports(path: Path, *, type_checking: bool = False) -> set[str]:
    """Modules of this package that ``path`` imports when it runs (TYPE_CHECKING blocks excluded).

    With ``type_checking``, imports under ``if TYPE_CHECKING:`` count too.
    """
    tree = _parsed(path)
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    # Imports are statements: walk the statements alone (not the expressions inside them), leaving out the
    # bodies of ``if TYPE_CHECKING:`` unless asked.
    blocks = (ast.stmt, ast.excepthandler, ast.match_case)
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, blocks))
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "handofflock")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "handofflock":
                continue
            for alias in node.names:  # `from . import events`: the submodule, if there is one
                sub = f"{target}.{alias.name}"
                as_path = PACKAGE.parent / Path(*sub.split("."))
                found.add(sub if as_path.with_suffix(".py").exists() or as_path.is_dir() else target)
    return found


@functools.cache  # the package does not change during a run: parse it once per kind, not once per test
def _graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    return {_module_name(p): _runtime_imports(p, type_checking=type_checking) for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_import_runs_up_a_layer():
    upward = [
        f"{module} ({_layer(module)}) imports {target} ({_layer(target)})"
        for module, targets in _graph().items()
        for target in sorted(targets)
        if LAYERS.index(_layer(target)) > LAYERS.index(_layer(module))
    ]
    assert not upward, "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle():
    graph = _graph(type_checking=True)
    # A package's __init__ importing its own submodules is how packages work: not a circle.
    edges = {m: {t for t in ts if t in graph and not m.startswith(t + ".")} for m, ts in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    assert not circles, circles


def test_the_checker_sees_the_imports_it_judges():
    graph = _graph()
    assert "handofflock.core.record" in graph["handofflock.storage.base"]
    assert "handofflock.lock.events" in graph["handofflock.lock.handoff"]
    assert _layer("handofflock.fencing") == "edges" and _layer("handofflock.core.timing") == "core"
    typed = _graph(type_checking=True)
    assert "handofflock.core.timing" in typed["handofflock.aio"]  # under TYPE_CHECKING there
    assert "handofflock.core.timing" not in graph["handofflock.aio"]
