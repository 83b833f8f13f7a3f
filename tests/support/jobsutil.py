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


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: unbuffered output, the emulator's address inherited."""
    return dict(os.environ, PYTHONUNBUFFERED="1", **extra)


def popen(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), **kw)
