"""Errors and ``run``'s messages name the owner and the waiter as ``status`` does: by label, with the id."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from lockutil import url_for

from handofflock import HandoffLock, LockContended, LockTimeout

OWNER, WAITER = "pod=ml/train-0 pid=1", "pod=ml/train-1 pid=1"


def test_lock_contended_names_the_owner_and_the_waiter_by_label_and_id(sim):
    owner = sim.lock("O", label=OWNER)
    waiter = sim.lock("W", label=WAITER, waiter_ttl=60)
    third = sim.lock("T")
    assert sim.call(owner.acquire)
    sim.start(lambda: waiter.acquire(timeout=20))
    sim.run_until(lambda: sim.record().waiting_owner_id == "W", what="W registered as the waiter")
    with pytest.raises(LockContended) as info:
        sim.call(third.acquire)
    text = str(info.value)
    assert f"{OWNER} (O)" in text and f"{WAITER} (W)" in text, text
    assert (info.value.owner_label, info.value.waiter_label) == (OWNER, WAITER)


def test_lock_timeout_names_the_owner_by_label(request, tmp_path):
    url = url_for("local", request, tmp_path)
    owner = HandoffLock(url, owner_id="O", label=OWNER)
    assert owner.acquire()
    try:
        with pytest.raises(LockTimeout) as info:
            HandoffLock(url, owner_id="W").acquire(timeout=0.2)
        assert f"held by {OWNER} (O)" in str(info.value), str(info.value)
    finally:
        owner.release()


def test_run_nonblock_names_the_holder_by_label(request, tmp_path):
    url = url_for("local", request, tmp_path)
    owner = HandoffLock(url, owner_id="O", label=OWNER)
    assert owner.acquire()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "handofflock", "run", "--nonblock", url, "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ),
        )
        assert done.returncode == 75, done.stderr
        assert f"held by {OWNER} (O)" in done.stderr, done.stderr
    finally:
        owner.release()
