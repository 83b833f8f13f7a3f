"""A store that cannot be reached is said so at once, and `status` gives up within seconds (exit 69).

Pointed at a GCS "emulator" on a port nobody listens on, or one that never answers: the command in this
process (``main``) where its words and exit status are the point; ``run`` as the real ``handofflock`` command
where a signal to it is.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import time
import weakref

import pytest
from jobsutil import CONSOLE_SCRIPT, child_env, in_process

from handofflock import FakeClock, cli
from handofflock._waitline import WaitLine  # private module: run's waiting line, tested on its own
from handofflock.cli import STATUS_TIMEOUT
from handofflock.core.errors import TransientStorageError
from handofflock.exit_codes import EXIT_CONFIG, EXIT_STORAGE
from handofflock.storage import MemoryStorage, records
from childpipes import line_from


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nowhere() -> dict[str, str]:
    return child_env(STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{closed_port()}")


def first_line_within(proc: subprocess.Popen, seconds: float) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        assert sel.select(seconds), f"nothing on stderr within {seconds} s"
    return line_from(proc.stderr)


def test_run_says_at_once_that_it_cannot_reach_the_store_and_names_no_slot_it_never_had():
    proc = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "run", "gs://bkt/x.json", "--", "true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=nowhere(),
    )
    try:
        started = time.monotonic()
        line = first_line_within(proc, 10.0)
        assert "cannot reach the store" in line and "connection refused" in line and "retrying" in line, line
        assert time.monotonic() - started < 10.0
        assert proc.poll() is None  # it keeps trying: no --timeout was given
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "stopped by SIGTERM while waiting" in rest
    assert "slot" not in rest, rest  # it never was the waiter


def test_status_of_a_store_that_cannot_be_reached_fails_within_seconds_with_the_cause(monkeypatch, capfd):
    """``status`` in this process, its retries on a clock whose waits are the passage of time."""
    clocks = []

    def clock():
        clocks.append(FakeClock(start=time.time(), step=0.25))
        return clocks[-1]

    monkeypatch.setattr(cli, "Clock", clock)
    monkeypatch.setattr(records, "_down", weakref.WeakKeyDictionary())  # the store it finds down is not left so
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{closed_port()}")
    started = time.monotonic()
    done = in_process(["status", "gs://bkt/x.json"], capfd)
    took = time.monotonic() - started
    assert done.returncode == EXIT_STORAGE, done.stderr
    assert "Connection refused" in done.stderr
    assert took < 15.0, f"status took {took:.1f} s to fail"
    assert [c.monotonic() - 1000.0 for c in clocks] == [pytest.approx(STATUS_TIMEOUT, abs=1.0)]


def test_status_of_a_missing_bucket_is_an_error_as_run_finds_it(gcs_emulator, capfd):
    url = f"gs://no-such-bucket-{os.getpid()}/locks/x.json"
    status = in_process(["status", url], capfd)
    assert status.returncode == EXIT_STORAGE, status.stdout + status.stderr
    assert "does not exist" in status.stderr
    assert "absent" not in status.stdout
    run = in_process(["run", "-q", url, "--", "true"], capfd)
    assert run.returncode == EXIT_STORAGE, run.stderr


def test_status_of_an_absent_lock_in_an_existing_bucket_is_still_absent(gcs_emulator, capfd):
    done = in_process(["status", "gs://handofflock-test/never/made.json"], capfd)
    assert done.returncode == 0, done.stderr
    assert "absent" in done.stdout


class _Lock:
    url = "memory://down/x.json"
    owner_id = "me"

    def status(self):
        raise TransientStorageError("no answer")


def test_the_live_line_says_the_store_cannot_be_reached_rather_than_held_by_someone(monkeypatch):
    monkeypatch.setattr(records, "_down", weakref.WeakKeyDictionary())  # other tests' stores are none of run's
    store = MemoryStorage()
    refused = TransientStorageError("could not connect")
    refused.__cause__ = ConnectionRefusedError(111, "Connection refused")
    records.failed(store, refused)
    try:
        text = WaitLine(_Lock(), stream=open(os.devnull, "w")).text()
    finally:
        records.answered(store)
    assert "cannot reach the store: connection refused (retrying)" in text
    assert "held by" not in text
    assert "held by ?" in WaitLine(_Lock(), stream=open(os.devnull, "w")).text()  # once it answers, as before


@pytest.fixture
def hung_store():
    """The address of a "store" that accepts connections and never answers a byte (the kernel completes
    each connection into the listening socket's backlog; nobody reads or replies)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_status_of_a_store_that_never_answers_gives_up_within_its_timeout_in_cli_words(hung_store, monkeypatch, capfd):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", hung_store)
    from handofflock.storage.gcs import GCSStorage  # imported before the clock starts, as the command has it

    assert GCSStorage
    started = time.monotonic()
    done = in_process(["status", "--timeout", "0.2", "gs://bkt/x.json"], capfd)
    took = time.monotonic() - started
    assert done.returncode == EXIT_STORAGE, done.stderr
    assert took < 0.2 + 1.0, f"status took {took:.2f} s with --timeout 0.2"
    assert "did not answer within 0.2 s" in done.stderr and "--timeout" in done.stderr, done.stderr
    for not_for_a_read in ("may have been applied", "request_timeout"):
        assert not_for_a_read not in done.stderr, done.stderr


def test_status_json_says_its_error_as_json_on_stdout_within_its_timeout(hung_store, monkeypatch, capfd):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", hung_store)
    from handofflock.storage.gcs import GCSStorage  # imported before the clock starts, as the command has it

    assert GCSStorage
    started = time.monotonic()
    done = in_process(["status", "--json", "--timeout", "0.3", "gs://bkt/x.json"], capfd)
    took = time.monotonic() - started
    assert done.returncode == EXIT_STORAGE
    assert took < 0.3 + 1.0, f"status --timeout 0.3 took {took:.2f} s"
    doc = json.loads(done.stdout)
    assert doc["state"] == "unreadable" and doc["exitCode"] == EXIT_STORAGE and doc["url"] == "gs://bkt/x.json"
    assert "did not answer within 0.3 s" in doc["error"]


def test_status_json_of_a_bad_url_is_json_too(capfd):
    done = in_process(["status", "--json", "gs//bkt/x.json"], capfd)
    assert done.returncode == EXIT_CONFIG
    assert json.loads(done.stdout)["state"] == "error"


def test_an_unreachable_store_is_named_by_its_address_not_by_a_private_class(monkeypatch, capfd):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", nowhere()["STORAGE_EMULATOR_HOST"])
    monkeypatch.setattr(records, "_down", weakref.WeakKeyDictionary())  # other tests' stores are none of run's
    done = in_process(["run", "--timeout", "1", "gs://bkt/x.json", "--", "true"], capfd)
    assert done.returncode == EXIT_STORAGE, done.stderr
    assert "Connection refused" in done.stderr and "127.0.0.1:" in done.stderr, done.stderr
    for private in ("RememberingHTTPConnection", "HTTPConnection(", "object at 0x"):
        assert private not in done.stderr, done.stderr


def test_run_that_gives_up_on_a_store_that_never_answers_says_so_in_cli_words(hung_store, monkeypatch, capfd):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", hung_store)
    monkeypatch.setattr(records, "_down", weakref.WeakKeyDictionary())  # other tests' stores are none of run's
    done = in_process(["run", "--timeout", "1", "gs://bkt/x.json", "--", "true"], capfd)
    assert done.returncode == EXIT_STORAGE, done.stderr
    assert "(--timeout 1)" in done.stderr and "the store did not answer" in done.stderr, done.stderr
    assert "request_timeout" not in done.stderr and "may have been applied" not in done.stderr, done.stderr
