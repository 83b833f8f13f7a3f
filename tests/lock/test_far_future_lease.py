"""A lease that claims to run decades ahead is not trusted: it ends ttl (plus skew) after it was first seen."""

from __future__ import annotations

import logging
import time

import pytest
from lockutil import raw_read, raw_write, url_for
from simworld import KEY

from handofflock import HandoffLock
from handofflock.core.record import LockRecord

YEARS = 31 * 365 * 86400.0


def _ghost(url: str, ttl: float) -> LockRecord:
    """A record nobody renews, whose lease claims to run 31 years ahead (hand-made, or a clock gone wrong)."""
    record = LockRecord("ghost", time.time() + YEARS, None, None, ttl=ttl, token=5, nonce="n")
    raw_write(url, record, 0)
    return record


@pytest.mark.parametrize("pacing", [0.0, 1.0], ids=["unpaced", "gcs-pacing"])
def test_a_lease_31_years_ahead_is_taken_once_its_ttl_and_the_skew_have_passed(sim, pacing, caplog):
    record = LockRecord("ghost", sim.time() + YEARS, None, None, ttl=3.0, token=5, nonce="n")
    sim.store.write(KEY, record.encode(), if_generation_match=0)
    lock = sim.lock("taker", ttl=5.0, min_write_interval=pacing)  # skew allowance 2 s
    started = sim.monotonic()
    with caplog.at_level(logging.WARNING, logger="handofflock.acquire"):
        assert sim.call(lambda: lock.acquire(timeout=30))
    took = sim.monotonic() - started
    assert 3.0 + 2.0 - 0.5 <= took < 15, took  # the record's ttl plus the skew, from the first read
    record = sim.record()
    assert record.owner_id == lock.owner_id and record.token > 5
    assert record.expires_at < sim.time() + 5.0 + 1  # our own lease, a normal one
    assert any("further ahead than its ttl" in r.getMessage() for r in caplog.records), caplog.text


def test_status_reports_a_suspect_lease_and_a_normal_one_is_not(request, tmp_path):
    url = url_for("local", request, tmp_path)
    _ghost(url, ttl=60.0)
    st = HandoffLock(url).status(timeout=5)
    assert st.lease_suspect and st.to_json()["leaseSuspect"] is True
    record, generation = raw_read(url)
    raw_write(url, record.replace(expires_at=time.time() + 30, nonce="m"), generation)
    assert not HandoffLock(url).status().lease_suspect


def test_the_status_command_says_the_lease_is_not_trusted(request, tmp_path, capsys):
    from handofflock.cli import main

    url = url_for("local", request, tmp_path)
    _ghost(url, ttl=60.0)
    main(["status", url])
    assert "suspect" in capsys.readouterr().out
