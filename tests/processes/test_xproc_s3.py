"""The lock used the way users use it, on S3: separate processes, the real moto server, the default pacing (none).

The same harness and checks as ``test_xproc_gcs.py`` (``tests/support/procs/xproc.py``
processes; no overlapping holds, strictly increasing tokens, no loss, no
error escaping acquire or release); on S3 no write spacing applies by default.
"""

from __future__ import annotations

import pytest
from lockutil import url_for
from test_xproc_gcs import assert_history, procs  # noqa: F401  (procs is a fixture)

pytestmark = pytest.mark.s3


@pytest.mark.timeout(120)
def test_two_processes_pass_the_lock_back_and_forth_on_s3_without_loss(procs, request, tmp_path):  # noqa: F811
    """Ten round trips between two processes over S3: every release but the last is a handoff, the
    lock alternates, nobody loses it."""
    url = url_for("s3", request, tmp_path)
    rounds = 10
    lock = {"ttl": 5.0, "waiter_check_interval": 0.5, "waiter_poll_interval": 0.25}
    a = procs("A", {"url": url, "lock": lock, "rounds": rounds, "hold_min": 0.2, "hold_max": 30})
    a.wait_for("acquired")
    b = procs("B", {"url": url, "lock": lock, "rounds": rounds, "hold_min": 0.2, "hold_max": 30,
                    "last_until_requested": False, "last_hold_max": 0.5})
    a.finish(100)
    b.finish(30)
    hs = assert_history(a, b, expect_holds=2 * rounds)
    assert [h["proc"] for h in hs] == ["A", "B"] * rounds, "the lock alternated"
    heirs = [e["heir"] for e in a.named("released") + b.named("released")]
    assert heirs.count(None) == 1, f"every release but the last was a handoff: {heirs}"
