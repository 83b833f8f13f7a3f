"""Section ``capacity``: how many locks one process keeps at 50 ms per request, and what a lock-hour costs.

**Capacity** is searched on simulated time (:mod:`handofflock.testing.sim.hub`): one simulated
process runs the real :class:`~handofflock.HandoffLock` and the real scheduler (its loop, its
queue, ``io_workers`` pool workers as greenlets) against a memory store whose every request takes
``delay`` seconds, with GCS's write spacing (1 s: the defaults a ``gs://`` lock gets). Nothing else
costs time there: planning, the interpreter and the GIL are free, so the search finds what the
scheduler's design allows, and :func:`confirm` runs the found count for ttl 5 in real time on
file:// with the same delay per request, to show the machine keeps up with it.

Each probe takes ``n`` locks under one prefix at once (the worst case: every renewal falls due
together) and runs past the first renew deadline: the first round of renewals is the worst (all fall
due at once), later ones are spread as it served them. A count is **healthy** when no lease was lost; it has
**margin** when, besides, the scheduler never warned (no renewal started later than half its
margin, :data:`~handofflock.lock.scheduler.BEHIND_SHARE`). Both are searched by bisection, from a
bracket around what the workers can send within the first round's margin.

**Cost** is counted from the timing, not measured: at the defaults a held lock renews every
``renew_interval`` (one write) and is checked every ``waiter_check_interval`` (one read alone; one
listing shared by the locks under a prefix, grouped).
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
import warnings
from typing import Any

from handofflock import HandoffLock, Scheduler, signals
from handofflock.core.errors import RenewalsBehindWarning
from handofflock.core.timing import Timing
from handofflock.lock.scheduler import BEHIND_SHARE, IO_WORKERS
from handofflock.storage import MemoryStorage
from handofflock.testing.sim.hub import Hub, Proc, SimClock, sim_primitives

#: GCS's write spacing: a gs:// lock's default (``min_write_interval``).
GCS_SPACING = 1.0


def probe(n: int, ttl: float, *, delay: float = 0.05, io_workers: int = IO_WORKERS, seed: int = 0) -> dict[str, Any]:
    """``n`` locks in one simulated process, every request ``delay`` s: lost leases, the warning, the worst lateness."""
    hub = Hub(random.Random(seed))
    random.seed(seed)  # the library's backoff jitter
    store = MemoryStorage(f"capacity-{n}-{ttl:g}-{time.monotonic_ns()}")

    def slow(op: str, key: str | None) -> None:
        if hub.current is not None:
            hub.park(hub.now + delay)

    store.faults.before("*", slow)
    proc = Proc("bench")
    clock, prims = SimClock(hub, proc, 0.0), sim_primitives(hub, proc)
    sched = Scheduler(clock, name="capacity", primitives=prims, io_workers=io_workers)
    locks = [
        HandoffLock("memory://capacity", storage=store, key=f"locks/l{i:05d}.json", owner_id="bench", ttl=ttl,
                    min_write_interval=GCS_SPACING, clock=clock, scheduler=sched, primitives=prims)
        for i in range(n)
    ]  # fmt: skip
    lost: list[float] = []

    def on_lost(sender: Any, **kw: Any) -> None:
        lost.append(hub.now)

    taken: list[bool] = []
    for lock in locks:
        hub.spawn("acquire", lambda lock=lock: taken.append(bool(lock.acquire(blocking=False))), proc)
    with warnings.catch_warnings(record=True) as seen, signals.lost.connected_to(on_lost):
        warnings.simplefilter("always", RenewalsBehindWarning)
        while len(taken) < n:
            hub.run(hub.now + 0.1)
        start = hub.now
        writes0 = store.calls["write"]
        # The first round is the worst (every renewal due at once, all to land by the renew deadline); the
        # next ones are spread as it served them.
        hub.run(start + locks[0].renew_deadline + 0.5)
    warned = [w for w in seen if issubclass(w.category, RenewalsBehindWarning)]
    result = {
        "locks": n,
        "taken": sum(taken),
        "lost": len(lost),
        "warned": bool(warned),
        "worst_share": round(sched.lateness.worst, 3),
        "writes_per_s": round((store.calls["write"] - writes0) / (hub.now - start), 1),
    }
    for lock in locks:
        lock._unschedule()  # private: nothing to release on simulated time; the store goes with the probe
    hub.end()
    return result


def search(ttl: float, *, delay: float = 0.05, io_workers: int = IO_WORKERS) -> dict[str, Any]:
    """The largest healthy count and the largest count with margin, by bisection; every probe kept.

    The bracket starts around what the workers can send within the first round's margin (every
    renewal falls due at once, ``renew_interval`` after the locks were taken, and must land by the
    renew deadline) and is widened until its ends pass and fail.
    """
    timing = Timing.build(ttl=ttl, min_write_interval=GCS_SPACING)
    rate = io_workers / delay
    probes: dict[int, dict[str, Any]] = {}

    def run(k: int) -> dict[str, Any]:
        if k not in probes:
            probes[k] = probe(k, ttl, delay=delay, io_workers=io_workers)
        return probes[k]

    def largest(ok: Any, share: float) -> int:
        guess = rate * (timing.renew_deadline - timing.renew_interval) * share
        lo, hi = int(guess * 0.85), int(guess * 1.15) + 1
        while lo > 0 and not ok(run(lo)):
            lo, hi = lo // 2, lo
        while hi <= rate * timing.renew_deadline and ok(run(hi)):
            lo, hi = hi, hi * 2
        while hi - lo > max(1, lo // 40):  # to 2.5%
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ok(run(mid)) else (lo, mid)
        return lo

    healthy = largest(lambda p: p["lost"] == 0, 1.0)
    margin = largest(lambda p: p["lost"] == 0 and not p["warned"], BEHIND_SHARE)
    return {
        "ttl_s": ttl,
        "renew_interval_s": timing.renew_interval,
        "renew_deadline_s": timing.renew_deadline,
        "delay_ms": delay * 1000,
        "io_workers": io_workers,
        "healthy": healthy,
        "with_margin": margin,
        "probes": [probes[k] for k in sorted(probes)],
    }


class _Slowed:
    """A store whose every request waits ``delay`` seconds first (real time): GCS's round trip on file://."""

    def __init__(self, inner: Any, delay: float) -> None:
        self.inner, self.delay, self.url = inner, delay, inner.url

    def read(self, key: str, **kw: Any) -> Any:
        time.sleep(self.delay)
        return self.inner.read(key, **kw)

    def write(self, key: str, data: bytes, **kw: Any) -> int:
        time.sleep(self.delay)
        return int(self.inner.write(key, data, **kw))

    def delete(self, key: str, **kw: Any) -> None:
        time.sleep(self.delay)
        self.inner.delete(key, **kw)

    def list(self, prefix: str, **kw: Any) -> dict[str, int]:
        time.sleep(self.delay)
        return dict(self.inner.list(prefix, **kw))

    def __getattr__(self, name: str) -> Any:  # close, and what a store declares
        return getattr(self.inner, name)


def confirm(n: int, ttl: float, *, delay: float = 0.05, io_workers: int = IO_WORKERS) -> dict[str, Any]:
    """The same probe in real time: ``n`` locks on file:// in this process, every request held ``delay`` s."""
    from concurrent.futures import ThreadPoolExecutor

    from handofflock.storage.local import LocalStorage

    with tempfile.TemporaryDirectory(prefix="handofflock-capacity-") as root:
        store = _Slowed(LocalStorage(root), delay)
        sched = Scheduler(name="capacity-confirm", io_workers=io_workers)
        locks = [
            HandoffLock(f"file://{root}/locks/l{i:05d}.json", storage=store, key=f"locks/l{i:05d}.json",  # type: ignore[arg-type]
                        ttl=ttl, min_write_interval=GCS_SPACING, scheduler=sched)
            for i in range(n)
        ]  # fmt: skip
        lost: list[float] = []
        mutex = threading.Lock()

        def on_lost(sender: Any, **kw: Any) -> None:
            with mutex:
                lost.append(time.monotonic())

        with warnings.catch_warnings(record=True) as seen, signals.lost.connected_to(on_lost):
            warnings.simplefilter("always", RenewalsBehindWarning)
            with ThreadPoolExecutor(64) as pool:
                taken = sum(bool(x) for x in pool.map(lambda lock: lock.acquire(blocking=False), locks))
            cpu0, start = time.process_time(), time.monotonic()
            time.sleep(locks[0].renew_deadline + 2 * locks[0].renew_interval)
            cpu = (time.process_time() - cpu0) / (time.monotonic() - start)
        result = {
            "locks": n,
            "taken": taken,
            "lost": len(lost),
            "warned": any(issubclass(w.category, RenewalsBehindWarning) for w in seen),
            "worst_share": round(sched.lateness.worst, 3),
            "cpu_percent": round(100 * cpu, 1),
        }
        with ThreadPoolExecutor(64) as pool:
            list(pool.map(lambda lock: lock.release() if lock.is_held else None, locks))
        sched.stop()
        return result


# --------------------------------------------------------------------------- cost per lock-hour

#: List prices per request (USD): GCS Standard Class A (writes, listings) and Class B (reads, metadata
#: gets); S3 Standard PUT/COPY/POST/LIST and GET/SELECT. docs/benchmarks.md cites the pages.
PRICES = {"gcs": {"A": 0.005 / 1000, "B": 0.0004 / 1000}, "s3": {"A": 0.005 / 1000, "B": 0.0004 / 1000}}

#: What one lock-hour asks of the store: (name, the request pattern, Class A per hour, Class B per hour,
#: the stores it runs on).
Pattern = tuple[str, str, float, float, tuple[str, ...]]


def patterns(group: int = 50) -> list[Pattern]:
    """What one lock-hour asks of the store, for ours and the alternatives (see the module's docstring)."""
    t = Timing.build(min_write_interval=GCS_SPACING)  # a gs:// lock's defaults: ttl 60
    renew, check = 3600 / t.renew_interval, 3600 / t.waiter_check_interval
    vault_renew = 3600 / 5.0  # physical/gcs/gcs_ha.go: LockRenewInterval = LockWatchRetryInterval = 5 s, LockTTL 15 s
    return [
        ("handofflock, one lock (ttl 60: renew 7.5 s, check 2 s)", "renew: 1 write; check: 1 read", renew, check,
         ("gcs", "s3")),
        (f"handofflock, {group} locks under one prefix", "renew: 1 write; check: 1 listing per prefix",
         renew + check / group, 0.0, ("gcs", "s3")),
        ("Vault GCS lock, its defaults (ttl 15: renew 5 s, watch 5 s)", "renew: 1 metadata get + 1 insert; watch: 1 metadata get",
         vault_renew, 2 * vault_renew, ("gcs",)),
        ("Vault GCS lock at ttl 60, renewing as often as ours", "as above, renew and watch every 7.5 s",
         renew, 2 * renew, ("gcs",)),
        ("gcslock at ttl 60, renewed by acquire() as often as ours", "acquire: 1 bucket get + 1 metadata get + 1 patch",
         renew, 2 * renew, ("gcs",)),
    ]


def costs(group: int = 50) -> list[dict[str, Any]]:
    """Requests and dollars per lock-hour at GCS and S3 list prices."""
    out = []
    for name, how, a, b, stores in patterns(group):
        out.append({
            "lock": name, "pattern": how, "class_a_per_hour": round(a, 1), "class_b_per_hour": round(b, 1),
            **{f"usd_per_hour_{store}": a * p["A"] + b * p["B"] if store in stores else None
               for store, p in PRICES.items()},
        })  # fmt: skip
    return out


# --------------------------------------------------------------------------- the section


def bench_capacity(quick: bool) -> dict[str, Any]:
    """The searches (ttl 5 only when quick), the real-time confirmation at ttl 5, and the costs."""
    ttls = (5.0,) if quick else (5.0, 30.0, 60.0)
    found = []
    for ttl in ttls:
        t0 = time.monotonic()
        found.append({**search(ttl), "search_s": round(time.monotonic() - t0, 1)})
    first = found[0]
    confirmed = [confirm(first["healthy"], 5.0)] + ([] if quick else [confirm(first["with_margin"], 5.0)])
    return {"capacity": found, "confirm": confirmed, "costs": costs()}


def report(r: dict[str, Any]) -> list[str]:
    """The section's lines in the printed table."""
    L = ["", "Capacity: locks one process keeps at 50 ms per request, GCS's write spacing, all taken at once",
         "  (searched on simulated time: the real lock and scheduler; planning and the interpreter cost nothing there)",
         f"  {'ttl s':>6} {'renew s':>8} {'deadline s':>11} {'workers':>8} {'healthy':>8} {'no warning':>11} {'probes':>7} {'search s':>9}"]  # fmt: skip
    for c in r["capacity"]:
        L.append(f"  {c['ttl_s']:>6g} {c['renew_interval_s']:>8g} {c['renew_deadline_s']:>11g} {c['io_workers']:>8} "
                 f"{c['healthy']:>8} {c['with_margin']:>11} {len(c['probes']):>7} {c['search_s']:>9}")
    L.append("  the same counts at ttl 5 in real time (file://, every request held 50 ms, this machine):")
    for c in r["confirm"]:
        L.append(f"    {c['locks']} locks: {c['lost']} leases lost, warned {'yes' if c['warned'] else 'no'}, "
                 f"worst renewal lateness {c['worst_share']:.0%} of its margin, CPU {c['cpu_percent']}%")
    L += ["", "Cost per lock-hour at list prices (GCS Standard; S3 Standard): Class A = writes, listings; B = reads",
          f"  {'lock':<58} {'A/h':>7} {'B/h':>7} {'GCS $/h':>9} {'S3 $/h':>9}"]
    for c in r["costs"]:
        s3 = "-" if c["usd_per_hour_s3"] is None else f"{c['usd_per_hour_s3']:.5f}"
        L.append(f"  {c['lock']:<58} {c['class_a_per_hour']:>7g} {c['class_b_per_hour']:>7g} "
                 f"{c['usd_per_hour_gcs']:>9.5f} {s3:>9}")
    return L


def main(argv: list[str] | None = None) -> int:
    """``scripts/bench --only capacity``: run the section, print it (and write ``--json``)."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description="capacity and cost per lock-hour")
    parser.add_argument("--quick", action="store_true", help="ttl 5 only, one confirmation")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("handofflock").setLevel(logging.CRITICAL)  # the probes past capacity lose leases by design
    r = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **bench_capacity(args.quick)}
    print("\n".join(report(r)))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2) + "\n")
    return 0
