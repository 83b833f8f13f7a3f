#!/usr/bin/env python3
"""Torture the lock: N processes contend through a fault-injecting proxy while being frozen at random.

    python scripts/torture.py --seconds 40               # a short run (part of the test suite)
    python scripts/torture.py --minutes 10 --json out.json
    python scripts/torture.py --seconds 40 --storage s3  # the S3 backend, on moto's server

Starts fake-gcs-server (FakeGCSServer), or with ``--storage s3`` moto's S3
server (MotoS3Server), and a FaultProxy in front of it, then
``--workers`` processes (``scripts/torture_worker.py``) that acquire the lock,
claim a fenced journal, append their critical section to it and release, over
and over, each on a clock offset by up to ``--skew``/2. Meanwhile:

* the proxy injects every fault it knows, at the given rates: requests applied
  whose reply is lost, resets, delays, 429s, 503s, refused connections;
* a pauser freezes workers with SIGSTOP (some pauses longer than the ttl),
  half of them aimed at a worker inside its critical section;
* a sampler records the lock object's history, and an archiver moves the
  journal's entries out of the fenced object (one generation-matched write
  that keeps the fence fields) so the object stays small.

When the time is up the workers are stopped and ``scripts/torture_check.py``
checks the journal, the workers' logs and the lock's history. Prints a summary,
writes ``--json``, and exits 1 on any violation (0 otherwise).

The emulator run uses ``--min-write-interval 0``: real GCS allows about one
write per second per object, which would cap the run at a fraction of a
critical section per second.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torture_check  # noqa: E402
from harness import STARTUP_LIMIT, Workers, drive  # noqa: E402

from handofflock.storage.gcs import GCSStorage  # noqa: E402
from handofflock.testing import FakeGCSServer, FaultProxy  # noqa: E402

BUCKET = "torture"
LOCK_KEY = "torture/lock.json"
JOURNAL_KEY = "torture/journal.json"
WORKING, WRITING = 3, 4  # torture_worker's phases


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--storage", choices=["gcs", "s3"], default="gcs",
                   help="the backend: GCS on fake-gcs-server, or S3 on moto's server (needs the test extra)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--seconds", type=float)
    length.add_argument("--minutes", type=float)
    p.add_argument("--seed", type=int, default=None, help="default: random (printed, and in the JSON)")
    p.add_argument("--ttl", type=float, default=1.0, help="lease (s); renew every ttl/10, renew_deadline ttl/2")
    p.add_argument("--skew", type=float, default=0.2, help="max_clock_skew (s); worker clocks are offset within ±skew/2")
    p.add_argument("--poll", type=float, default=0.02, help="waiter_poll_interval (s)")
    p.add_argument("--work-ms", type=float, default=5.0, help="mean work inside a critical section (ms)")
    p.add_argument("--unchecked", type=float, default=0.3, help="fraction of sections that skip check() before writing")
    p.add_argument("--min-write-interval", type=float, default=0.0)
    p.add_argument("--drop", type=float, default=0.01, help="P(request applied, reply lost)")
    p.add_argument("--reset", type=float, default=0.005, help="P(connection reset before forwarding)")
    p.add_argument("--delay", type=float, default=0.005, help="P(request delayed up to --max-delay)")
    p.add_argument("--max-delay", type=float, default=0.3, help="longest injected delay (s)")
    p.add_argument("--throttle", type=float, default=0.0003, help="P(429 with Retry-After 0-1 s)")
    p.add_argument("--unavailable", type=float, default=0.003, help="P(503)")
    p.add_argument("--refuse-per-minute", type=float, default=2.0, help="refusal windows (0.05-0.3 s) per minute")
    p.add_argument("--pause-every", type=float, default=4.0, help="mean seconds between SIGSTOP pauses")
    p.add_argument("--long-pauses", type=float, default=0.3, help="fraction of pauses longer than the ttl")
    p.add_argument("--aimed-pauses", type=float, default=0.6,
                   help="fraction of pauses aimed at a holder in its work or past its final check")
    p.add_argument("--aim-write", type=float, default=0.7,
                   help="of the aimed pauses, the fraction aimed past the final check (the rest: in the work)")
    p.add_argument("--late-writes", type=int, default=0,
                   help="make the first N pauses hold a worker past its final check until another worker has "
                        "claimed the journal, so that its write is certainly late (a run that must test the fence)")
    p.add_argument("--sabotage", choices=["check"],
                   help="run broken workers on purpose: 'check' makes lock.check() never raise (the run must FAIL)")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--dir", type=Path, help="keep the workers' logs here (default: a temporary directory)")
    a = p.parse_args(argv)
    a.duration = a.seconds if a.seconds is not None else 60.0 * (a.minutes if a.minutes is not None else 1.0)
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(2**31)
    if a.workers < 2 or a.duration <= 0 or a.ttl <= 0:
        p.error("need --workers >= 2, a positive duration and ttl")
    return a


class Run(Workers):
    def __init__(self, a: argparse.Namespace, workdir: Path) -> None:
        super().__init__(workdir, "workers", LOCK_KEY)
        self.a = a
        self.rng = random.Random(a.seed)
        self.offsets: dict[str, float] = {}
        self.pauses: list[dict] = []
        self.archive: list[dict] = []
        self.archive_writes = 0

    # -- the run ----------------------------------------------------------------

    def go(self) -> dict:
        a = self.a
        started = time.time()
        if a.storage == "s3":
            from handofflock.storage.s3 import S3Storage
            from handofflock.testing.s3server import MotoS3Server

            server: Any = MotoS3Server()
        else:
            server = FakeGCSServer()
        with server, FaultProxy(server.url, seed=a.seed, lifetime=a.duration + 300, history=1000, dialect=a.storage) as proxy:
            server.create_bucket(BUCKET)
            if a.storage == "s3":
                with server.env():  # the harness's own view, not through the proxy
                    self.direct = S3Storage(BUCKET, endpoint_url=server.url)
                    self.direct.client  # made now, with the test credentials the block sets
                    env = dict(os.environ, AWS_ENDPOINT_URL_S3=proxy.url, PYTHONUNBUFFERED="1")
            else:
                with server.env():
                    self.direct = GCSStorage(BUCKET)  # the harness's own view, not through the proxy
                env = dict(os.environ, STORAGE_EMULATOR_HOST=proxy.url, PYTHONUNBUFFERED="1")
            proxy.chaos(
                {
                    "drop_reply": a.drop, "reset": a.reset, "delay": a.delay, "429": a.throttle,
                    "503": a.unavailable, "refuse": a.refuse_per_minute / 60.0,
                },
                seed=a.seed, delay=(0.01, a.max_delay), retry_after=(0.0, 1.0), refuse_window=(0.05, 0.3),
            )
            self.make_phases(a.workers)
            # Workers stop themselves after this, whatever happens (their start, bounded below, included).
            deadline = time.time() + STARTUP_LIMIT + a.duration + 120
            for i in range(a.workers):
                name = f"w{i}"
                self.offsets[name] = round(self.rng.uniform(-a.skew / 2, a.skew / 2), 4)
                cmd = [
                    sys.executable, str(HERE / "torture_worker.py"), "--index", str(i), "--storage", a.storage, "--bucket", BUCKET,
                    "--key", LOCK_KEY, "--dir", str(self.dir), "--seed", str(a.seed), "--ttl", str(a.ttl),
                    "--skew", str(a.skew), "--offset", str(self.offsets[name]), "--poll", str(a.poll),
                    "--work-ms", str(a.work_ms), "--unchecked", str(a.unchecked),
                    "--min-write-interval", str(a.min_write_interval), "--deadline", str(deadline),
                    *(["--sabotage", a.sabotage] if a.sabotage else []),
                ]
                self.start(name, cmd, env)
            threads = [threading.Thread(target=self.reported, args=(t,), daemon=True) for t in (self.pauser, self.sampler, self.archiver)]
            try:
                # The run's seconds count from when every worker is up (its imports done, its lock made):
                # on a loaded machine that takes seconds, which a short run would otherwise spend idle.
                self.wait_for_workers()
                for t in threads:
                    t.start()
                self.wait_until(time.time() + a.duration)
            finally:  # interrupted or not, no worker is left frozen or running
                self.done.set()
                for t in threads:
                    if t.ident is not None:
                        t.join(30)
                proxy.clear()  # no faults while the workers wind down
                exits = self.stop_workers()
            self.archive_once(final=True)
            proxy_stats = proxy.stats()
        elapsed = time.time() - started
        logs = {name: self.read_log(name) for name in self.procs}
        journal = self.archive
        results = torture_check.check(journal, logs, exits, self.samples)
        return self.report(results, logs, exits, journal, proxy_stats, elapsed)

    # -- the harness's threads --------------------------------------------------------

    def pauser(self) -> None:
        """SIGSTOP a worker now and then; aimed pauses wait for a holder in its work or past its check."""
        a, rng = self.a, random.Random(f"{self.a.seed}:pauser")
        phases = self.read_phases()
        names = sorted(self.procs)
        late_left = a.late_writes
        while not self.done.wait(rng.expovariate(1.0 / a.pause_every)):
            make_late = late_left > 0
            aimed = not make_late and rng.random() < a.aimed_pauses
            name = None
            if make_late:  # it stops itself past its check, before its section write (its next one)
                name = rng.choice(names)
            elif aimed:
                target = WRITING if rng.random() < a.aim_write else WORKING
                give_up = time.monotonic() + 2.0
                while name is None and time.monotonic() < give_up and not self.done.is_set():
                    in_phase = [n for i, n in enumerate(names) if phases[i] == target]
                    if in_phase:
                        name = rng.choice(in_phase)
                    else:
                        time.sleep(0.001)
                if name is None:
                    continue
            else:
                name = rng.choice(names)
            long = make_late or rng.random() < a.long_pauses
            # Long pauses outlast the lease with room for the next holder to take it and claim the journal.
            seconds = rng.uniform(1.6 * a.ttl, 3.0 * a.ttl) if long else rng.uniform(0.02, 0.4 * a.ttl)
            if not (self.hold(name, 4 * a.ttl) if make_late else self.freeze(name)):
                continue
            began = time.time()
            self.done.wait(seconds)
            stale = False
            if make_late:
                # Hold it until another worker is in its work: its claim, with a higher token, is in the
                # journal, so the paused worker's section write is certainly stale (bounded: a stuck run).
                others = [i for i, n in enumerate(names) if n != name]
                give_up = time.monotonic() + 10 * a.ttl
                while not any(phases[i] == WORKING for i in others) and time.monotonic() < give_up:
                    if self.done.wait(0.005):
                        break
                stale = any(phases[i] == WORKING for i in others)
                late_left -= stale
            self.thaw(name)
            self.pauses.append({"worker": name, "start": began, "seconds": round(time.time() - began, 3), "long": long, "aimed": aimed, "late_write": stale})

    def archiver(self) -> None:
        while not self.done.wait(1.0):
            self.archive_once()

    def archive_once(self, final: bool = False) -> None:
        """Move the journal's entries into the archive with one generation-matched write.

        The write keeps every field of the fence document (highest token,
        writer, recent nonces) and empties only the payload, so the fence works
        exactly as before; if a worker wrote in between, the write fails its
        precondition and nothing is archived this time.
        """
        for _ in range(20 if final else 1):
            try:
                found = self.direct.read(JOURNAL_KEY)
                if found is None:
                    return
                data, generation = found
                doc = orjson.loads(data)
                entries = doc.get("payload") or []
                if not entries:
                    return
                if final:  # nobody writes any more: read, do not rewrite
                    self.archive.extend(entries)
                    return
                doc["payload"] = []
                self.direct.write(JOURNAL_KEY, orjson.dumps(doc), if_generation_match=generation)
                self.archive.extend(entries)
                self.archive_writes += 1
                return
            except Exception as exc:  # PreconditionFailed: a worker wrote; try again next time
                if type(exc).__name__ != "PreconditionFailed":
                    self.errors.append(f"archiver: {exc!r}")
                if final:
                    time.sleep(0.1)
                    continue
                return

    # -- reporting ---------------------------------------------------------------

    def report(self, results, logs, exits, journal, proxy_stats, elapsed) -> dict:
        a = self.a
        tally = torture_check.tally(logs)
        sections = sum(1 for e in journal if e.get("k") == "s")
        if self.errors:
            results["harness"] = {"ok": False, "count": len(self.errors), "violations": self.errors[:20], "violation_count": len(self.errors)}
        ok = all(r["ok"] for r in results.values())
        pauses = self.pauses
        return {
            "ok": ok,
            "command": " ".join([Path(sys.executable).name, "scripts/torture.py", *sys.argv[1:]]),
            "seed": a.seed,
            "commit": _commit(),
            "config": {
                "workers": a.workers, "seconds": a.duration, "ttl": a.ttl, "renew_interval": a.ttl / 10,
                "renew_deadline": a.ttl / 2, "max_clock_skew": a.skew, "waiter_poll_interval": a.poll,
                "work_ms_mean": a.work_ms, "unchecked_fraction": a.unchecked,
                "min_write_interval": a.min_write_interval, "sabotage": a.sabotage, "storage": a.storage,
                "fault_rates": {"drop_reply": a.drop, "reset": a.reset, "delay": a.delay, "max_delay": a.max_delay, "429": a.throttle,
                                "503": a.unavailable, "refuse_windows_per_minute": a.refuse_per_minute},
                "pause_every": a.pause_every, "long_pause_fraction": a.long_pauses, "aimed_pause_fraction": a.aimed_pauses,
                "aimed_past_check_fraction": a.aim_write,
                "clock_offsets": self.offsets,
            },
            "elapsed_seconds": round(elapsed, 1),
            "critical_sections": sections,
            "sections_per_second": round(sections / max(a.duration, 1e-9), 2),
            "refused_stale_writes": results["stale_writes_were_refused"]["count"],
            "violations": sum(r.get("violation_count", 0) for r in results.values()),
            "proxy": proxy_stats,
            "pauses": {
                "count": len(pauses),
                "longer_than_ttl": sum(1 for p in pauses if p["long"]),
                "aimed_at_a_section": sum(1 for p in pauses if p["aimed"]),
                "longest_seconds": max((p["seconds"] for p in pauses), default=0.0),
                "log": pauses,
            },
            "lock_history_samples": len(self.samples),
            "journal": {"entries": len(journal), "archive_writes": self.archive_writes},
            "workers": tally,
            "exits": exits,
            "checks": results,
        }


def summary(r: dict) -> str:
    c = r["workers"]["counts"]
    faults = r["proxy"]["faults"]
    rows = [
        ("seed", r["seed"]),
        ("elapsed (s)", r["elapsed_seconds"]),
        ("critical sections (journal)", r["critical_sections"]),
        ("  per second", r["sections_per_second"]),
        ("acquisitions", c.get("acquisitions", 0)),
        ("  handed off to the waiter", c.get("handoffs_to_waiter", 0)),
        ("refused stale writes", r["refused_stale_writes"]),
        ("  claims / sections", f"{c.get('write_c_refused', 0)} / {c.get('write_s_refused', 0)}"),
        ("stopped by check() (LockLost)", sum(r["workers"]["errors"].get("lost_before_write", {}).values())),
        ("requests through the proxy", r["proxy"]["requests"]),
        ("faults injected", sum(faults.values())),
        *[(f"  {k}", v) for k, v in faults.items()],
        ("pauses (SIGSTOP)", r["pauses"]["count"]),
        ("  longer than the ttl", r["pauses"]["longer_than_ttl"]),
        ("  aimed at a section", r["pauses"]["aimed_at_a_section"]),
        ("violations", r["violations"]),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("")
    for name, res in r["checks"].items():
        lines.append(f"{'ok  ' if res['ok'] else 'FAIL'} {name} ({res['count']})")
        for v in res["violations"][:5]:
            lines.append(f"       {v}")
    lines.append("PASSED" if r["ok"] else "FAILED")
    return "\n".join(lines)


def _commit() -> str | None:
    """The checkout's commit (with "+dirty" if it has changes), to say what was tortured."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def main(argv: list[str]) -> int:
    a = parse(argv)
    print(f"torture: {a.workers} workers for {a.duration:.0f} s, seed {a.seed}", flush=True)
    return drive("torture", a, lambda workdir: Run(a, workdir).go(), summary)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
