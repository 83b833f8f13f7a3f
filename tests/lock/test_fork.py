"""Fork safety: a forked child gets fresh connections and a fresh scheduler, and the parent's lock stays the parent's.

Each scenario runs in tests/support/procs/forked.py, a process of its own: forking
pytest, which runs threads, could deadlock for reasons of its own.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from lockutil import url_for

FORKED = Path(__file__).resolve().parents[1] / "support" / "procs" / "forked.py"

pytestmark = pytest.mark.timeout(120)


def scenario(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(FORKED), *args], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout.splitlines()[-1])


@pytest.mark.gcs
def test_parent_and_child_never_read_each_others_replies(gcs_emulator):
    """Processes that shared keep-alive connections would write requests on them and read each
    other's replies; the child's first request opens a connection of its own."""
    bucket = f"fork-{__import__('uuid').uuid4().hex[:12]}"
    gcs_emulator.create_bucket(bucket)
    out = scenario("gcs-reads", bucket, "300")
    assert out["child_status"] == 0
    assert out["parent"] == {"wrong": 0, "errors": 0}
    assert out["child"] == {"wrong": 0, "errors": 0}


@pytest.mark.s3
def test_on_s3_parent_and_child_never_read_each_others_replies(s3_server):
    """The same for the S3 backend: boto3's pooled keep-alive connections are not the child's to use."""
    bucket = f"fork-{__import__('uuid').uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    out = scenario("s3-reads", bucket, "300")
    assert out["child_status"] == 0
    assert out["parent"] == {"wrong": 0, "errors": 0}
    assert out["child"] == {"wrong": 0, "errors": 0}


@pytest.mark.parametrize("kind", ["local", "gcs", "s3"])
def test_a_forked_child_neither_hangs_nor_touches_its_parents_lock(kind, request, tmp_path):
    """A child forked while the parent holds the lock (with ``release_at_exit``): the inherited
    instance holds nothing there and refuses to act (InheritedAcrossFork); the child can take a
    lock of its own (a fresh scheduler renews it); an ordinary exit runs the inherited atexit hook,
    which before hung on a scheduler mutex inherited locked, or could release the parent's lock; a
    SIGTERM ends the child as if no handler were installed. The parent keeps its lock throughout."""
    out = scenario("held", url_for(kind, request, tmp_path))
    expected_child = {"is_held": False, "healthy": False, "token": None, "release": "InheritedAcrossFork",
                      "acquire": "InheritedAcrossFork", "own": True, "own_healthy": True}
    assert out["exit"] == {"child": expected_child, "status": 0}
    assert out["sigterm"] == {"child": expected_child, "status": -signal.SIGTERM}
    assert out["parent_healthy"] and out["token_kept"]
    assert out["record_owner"] == "parent"


def test_a_child_forked_during_a_fenced_write_can_use_the_fence(tmp_path):
    """The fence's mutex is held across store I/O and the write gate (up to a second per write on
    GCS): a child forked meanwhile waited forever for a thread that does not exist in it."""
    out = scenario("fence-mutex", (tmp_path / "jobs" / "latest.json").as_uri())
    assert out["child_status"] == 0
