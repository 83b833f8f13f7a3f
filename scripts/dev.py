#!/usr/bin/env python3
"""Set up the project's virtual environment and run the demo or the test suite.

Needs only Python 3.10+ and access to PyPI. Standard library only, so it runs
before anything is installed:

    python3 scripts/dev.py demo    # the two-trainer handoff demo, on the local backend
    python3 scripts/dev.py test    # the whole test suite (starts its own servers), the static checks beside it
    python3 scripts/dev.py lint    # the static checks alone: ruff (lint, format) and mypy --strict
    python3 scripts/dev.py setup   # the test environment alone (for mkdocs serve, scripts/bench.py, ...)

The venv lives in ``.venv`` beside this repository's ``pyproject.toml``. What
goes into it depends on the command: ``demo`` installs the package alone (it is
pure Python: seconds), the others the ``test`` extra with ``constraints.txt``
(torch, Lightning and transformers for the integration tests: minutes, about
1.6 GB on disk). Each kind of install keeps its own stamp, so ``test`` after ``demo``
installs the test extra; an install is redone when ``pyproject.toml`` or
``constraints.txt`` changes. Extra arguments are passed through to the demo or
to pytest.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
#: Pins for the test environment only (the CPU torch wheel); users' extras take ranges.
CONSTRAINTS = ROOT / "constraints.txt"
#: pytest-xdist workers for the whole suite (``test`` with no pytest arguments).
WORKERS = 3
#: What ``test`` compiles to bytecode before pytest starts.
COMPILED = ("handofflock", "tests", "scripts", "examples")
#: Where ``test`` tells pytest (tests/conftest.py) the static checks' report is written.
LINT_REPORT = "HANDOFFLOCK_LINT_REPORT"


def _venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _stamp(kind: str) -> Path:
    return VENV / f".handofflock-installed-{kind}"


def _wanted_stamp(kind: str) -> str:
    digest = hashlib.sha256()
    for path in (ROOT / "pyproject.toml", CONSTRAINTS):
        digest.update(path.read_bytes() if path.exists() else b"")
    return f"{kind} {digest.hexdigest()} {sys.version_info[:2]}"


def _installed(kind: str) -> bool:
    """Whether the venv has what ``kind`` needs: its own install, or one that includes it."""
    kinds = ("demo", "test") if kind == "demo" else (kind,)
    return any(_stamp(k).exists() and _stamp(k).read_text() == _wanted_stamp(k) for k in kinds)


def ensure_venv(kind: str = "test") -> Path:
    """Create or reuse .venv and install what ``kind`` ("demo" or "test") needs."""
    if sys.version_info < (3, 10):
        sys.exit(f"handofflock needs Python 3.10 or newer; this is {sys.version.split()[0]}")
    python = _venv_python()
    if not python.exists():
        print(f"[dev] creating virtual environment in {VENV}", flush=True)
        try:
            venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
        except Exception as exc:  # e.g. Debian without python3-venv
            sys.exit(f"[dev] could not create a virtual environment ({exc}); install your Python's venv module")
    if _installed(kind):
        return python
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "install", "--quiet"]
    if kind == "demo":
        print("[dev] installing handofflock into .venv (the package alone: the demo is pure Python)", flush=True)
        subprocess.run(pip + ["-e", str(ROOT)], check=True)
    else:
        print(
            "[dev] installing handofflock and its test dependencies into .venv "
            "(torch CPU, Lightning, transformers: the first time takes minutes and about 1.6 GB on disk)",
            flush=True,
        )
        subprocess.run(pip + ["--upgrade", "pip"], check=True)
        subprocess.run(pip + ["-c", str(CONSTRAINTS), "-e", f"{ROOT}[test]"], check=True)
    _stamp(kind).write_text(_wanted_stamp(kind))
    return python


def lint(python: Path, done: Path | None = None) -> int:
    """ruff's lint and format check, then mypy in strict mode, on handofflock/; non-zero on any finding.

    ``done``: a file written (with the exit status) when the checks have ended.
    """
    failed = 0
    for name, args in (
        ("ruff check", ["-m", "ruff", "check", "handofflock"]),
        ("ruff format --check", ["-m", "ruff", "format", "--check", "handofflock"]),
        ("mypy --strict", ["-m", "mypy"]),  # settings, strict included, in pyproject.toml
    ):
        print(f"[dev] {name}", flush=True)
        code = subprocess.run([str(python), *args], cwd=ROOT).returncode
        if code:
            print(f"[dev] {name} found problems (exit {code})", flush=True)
            failed = failed or code
    print(f"[dev] static checks: {'problems found' if failed else 'clean'}", flush=True)
    if done is not None:
        done.write_text(str(failed))
    return failed


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "setup", "lint"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    python = ensure_venv("demo" if command == "demo" else "test")
    if command == "setup":
        return 0
    if command == "lint":
        return lint(python, Path(rest[1]) if rest[:1] == ["--done"] and len(rest) > 1 else None)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if command == "demo":
        return subprocess.run([str(python), "-m", "handofflock.demo", *rest], cwd=ROOT, env=env).returncode
    # Compiled once here, the tree's modules load from bytecode in every process the tests start, also
    # where PYTHONDONTWRITEBYTECODE is set (as on this project's machines): each child otherwise compiles the
    # package again (about 0.1 s of a child's start, on a loaded 2-core machine more).
    subprocess.run([str(python), "-m", "compileall", "-q", "-j", "0", *COMPILED], cwd=ROOT, check=True)
    if rest:  # pytest arguments: a partial run, not CI's
        return subprocess.run([str(python), "-m", "pytest", *rest], cwd=ROOT, env=env).returncode
    # The whole suite on WORKERS pytest-xdist workers. Most tests wait on servers, clocks and child
    # processes rather than compute, so three share two cores; the ones that compute run one after
    # another within their group (the framework jobs of each framework, the simulation, the builds),
    # each group on one worker (tests/conftest.py's HEAVY). The run is CPU-bound on two cores (its
    # processes use about 1.8 cores throughout): a fourth worker would add contention, not speed.
    args = [str(python), "-m", "pytest", "-n", str(WORKERS), "--dist", "loadgroup"]
    # The whole suite: the static checks run beside the tests (mypy takes a minute from cold, on one
    # core, while the tests mostly wait on servers and clocks) and fail the command, but never stop
    # the tests. Their report is printed by tests/conftest.py before pytest's last line.
    with tempfile.TemporaryDirectory(prefix="handofflock-lint-") as tmp:
        report = Path(tmp) / "lint.txt"
        with report.open("w") as out:
            checks = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "lint", "--done", str(report.with_suffix(".done"))],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        env[LINT_REPORT] = str(report)
        code = subprocess.run(args, cwd=ROOT, env=env).returncode
        checks_code = checks.wait()
        if not (Path(tmp) / "lint.txt.shown").exists():  # pytest ended before its summary: show it here
            print(report.read_text(), flush=True)
    return code or checks_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
