"""The lock used the way users use it: separate processes, the real fake-gcs-server, the store's default pacing.

Every process here is ``tests/support/procs/xproc.py``: one ``HandoffLock("gs://…", ttl=…)``
built without ``min_write_interval``, so GCS's default spacing (one write per
second per object, from each process) applies, as it does for a new user.
Each process stamps what it did with ``time.monotonic()``, which is one clock
for all processes of a host, and checks its lock every 20 ms while it holds
it. After every scenario :func:`assert_history` checks, over all processes:

* nobody lost the lock, reported a renewal error, or failed a ``check()``
  while holding it, and no exception (``TransientStorageError`` included)
  escaped ``acquire()`` or ``release()``;
* holds never overlap: each process's hold runs from ``acquire()`` returning
  to ``release()`` being called, and the next hold starts after it;
* tokens strictly increase from one hold to the next.

Only generous time bounds are asserted (a loaded 2-core machine must pass);
docs/benchmarks.md has the measured latencies.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from lockutil import raw_read, url_for

from handofflock.core.record import LockRecord
from handofflock.testing.faultproxy import FaultProxy

PROC = Path(__file__).resolve().parents[1] / "support" / "procs" / "xproc.py"

pytestmark = pytest.mark.gcs

#: Events that must never appear in a process that was not told to expect them.
TROUBLE = ("unhealthy", "lost", "renewal_error", "error")


class Proc:
    """One xproc.py process; its events are collected as they come."""

    def __init__(self, name: str, spec: dict[str, Any], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.spec = spec
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.popen = subprocess.Popen(
            [sys.executable, str(PROC), orjson.dumps(spec).decode()],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env, text=True,
        )
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._stderr: list[str] = []
        self._readers = [threading.Thread(target=self._read_out, daemon=True), threading.Thread(target=self._read_err, daemon=True)]
        for t in self._readers:
            t.start()

    def _read_out(self) -> None:
        for line in self.popen.stdout:  # type: ignore[union-attr]
            if line.startswith("{"):
                event = orjson.loads(line)
                event["proc"] = self.name
                with self._cond:
                    self.events.append(event)
                    self._cond.notify_all()

    def _read_err(self) -> None:
        for line in self.popen.stderr:  # type: ignore[union-attr]
            self._stderr.append(line)

    def wait_for(self, event: str, count: int = 1, timeout: float = 60.0) -> dict[str, Any]:
        """The ``count``-th event named ``event``, waiting for it at most ``timeout`` s."""
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.named(event)) >= count or self.popen.poll() is not None, timeout)
            found = self.named(event)
        if len(found) < count:
            time.sleep(0.2)  # let the reader thread drain a process that just exited
            found = self.named(event)
        assert len(found) >= count, (
            f"{self.name}: no {event!r} #{count} within {timeout} s (timed out: {not ok}); "
            f"events: {self.summary()}\nstderr: {self.stderr()[-3000:]}"
        )
        return found[count - 1]

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e["event"] == event]

    def finish(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Wait for the process to exit 0; return its events."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
            raise AssertionError(f"{self.name} did not finish within {timeout} s; events: {self.summary()}")
        for t in self._readers:  # every line the process wrote is in self.events
            t.join(10)
        assert self.popen.returncode == 0, (
            f"{self.name} exited {self.popen.returncode}: {self.summary()}\nstderr: {self.stderr()[-3000:]}"
        )
        return list(self.events)

    def stderr(self) -> str:
        return "".join(self._stderr)

    def summary(self) -> str:
        keep = ("token", "heir", "reason", "error", "after", "round")
        return "; ".join(
            f"{e['event']}@{e['mono']:.2f}" + "".join(f" {k}={e[k]}" for k in keep if k in e) for e in list(self.events)
        )

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


@pytest.fixture
def procs():
    """Start xproc.py processes; any left running at the end is killed."""
    started: list[Proc] = []

    def start(name: str, spec: dict[str, Any], env: dict[str, str] | None = None) -> Proc:
        p = Proc(name, spec, env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def holds(*ps: Proc) -> list[dict[str, Any]]:
    """Every hold of every process: from acquire() returning to release() being called, with its token."""
    out = []
    for p in ps:
        start: dict[str, Any] | None = None
        for e in list(p.events):
            if e["event"] == "acquired":
                assert start is None, f"{p.name} acquired twice without releasing"
                start = e
            elif e["event"] == "releasing":
                assert start is not None, f"{p.name} released what it had not acquired"
                out.append({"proc": p.name, "me": start["me"], "token": start["token"],
                            "start": start["mono"], "end": e["mono"], "healthy_on_arrival": start["healthy"]})
                start = None
        assert start is None, f"{p.name} ended holding the lock"
    return sorted(out, key=lambda h: h["start"])


def assert_history(*ps: Proc, expect_holds: int | None = None) -> list[dict[str, Any]]:
    """No trouble anywhere; holds one at a time, tokens strictly increasing. Returns the holds."""
    for p in ps:
        trouble = [e for e in list(p.events) if e["event"] in TROUBLE]
        assert trouble == [], f"{p.name}: {trouble}\nall events: {p.summary()}\nstderr: {p.stderr()[-3000:]}"
    hs = holds(*ps)
    for h in hs:
        assert h["healthy_on_arrival"], f"{h['proc']} was not healthy as acquire() returned: {h}"
    for earlier, later in zip(hs, hs[1:]):
        assert later["start"] > earlier["end"], f"two holders at once: {earlier} and {later}"
        assert later["token"] > earlier["token"], f"the token did not increase: {earlier} then {later}"
    if expect_holds is not None:
        assert len(hs) == expect_holds, f"expected {expect_holds} holds, got {len(hs)}: {hs}"
    return hs


def released_to(p: Proc, n: int = 1) -> str | None:
    return p.wait_for("released", n, timeout=5)["heir"]


# --------------------------------------------------------------------------- handoff


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ttl", [5.0, 60.0])
def test_a_handoff_between_processes_at_default_pacing_reaches_a_healthy_heir(ttl, procs, request, tmp_path):
    """Owner and waiter, default intervals and pacing. The owner hears of the waiter and hands over; the
    heir holds a healthy lease for longer than the ttl-5 renew_deadline (2.5 s), so at ttl 5 it has to
    renew under the 1 s spacing. At ttl 60 the handoff takes no longer: a handoff never waits for the
    lease to run out (the bound below is a sixth of that lease)."""
    url = url_for("gcs", request, tmp_path)
    owner = procs("owner", {"url": url, "lock": {"ttl": ttl}, "hold_max": 60})
    owner.wait_for("acquired")
    waiter = procs("waiter", {"url": url, "lock": {"ttl": ttl}, "until_requested": False, "hold_max": 4.0})
    owner.finish(60)
    waiter.finish(60)
    assert owner.wait_for("ready")["min_write_interval"] == 1.0, "the GCS default pacing applies"
    hs = assert_history(owner, waiter, expect_holds=2)
    assert released_to(owner) == hs[1]["me"], "the lock was handed to the waiter, not freed"
    handoff = waiter.wait_for("acquired")["mono"] - owner.wait_for("releasing")["mono"]
    assert 0 < handoff < 10.0, f"handoff took {handoff:.2f} s"
    assert waiter.wait_for("held")["checks"] > 0


# --------------------------------------------------------------------------- waiters that give up


@pytest.mark.timeout(120)
def test_waiters_that_give_up_never_cost_the_owner_its_lock(procs, request, tmp_path):
    """The first failure of the issue: an owner at ttl 5; a waiter registers, times out and leaves.
    Two waiter processes do that twice each while the owner holds on; the owner must stay healthy
    throughout (it checks every 20 ms) and afterwards, through more than a renew_deadline of
    renewals, and its release finds nobody to hand to."""
    url = url_for("gcs", request, tmp_path)
    stop = tmp_path / "stop-owner"
    owner = procs("owner", {"url": url, "lock": {"ttl": 5.0}, "until_requested": False, "hold_max": 90, "stop_file": str(stop)})
    owner.wait_for("acquired")
    waiters = []
    for name in ("waiter-1", "waiter-2"):
        w = procs(name, {"url": url, "lock": {"ttl": 5.0}, "rounds": 2, "timeout": 2.0})
        w.finish(60)
        waiters.append(w)
    time.sleep(3.5)  # more than renew_deadline (2.5 s) after the last waiter left: the owner had to renew
    stop.touch()
    owner.finish(30)
    assert_history(owner, *waiters, expect_holds=1)
    for w in waiters:
        assert len(w.named("timeout")) == 2, f"{w.name}: {w.summary()}"
        assert len(w.named("waiting")) == 2, f"{w.name} never registered: {w.summary()}"
    assert owner.named("noticed"), "the owner heard of the waiters"
    assert released_to(owner) is None
    record, _ = raw_read(url)
    assert record is not None and record.owner_id is None and record.waiting_owner_id is None


# --------------------------------------------------------------------------- ping-pong


@pytest.mark.timeout(150)
def test_two_processes_pass_the_lock_back_and_forth_at_ttl_5_without_loss(procs, request, tmp_path):
    """Ten round trips: each process takes the lock, holds it until the other asks, hands it over and
    at once queues for it again (its registration comes right after its own release write, through
    the same write spacing). Every release is a handoff; nobody loses the lock; no
    TransientStorageError escapes a release or an acquire."""
    url = url_for("gcs", request, tmp_path)
    rounds = 10
    lock = {"ttl": 5.0, "waiter_check_interval": 0.5, "waiter_poll_interval": 0.25}
    a = procs("A", {"url": url, "lock": lock, "rounds": rounds, "hold_min": 0.2, "hold_max": 30})
    a.wait_for("acquired")
    b = procs("B", {"url": url, "lock": lock, "rounds": rounds, "hold_min": 0.2, "hold_max": 30,
                    "last_until_requested": False, "last_hold_max": 0.5})
    a.finish(140)
    b.finish(30)
    hs = assert_history(a, b, expect_holds=2 * rounds)
    assert [h["proc"] for h in hs] == ["A", "B"] * rounds, "the lock alternated"
    heirs = [e["heir"] for e in a.named("released") + b.named("released")]
    assert heirs.count(None) == 1, f"every release but the last was a handoff: {heirs}"


# --------------------------------------------------------------------------- throttling and unavailability


@pytest.mark.timeout(120)
def test_an_acquire_that_rode_out_a_503_and_a_429_holds_a_lease_counted_from_its_write(procs, gcs_emulator, request, tmp_path):
    """The process talks to the emulator through a FaultProxy that answers its first write 503, the
    next 429 (Retry-After: 1). acquire() retries past both; its lease must count from the write that
    landed, so the lock is healthy on arrival and stays healthy for 4 s (more than renew_deadline,
    2.5 s: it renews). The issue's lock counted the lease from before the retries and declared itself
    lost about a second later, having made no renewal."""
    url = url_for("gcs", request, tmp_path)
    with FaultProxy(gcs_emulator.url, lifetime=120) as proxy:
        unavailable = proxy.inject("503", method="POST")
        throttled = proxy.inject("429", method="POST", retry_after=1)
        p = procs("owner", {"url": url, "lock": {"ttl": 5.0}, "until_requested": False, "hold_max": 4.0},
                  env={"STORAGE_EMULATOR_HOST": proxy.url})
        p.finish(60)
        writes = [ex for ex in proxy.exchanges("POST") if ex.upload_data() is not None]
    assert (unavailable.fired, throttled.fired) == (1, 1)
    assert_history(p, expect_holds=1)
    statuses = [ex.status for ex in writes]
    assert statuses[:2] == [503, 429], statuses
    # The first write to land after them (on storage-testbench an exchange in between can fail on its
    # own, unanswered; the lock retries it like any other transient failure).
    first = next(k for k in range(2, len(writes)) if statuses[k] == 200)
    landed = LockRecord.decode(writes[first].upload_data())
    # Stamped at the send of the attempt that landed: after the 503, the 429 and the second it asked for.
    assert landed.expires_at is not None and landed.expires_at >= writes[first].started - 0.5 + 5.0
    assert writes[2].started - writes[1].started >= 1.0 - 0.05, "the retry after the 429 waited out Retry-After"
    renewals = [ex for ex in writes[first + 1:] if ex.status == 200 and LockRecord.decode(ex.upload_data()).owner_id == landed.owner_id]
    assert len(renewals) >= 2, f"the lease was kept by renewals: {statuses}"


# --------------------------------------------------------------------------- heir with a longer ttl


@pytest.mark.timeout(120)
def test_an_heir_with_a_longer_ttl_than_its_predecessor_keeps_the_lock(procs, request, tmp_path):
    """Owner at ttl 5, heir at ttl 20. The handoff writes the heir's own lease (20 s); the heir must
    not count it by the old owner's ttl, nor call itself lost before its first renewal (the issue's
    heir was "lost" milliseconds after acquire() returned). It holds 6 s, renewing every 2.5 s."""
    url = url_for("gcs", request, tmp_path)
    owner = procs("owner", {"url": url, "lock": {"ttl": 5.0}, "hold_max": 60})
    owner.wait_for("acquired")
    heir = procs("heir", {"url": url, "lock": {"ttl": 20.0}, "until_requested": False, "hold_max": 6.0})
    arrived = heir.wait_for("acquired", timeout=60)
    time.sleep(4.0)
    record, _ = raw_read(url)
    owner.finish(30)
    heir.finish(60)
    hs = assert_history(owner, heir, expect_holds=2)
    assert released_to(owner) == hs[1]["me"]
    assert record is not None and record.owner_id == arrived["me"] and record.ttl == 20.0
    # Renewed by the heir since the handoff, on its own 20 s ttl.
    assert record.expires_at > arrived["wall"] + 20.0 - 1.0, record


# --------------------------------------------------------------------------- slow receiver


@pytest.mark.timeout(120)
def test_a_receiver_slower_than_renew_deadline_costs_the_owner_nothing_and_it_hands_off_afterwards(procs, request, tmp_path):
    """The owner's on_release_requested receiver checkpoints for 4 s, longer than renew_deadline
    (2.5 s at ttl 5). Renewals go on meanwhile (receivers run on their own thread), so the owner is
    healthy throughout (its main thread checks every 20 ms) and when the receiver returns; then it
    hands over to the waiter, which is still waiting."""
    url = url_for("gcs", request, tmp_path)
    owner = procs("owner", {"url": url, "lock": {"ttl": 5.0}, "slow_receiver": 4.0, "hold_max": 60})
    owner.wait_for("acquired")
    waiter = procs("waiter", {"url": url, "lock": {"ttl": 5.0}, "until_requested": False, "hold_max": 1.0})
    owner.finish(60)
    waiter.finish(60)
    hs = assert_history(owner, waiter, expect_holds=2)
    noticed, done = owner.wait_for("noticed"), owner.wait_for("receiver_done")
    assert done["mono"] - noticed["mono"] >= 4.0 - 0.05
    assert noticed["healthy"] and done["healthy"], "healthy while the receiver ran"
    assert owner.wait_for("releasing")["mono"] >= done["mono"], "the owner handed over after its checkpoint"
    assert released_to(owner) == hs[1]["me"]
