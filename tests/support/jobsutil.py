"""Helpers for the job-facing tests (signals, CLI, examples): a lock URL other processes can reach."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lockutil import url_for

SHARED_BACKENDS = ["local", "gcs"]

ROOT = Path(__file__).resolve().parents[2]
#: The console script installed with the package (next to the venv's python).
CONSOLE_SCRIPT = Path(sys.executable).parent / "handofflock"


@pytest.fixture(params=SHARED_BACKENDS)
def shared_url(request, tmp_path):
    """A fresh lock URL another process can reach: a local file, or a bucket on the session's emulator."""
    return url_for(request.param, request, tmp_path)


#: For a test of ``run``'s own logic (signals, grace, patience), the same on every store: the local file only.
#: The handoff and status tests keep a row on the emulator, the runner's smoke test on GCS.
runner_logic = pytest.mark.parametrize("shared_url", ["local"], indirect=True)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: unbuffered output, the emulator's address inherited."""
    return dict(os.environ, PYTHONUNBUFFERED="1", **extra)


def popen(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), **kw)


def in_process(args: list[str], capsys: pytest.CaptureFixture[str], cwd: Path | None = None):
    """``handofflock ARGS`` run by ``handofflock.cli.main`` in this process: milliseconds instead of an
    interpreter's start. Used for refusals, ``status``, and ``run``s whose exit and words are what is checked
    (``run`` puts back the signal handlers and the subreaper setting it changed). An exception that escapes
    ``main`` fails the test here, as its traceback would fail the real command's check. What only a process
    shows (its exit status at interpreter exit, signals sent to it) is checked through the console script."""
    from handofflock.cli import main

    capsys.readouterr()
    before = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        code = main(list(args))
    finally:
        os.chdir(before)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["handofflock", *args], code, out, err)


#: A command's prefix that makes it PID 1 of a new PID namespace (with its own /proc).
UNSHARE_PID = ["unshare", "--pid", "--fork", "--mount-proc"]


def pid_namespace_refused() -> str | None:
    """Why no PID namespace can be made here (no unshare(1), not root, a kernel that refuses), or None."""
    import shutil

    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    probe = subprocess.run([*UNSHARE_PID, "true"], capture_output=True, text=True, timeout=30)
    return None if probe.returncode == 0 else f"the kernel refuses a PID namespace: {probe.stderr.strip()}"
