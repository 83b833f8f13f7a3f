#!/usr/bin/env python3
"""``scripts/simulate.py --mutate``: mistakes anyone could write, each run against the simulation and the model check.

    scripts/simulate.py --mutate --sample 40 --seed 1 -j 2   # 40 mutants drawn by seed 1
    scripts/simulate.py --mutate                             # every mutant (hours)
    scripts/simulate.py --mutate --list                      # the mutants, none run
    scripts/simulate.py --mutate --mutant handofflock/core/protocol.py:17   # one, with its verdict

Each mutant changes one spot of one module (:data:`TARGETS`): a comparison flipped, ``and`` for ``or``, a
condition negated, a ``not`` dropped, a number moved by one or by a factor of two, a ``+`` for a ``-`` in
time arithmetic, a returned value replaced, an assignment, call or keyword argument deleted, two
arguments swapped. The mutated module is compiled from its edited syntax tree (line numbers kept) and
served by an import hook in a process of its own, so mutants never meet and ``-j N`` runs N at once.

A mutant is caught when the model check (modules it imports only) or the simulation over ``--seeds`` seeds
from ``--first`` (0) reports a violation, or crashes (a mutant that stops answering is a hang, reported
apart and not counted as caught).
Before any mutant runs, one traced clean run of the same seeds (and the model check) records which lines
execute: the simulation is deterministic, so a mutant whose spot never executes there behaves exactly
as the clean tree over those seeds. Such mutants are counted as "not reached", never run, and left out
of the score, which is caught / reached. Survivors are printed with file:line, operator, and the source
before and after, for a reader to judge which are equivalent.
"""

from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.util
import json
import os
import platform
import random
import re
import selectors
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

ROOT = Path(__file__).resolve().parent.parent
#: The modules mutated: the protocol, the record, timing, the lock, its request book, the scheduler, the async lock.
TARGETS = (
    "handofflock/core/protocol.py",
    "handofflock/core/record.py",
    "handofflock/core/timing.py",
    "handofflock/lock/handoff.py",
    "handofflock/lock/requests.py",
    "handofflock/lock/scheduler.py",
    "handofflock/aio.py",
)
#: What the model check imports: only these modules' mutants are model-checked.
MODEL_TARGETS = ("handofflock/core/protocol.py", "handofflock/core/record.py", "handofflock/core/timing.py")
DEFAULT_SEEDS = 200
SILENCE_S = 120.0  # a child that prints nothing for this long (one seed, or the model check) is hung

_TIMEISH = re.compile(
    r"now|time|until|_at\b|expires|ttl|deadline|interval|delay|wait|skew|margin|since|start|elapsed|budget"
    r"|left|due|lease|timeout|mono|wall|clock|spacing|pace|slack|pause|sleep|age|hold|period|backoff",
    re.IGNORECASE,
)
_LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}
_NO_SWAP = {"min", "max", "isinstance", "issubclass", "getattr", "setattr", "hasattr", "print", "range", "len"}
_FLIP_CMP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    """One spot of one module and what it becomes: ``path:index`` names it across runs of the same tree."""

    path: str
    index: int
    operator: str
    line: int
    end_line: int
    before: str
    after: str

    @property
    def ident(self) -> str:
        return f"{self.path}:{self.index}"


# ---------------------------------------------------------------------------------------------- finding


def _mentions(node: ast.AST, *names: str) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id in names) or (isinstance(n, ast.Attribute) and n.attr in names)
        for n in ast.walk(node)
    )


def _is_log_call(node: ast.AST) -> bool:
    """``_log.info(...)``, ``self._log_release.warning(...)``: what a log line says is no guarantee."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    owner = node.func.value
    name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
    return node.func.attr in _LOG_METHODS and "log" in name.lower()


def _skipped(node: ast.AST) -> bool:
    """Nodes whose mutants say nothing: text, log lines, type-only code, the planted-bug switches, ``__all__``."""
    if isinstance(node, (ast.JoinedStr, ast.Assert)) or _is_log_call(node):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True  # a docstring
    if isinstance(node, ast.If) and _mentions(node.test, "TYPE_CHECKING"):
        return True
    if isinstance(node, ast.Assign) and _mentions(node, "__all__"):
        return True
    return _is_switch(node) or (isinstance(node, ast.UnaryOp) and _is_switch(node.operand))


def _is_switch(node: ast.AST) -> bool:
    """``buggify.on(...)``, ``buggify.match(...)``: a planted bug's switch, planted by its own name, not here."""
    f = node.func if isinstance(node, ast.Call) else None
    return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "buggify"


def _plants(node: ast.AST) -> bool:
    """``if buggify.on(X) [and ...]:``: the branch taken is the planted bug (the ``else`` is the library's)."""
    test = getattr(node, "test", None) if isinstance(node, (ast.If, ast.IfExp)) else None
    conj = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    return any(t is not None and _is_switch(t) for t in conj)


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _timeish(node: ast.BinOp | ast.AugAssign) -> bool:
    sides = [node.left, node.right] if isinstance(node, ast.BinOp) else [node.target, node.value]
    if any(isinstance(s, (ast.JoinedStr, ast.List, ast.Tuple)) or _is_text(s) for s in sides):
        return False
    return any(
        (isinstance(s, ast.Constant) and isinstance(s.value, (int, float)) and not isinstance(s.value, bool))
        or _TIMEISH.search(ast.unparse(s))
        for s in sides
    )


def _alike(a: ast.expr, b: ast.expr) -> bool:
    """Two arguments likely of one type, so that a swap is a quiet mistake: two times, or one field of two values."""
    last = [x.attr if isinstance(x, ast.Attribute) else x.id if isinstance(x, ast.Name) else "" for x in (a, b)]
    return last[0] == last[1] or all(_TIMEISH.search(ast.unparse(x)) for x in (a, b))


def _variants(node: ast.AST, in_function: bool) -> list[tuple[str, ast.AST | None]]:
    """The mutants of one node: (operator, its replacement), in a fixed order; ``None`` deletes a statement
    (one of a function's: a class's fields and a module's names are declarations, not steps)."""
    out: list[tuple[str, ast.AST | None]] = []
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _FLIP_CMP:
                ops = [*node.ops[:i], _FLIP_CMP[type(op)](), *node.ops[i + 1 :]]
                out.append(("compare", ast.Compare(node.left, ops, node.comparators)))
    elif isinstance(node, ast.BoolOp):
        out.append(("and/or", ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("drop-not", node.operand))
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
        v = node.value
        news = [v + 1, v - 1] if isinstance(v, int) else ([v * 2, v / 2] if v else [1.0])
        out += [("number", ast.Constant(n)) for n in news]
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, (ast.Add, ast.Sub)) and _timeish(node):
        op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        if isinstance(node, ast.BinOp):
            out.append(("add/sub", ast.BinOp(node.left, op, node.right)))
        else:
            out.append(("add/sub", ast.AugAssign(node.target, op, node.value)))
    elif isinstance(node, ast.Call) and not _is_log_call(node):
        for i, kw in enumerate(node.keywords):
            if kw.arg is not None:
                kept = [*node.keywords[:i], *node.keywords[i + 1 :]]
                out.append(("drop-keyword", ast.Call(node.func, node.args, kept)))
        fname = node.func.id if isinstance(node.func, ast.Name) else ""
        simple = (ast.Name, ast.Attribute)
        if fname not in _NO_SWAP:
            for i in range(len(node.args) - 1):
                a, b = node.args[i], node.args[i + 1]
                if isinstance(a, simple) and isinstance(b, simple) and _alike(a, b):
                    args = [*node.args[:i], b, a, *node.args[i + 2 :]]
                    out.append(("swap-args", ast.Call(node.func, args, node.keywords)))
    if isinstance(node, (ast.If, ast.While, ast.IfExp)) and not (
        isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
    ):
        out.append(("negate", ast.UnaryOp(ast.Not(), node.test)))  # replaces node.test, see _apply
    if isinstance(node, ast.Return) and node.value is not None:
        v = node.value
        boolish = isinstance(v, (ast.Compare, ast.BoolOp)) or (isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not))
        if isinstance(v, ast.Constant) and isinstance(v.value, bool):
            out.append(("return", ast.Return(ast.Constant(not v.value))))
        elif boolish:
            out.append(("return", ast.Return(ast.Constant(False))))
        elif not (isinstance(v, ast.Constant) and v.value is None):
            out.append(("return", ast.Return(ast.Constant(None))))
    assigns = isinstance(node, (ast.Assign, ast.AugAssign)) or (
        isinstance(node, ast.AnnAssign) and node.value is not None
    )
    calls = isinstance(node, ast.Expr) and isinstance(node.value, (ast.Call, ast.Await))
    if in_function and (assigns or calls):
        out.append(("delete", None))
    return out


def _spots(tree: ast.AST) -> list[tuple[ast.AST, str, ast.AST | None]]:
    """Every (node, operator, replacement) of a module, in a fixed walk order."""
    out: list[tuple[ast.AST, str, ast.AST | None]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if _skipped(node):
            return
        if _plants(node):
            for child in node.orelse if isinstance(node, ast.If) else [node.orelse]:  # type: ignore[attr-defined]
                visit(child, in_function)
            return
        out.extend((node, op, new) for op, new in _variants(node, in_function))
        if isinstance(node, ast.ClassDef):
            in_function = False
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns", "decorator_list", "type_comment"):
                continue
            inner = in_function or (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name == "body")
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    visit(child, inner)

    visit(tree, False)
    return out


def mutants(path: str) -> list[Mutant]:
    """The mutants of one module (``path`` relative to the repository root)."""
    source = (ROOT / path).read_text()
    lines = [line.encode() for line in source.splitlines(keepends=True)]
    out = []
    for i, (node, op, new) in enumerate(_spots(ast.parse(source))):
        shown = node.test if op == "negate" else node  # type: ignore[attr-defined]
        before = _segment(lines, shown) or ast.unparse(shown)
        after = "pass" if new is None else ast.unparse(new)
        line, end = node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]
        if op == "negate":
            line, end = node.test.lineno, node.test.end_lineno or node.test.lineno  # type: ignore[attr-defined]
        out.append(Mutant(path, i, op, line, end, " ".join(before.split()), after))
    return out


def _segment(lines: list[bytes], node: ast.AST) -> str:
    """``ast.get_source_segment`` over lines split once (it splits the whole file on each call)."""
    l0, l1 = node.lineno - 1, (node.end_lineno or node.lineno) - 1  # type: ignore[attr-defined]
    c0, c1 = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
    if l0 == l1:
        return lines[l0][c0:c1].decode()
    return b"".join([lines[l0][c0:], *lines[l0 + 1 : l1], lines[l1][:c1]]).decode()


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, op: str, new: ast.AST | None) -> None:
        self.target, self.op, self.new = target, op, new

    def generic_visit(self, node: ast.AST) -> ast.AST | None:  # type: ignore[override]
        if node is not self.target:
            return super().generic_visit(node)
        if self.op == "negate":
            node.test = ast.copy_location(self.new, node.test)  # type: ignore[attr-defined, arg-type]
            return node
        if self.new is None:
            return ast.copy_location(ast.Pass(), node)
        return ast.copy_location(self.new, node)


def compile_mutant(m: Mutant) -> CodeType:
    """The mutated module's code, its line numbers those of the file."""
    source = (ROOT / m.path).read_text()
    tree = ast.parse(source)
    node, op, new = _spots(tree)[m.index]
    tree = ast.fix_missing_locations(_Replace(node, op, new).visit(tree))
    return compile(tree, str(ROOT / m.path), "exec")


class _Serve(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An import hook that serves one module from mutated code, before the module is first imported."""

    def __init__(self, name: str, path: Path, code: CodeType) -> None:
        self.name, self.path, self.code = name, path, code

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return None

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        exec(self.code, module.__dict__)


# ---------------------------------------------------------------------------------------------- one child


def _say(kind: str, **fields: object) -> None:
    print(json.dumps({"kind": kind, **fields}), flush=True)


def _quiet() -> None:
    import logging
    import warnings

    logging.getLogger("handofflock").setLevel(logging.CRITICAL)
    warnings.simplefilter("ignore")


def _model(say_alive: bool = True) -> tuple[str, str]:
    """The model check's configurations as check_all runs them, stopping at the first counterexample."""
    from handofflock.testing.sim import model

    for config, depth in model.DEPTHS.items():
        _, example, _ = model.explore(config, depth)
        if say_alive:
            _say("alive", what=f"model {config}")
        if example is not None:
            return "violation", example[-1]
    return "clean", ""


def _sim(seeds: int, first: int = 0) -> tuple[str, str, int]:
    from handofflock.testing.sim.__main__ import run_seed

    for seed in range(first, first + seeds):
        out = run_seed(seed)
        _say("alive", what=f"seed {seed}")
        if out.violation:  # an exception that killed a thread, or that the library logged, is a crash
            why = out.violation.splitlines()[0][:300]
            crash = (why.startswith("thread ") and " died: " in why) or why.startswith("the library caught and logged")
            return ("crash" if crash else "violation"), why, seed
    return "clean", "", -1


def child_mutant(ident: str, seeds: int, first: int = 0, model: bool = True) -> None:
    """Run one mutant: the model check where it applies (unless not ``model``), then the seeds; one ``result``
    line."""
    path, index = ident.rsplit(":", 1)
    m = mutants(path)[int(index)]
    name = path[:-3].replace("/", ".")
    sys.meta_path.insert(0, _Serve(name, ROOT / path, compile_mutant(m)))
    _quiet()
    res: dict[str, object] = {"model": "n/a", "sim": "n/a", "detail": "", "seed": -1}
    for part in ("model", "sim"):
        if part == "model" and (path not in MODEL_TARGETS or not model):
            continue
        try:
            if part == "model":
                res["model"], detail = _model()
            else:
                res["sim"], detail, res["seed"] = _sim(seeds, first)
        except Exception as exc:  # a crash is a verdict
            res[part], detail = "crash", f"{type(exc).__name__}: {exc}"[:300]
        if detail and not res["detail"]:
            res["detail"] = f"{part}: {detail}"
    _say("result", **res)


def child_reach(seeds: list[int], model: bool) -> None:
    """Trace a clean run of ``seeds`` (and the model check): which lines of each target execute."""
    files = {str(ROOT / t): t for t in TARGETS}
    hit: dict[str, set[int]] = {t: set() for t in TARGETS}

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "line":
            hit[files[frame.f_code.co_filename]].add(frame.f_lineno)
        return local

    def glob(frame, event, arg):  # type: ignore[no-untyped-def]
        if frame.f_code.co_filename in files:
            hit[files[frame.f_code.co_filename]].add(frame.f_lineno)
            return local
        return None

    import threading

    sys.settrace(glob)
    threading.settrace(glob)
    import handofflock  # noqa: F401 - module-level lines run at import

    _quiet()
    from handofflock.testing.sim.__main__ import run_seed

    if model:
        _model(say_alive=False)
    for seed in seeds:
        run_seed(seed)
        _say("alive", what=f"seed {seed}")
    sys.settrace(None)
    _say("result", hit={t: sorted(v) for t, v in hit.items()})


# ---------------------------------------------------------------------------------------------- the run


def _child(args: list[str], timeout: float) -> tuple[dict[str, object] | None, str]:
    """Run this script as a child; its ``result`` line, or None and why (``hang`` or what it printed last)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    tail: list[str] = []
    try:
        while True:
            if not sel.select(timeout):
                return None, "hang"
            line = proc.stdout.readline()
            if not line:
                break
            try:
                msg = json.loads(line)
            except ValueError:
                tail = [*tail[-20:], line.rstrip()]
                continue
            if msg["kind"] == "result":
                return msg, ""
        return None, "\n".join(tail[-5:]) or f"exit {proc.wait()}"
    finally:
        sel.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()


def reached_lines(seeds: int, jobs: int, first: int = 0) -> dict[str, set[int]]:
    """The lines of each target that a traced clean run of seeds ``first ..`` executes (over ``jobs`` children)."""
    chunks = [list(range(first, first + seeds))[i::jobs] for i in range(jobs)]
    calls = [[*(["--model"] if i == 0 else []), "--child-reach", ",".join(map(str, c))] for i, c in enumerate(chunks)]
    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(lambda a: _child(a, SILENCE_S * 4), calls))
    hit: dict[str, set[int]] = {t: set() for t in TARGETS}
    for res, why in results:
        if res is None:
            raise SystemExit(f"the traced clean run failed: {why}")
        for t, lines in res["hit"].items():  # type: ignore[union-attr]
            hit[t].update(lines)
    return hit


def _reached(m: Mutant, hit: dict[str, set[int]]) -> bool:
    return any(line in hit[m.path] for line in range(m.line, m.end_line + 1))


@dataclass
class Verdict:
    mutant: Mutant
    outcome: str  # caught, survived, hang, not-reached
    model: str
    sim: str
    seed: int
    detail: str
    seconds: float


def run_one(m: Mutant, seeds: int, *, first: int = 0, model: bool = True) -> Verdict:
    """Run ``m`` on seeds ``first .. first + seeds - 1`` (and the model check where it applies, if ``model``)."""
    started = time.monotonic()
    args = ["--child-mutant", m.ident, "--seeds", str(seeds), "--first", str(first), *([] if model else ["--sim-only"])]
    res, why = _child(args, SILENCE_S)
    took = time.monotonic() - started
    if res is None:  # it died (a crash: caught) or stopped answering (a hang)
        hang = why == "hang"
        last = why.splitlines()[-1] if why else ""
        return Verdict(m, "hang" if hang else "caught", "?", "?" if hang else "crash", -1, last, took)
    model, sim = str(res["model"]), str(res["sim"])
    caught = model in ("violation", "crash") or sim in ("violation", "crash")
    return Verdict(m, "caught" if caught else "survived", model, sim, int(res["seed"]), str(res["detail"]), took)  # type: ignore[call-overload]


def report(verdicts: list[Verdict], *, total: int, not_reached: int | None, seeds: int, jobs: int, took: float) -> str:
    """The summary and the survivors, one line each with what changed."""
    ran = [v for v in verdicts if v.outcome != "not-reached"]
    c = Counter(v.outcome for v in ran)
    by_sim = sum(v.sim in ("violation", "crash") for v in ran)
    by_model = sum(v.model in ("violation", "crash") for v in ran)
    modelled = sum(v.model not in ("n/a", "?") for v in ran)
    crashes = sum("crash" in (v.sim, v.model) and "violation" not in (v.sim, v.model) for v in ran)
    caught = c["caught"]  # a hang is counted apart: on a loaded machine a slow mutant is not a caught one
    lines = [
        f"mutants: {total} named by --mutant; {len(ran)} run"
        if not_reached is None
        else f"mutants: {total} in {len(TARGETS)} modules, {not_reached} not reached by the clean run's {seeds} seeds "
        f"(never run, not scored); {len(ran)} run",
        f"caught: {caught} of {len(ran)} ({caught / max(len(ran), 1):.1%}): by the simulation {by_sim}, "
        f"by the model check {by_model} (of {modelled} model-checked), only by a crash {crashes}, hangs {c['hang']}",
        f"survivors: {c['survived']}",
        f"time: {took:.0f} s, {sum(v.seconds for v in ran) / max(len(ran), 1):.1f} s per mutant run "
        f"(seeds per mutant {seeds}, stopping at the first violation; -j {jobs}; "
        f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()})",
    ]
    for kind in ("survived", "hang"):
        for v in sorted((v for v in ran if v.outcome == kind), key=lambda v: (v.mutant.path, v.mutant.line)):
            m = v.mutant
            lines.append(f"{'SURVIVED' if kind == 'survived' else 'HANG'} {m.path}:{m.line} [{m.operator}] "
                         f"{m.before}  ->  {m.after}   (--mutant {m.ident})")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/simulate.py --mutate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--mutate", action="store_true", help="(the flag that chose this mode)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help=f"seeds per mutant (default {DEFAULT_SEEDS})")
    p.add_argument("--sample", type=int, help="run this many reached mutants, drawn by --seed")
    p.add_argument("--seed", type=int, default=0, help="the draw of --sample (default 0)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="mutants run at once (default 1)")
    p.add_argument("--files", nargs="+", choices=TARGETS, default=list(TARGETS), help="mutate only these modules")
    p.add_argument("--budget", type=float, help="begin no mutant after this many seconds; report those run")
    p.add_argument("--list", action="store_true", help="list the mutants, run none")
    p.add_argument("--mutant", action="append", default=[], metavar="PATH:INDEX", help="run only this mutant")
    p.add_argument("--verbose", action="store_true", help="a line per mutant as it finishes")
    p.add_argument("--first", type=int, default=0, help="the first seed of each mutant's run (default 0)")
    p.add_argument("--child-mutant", help=argparse.SUPPRESS)
    p.add_argument("--sim-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-reach", help=argparse.SUPPRESS)
    p.add_argument("--model", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child_mutant:
        child_mutant(a.child_mutant, a.seeds, a.first, not a.sim_only)
        return 0
    if a.child_reach is not None:
        child_reach([int(s) for s in a.child_reach.split(",") if s], a.model)
        return 0
    everything = [m for path in a.files for m in mutants(path)]
    if a.list:
        for m in everything:
            print(f"{m.ident} {m.path}:{m.line} [{m.operator}] {m.before}  ->  {m.after}")
        ops = Counter(m.operator for m in everything)
        print(f"{len(everything)} mutants: " + ", ".join(f"{k}={v}" for k, v in ops.items()))
        return 0
    started = time.monotonic()
    if a.mutant:
        by_id = {m.ident: m for path in {i.rsplit(":", 1)[0] for i in a.mutant} for m in mutants(path)}
        chosen, total, not_reached = [by_id[i] for i in a.mutant], len(a.mutant), None
    else:
        hit = reached_lines(a.seeds, max(1, min(a.jobs, a.seeds)), a.first)
        reached = [m for m in everything if _reached(m, hit)]
        total, not_reached = len(everything), len(everything) - len(reached)
        chosen = random.Random(a.seed).sample(reached, min(a.sample, len(reached))) if a.sample else reached
        took = time.monotonic() - started
        print(f"traced clean run: {len(reached)} of {len(everything)} mutants reached ({took:.0f} s)", flush=True)
    verdicts: list[Verdict] = []
    stop_at = started + a.budget if a.budget else None

    def one(m: Mutant) -> Verdict | None:  # past the budget, mutants not yet begun are not run
        return None if stop_at is not None and time.monotonic() > stop_at else run_one(m, a.seeds, first=a.first)

    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        for v in filter(None, pool.map(one, chosen)):
            verdicts.append(v)
            if a.verbose:
                m = v.mutant
                print(f"{v.outcome:9} {v.seconds:6.1f} s {m.path}:{m.line} [{m.operator}] {m.before}  ->  {m.after}"
                      f"  (--mutant {m.ident}) model={v.model} sim={v.sim} {v.detail[:100]}", flush=True)  # fmt: skip
    took = time.monotonic() - started
    print(report(verdicts, total=total, not_reached=not_reached, seeds=a.seeds, jobs=a.jobs, took=took))
    return 0


if __name__ == "__main__":
    sys.exit(main())
