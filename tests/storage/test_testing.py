"""handofflock.testing.FakeGCSServer: starts on loopback, fails loudly, leaves no process behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from handofflock.testing import FakeGCSServer


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (only its parent can reap it).
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_server_runs_on_loopback_and_is_gone_after_stop(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://previous:1")
    server = FakeGCSServer().start()
    try:
        pid = server.pid
        assert server.url == f"http://127.0.0.1:{server.port}" and server.host_port == f"127.0.0.1:{server.port}"
        with server.env():
            assert os.environ["STORAGE_EMULATOR_HOST"] == server.url
        assert os.environ["STORAGE_EMULATOR_HOST"] == "http://previous:1"
        server.create_bucket("some-bucket")
        with pytest.raises(RuntimeError, match="some-bucket"):
            server.create_bucket("some-bucket")  # already exists: the emulator says 409
    finally:
        server.stop()
    assert not _alive(pid) and not server.running
    server.stop()  # idempotent


def test_a_server_that_cannot_start_fails_loudly_with_its_log():
    with pytest.raises(RuntimeError) as info:
        FakeGCSServer(log_level="not-a-level", startup_timeout=5).start()
    assert 'invalid log level "not-a-level"' in str(info.value)


def test_a_server_never_stopped_is_stopped_when_the_interpreter_exits():
    script = (
        "from handofflock.testing import FakeGCSServer\n"
        "server = FakeGCSServer().start()\n"
        "print(server.pid, flush=True)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    pid = int(result.stdout.split()[0])
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    orphaned = _alive(pid)
    if orphaned:  # do not leave it running because the test failed
        os.kill(pid, 9)
    assert not orphaned
