#!/usr/bin/env python3
"""The network test bed: real processes in network namespaces of their own, a faulty network,
frozen processes and skewed clocks, and an offline check of a fenced resource's history.

    sudo python scripts/netbed.py --seconds 25          # a short run (part of the test suite)
    sudo python scripts/netbed.py --long --json out.json  # five minutes, with a summary
    sudo python scripts/netbed.py --seconds 25 --fence-bug accept-stale     # must FAIL
    sudo python scripts/netbed.py --seconds 25 --plant heir-keeps-old-token  # must FAIL

Needs root (``ip netns``, veth pairs, a bridge, ``tc``). It makes, with names
that carry its process id (``hlnb-PID-*`` namespaces, ``hnPID*`` links):

* a bridge in the root namespace on a private ``10.N.0.0/24``, the bed's own view;
* a namespace for the store: fake-gcs-server (the project's emulator helper,
  bound to all of that namespace's addresses) on ``10.N.0.2``;
* a namespace for the fenced resource (``scripts/netbed_fence.py``) on ``10.N.0.3``;
* one namespace per party (``scripts/netbed_worker.py``) on the bridge, and with a
  veth pair of its own straight to the store's namespace, ``10.N.(10+i).0/24``:
  the party reaches the store over that link only, so a fault on it is a fault
  between that party and the store, and nothing else.

While the parties acquire, write to the fence with their token, hold, and release
(a handoff when a waiter is there), each on a clock offset within ``±skew/2``:

* a link nemesis changes, at random, the faults on one party's store link, both
  ways: partitions (every packet dropped, for up to three ttls), and with the
  kernel's netem, delay with jitter, loss and duplication;
* a pauser freezes a party with SIGSTOP (some pauses longer than the ttl; the
  first ``--late-writes`` hold a party that is past its check, about to write,
  until another party's write has been accepted, so its write is certainly late);
* a sampler reads the lock object over the bridge.

At the end ``scripts/netbed_check.py`` checks the fence's history against what the
parties were told and what the lock said. A summary is printed, ``--json`` written,
and the exit status is 0 (passed), 1 (a violation) or 77 (the kernel or the user
refused what the bed needs: the reason is printed). Whatever happens, the
processes are stopped and the namespaces and links deleted; a run also deletes
those of earlier runs whose process is gone.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import netbed_check  # noqa: E402
from harness import STARTUP_LIMIT, Workers, drive  # noqa: E402

from handofflock.storage.gcs import GCSStorage  # noqa: E402
from handofflock.testing.emulator import FakeGCSServer, _binary_path  # noqa: E402

BUCKET = "netbed"
LOCK_KEY = "netbed/lock.json"
PREFIX = "hlnb-"
STORE_PORT, FENCE_PORT = 4443, 8080
#: A qdisc that drops every packet (no packet fits a 10-byte bucket): a partition without netem.
DROP_ALL = "tbf rate 8bit burst 10 limit 1"


class Refused(Exception):
    """The kernel or the user refused something the bed needs (the run is skipped, not failed)."""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def refusal() -> str | None:
    """Why the bed cannot run here (not root, no ``ip``, namespaces, veth or a bridge refused), else None."""
    if os.geteuid() != 0:
        return "the network test bed needs root (ip netns, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the network test bed needs {tool!r} (iproute2)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    link = f"hn{os.getpid()}q"
    try:
        for argv in (
            ("ip", "netns", "add", probe),
            ("ip", "link", "add", link, "type", "veth", "peer", "name", link + "p"),
            ("ip", "link", "set", link + "p", "netns", probe),
            ("ip", "link", "add", link + "b", "type", "bridge"),
        ):
            proc = sh(*argv, check=False)
            if proc.returncode != 0:
                return f"the kernel refused `{' '.join(argv)}`: {proc.stderr.strip()}"
    finally:
        sh("ip", "link", "del", link, check=False)
        sh("ip", "link", "del", link + "b", check=False)
        sh("ip", "netns", "del", probe, check=False)
    return None


def netem_refusal(ns: str) -> str | None:
    """Why netem cannot be used in namespace ``ns`` (then partitions use a drop-all qdisc instead), else None."""
    proc = sh("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", check=False)
    sh("tc", "-n", ns, "qdisc", "del", "dev", "lo", "root", check=False)
    return None if proc.returncode == 0 else f"tc netem refused by the kernel: {proc.stderr.strip()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> None:
    """SIGKILL what still runs in ``ns``, then delete it (its veth ends, and so their peers, go with it)."""
    pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    sh("ip", "netns", "del", ns, check=False)


def clean_stale() -> list[str]:
    """Delete the namespaces, bridges and links of earlier runs whose process is gone; returns their names."""
    gone = []
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{PREFIX}(\d+)-\w+", name)
        if m and not _alive(int(m.group(1))):
            _kill_namespace(name)
            gone.append(name)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():  # bridges, and veths a failed run left
        m = re.match(r"\d+: (hn(\d+)(?:br|s|f|b\d+|x\d+[ab]))[:@]", line)  # the names Network gives
        if m and not _alive(int(m.group(2))):
            sh("ip", "link", "del", m.group(1), check=False)
            gone.append(m.group(1))
    return gone


class NamespacedGCS(FakeGCSServer):
    """fake-gcs-server started inside a network namespace, listening on all of its addresses."""

    def __init__(self, netns: str, address: str) -> None:
        super().__init__(port=STORE_PORT, startup_timeout=30.0)
        self.netns, self.address = netns, address

    @property
    def url(self) -> str:
        return f"http://{self.address}:{STORE_PORT}"

    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        options = [
            "-scheme",
            "http",
            "-backend",
            "memory",
            "-host",
            "0.0.0.0",
            "-port",
            str(STORE_PORT),
            "-external-url",
            self.url,
            "-log-level",
            self.log_level,
        ]
        return self._spawn(["ip", "netns", "exec", self.netns, str(_binary_path()), *options], log)


class Network:
    """The bridge, the namespaces and the links of one run, named after this process; ``down()`` deletes them."""

    def __init__(self, parties: int) -> None:
        self.id = os.getpid()
        self.parties = parties
        self.bridge = f"hn{self.id}br"
        self.store_ns, self.fence_ns = f"{PREFIX}{self.id}-store", f"{PREFIX}{self.id}-fence"
        self.party_ns = [f"{PREFIX}{self.id}-p{i}" for i in range(parties)]
        self.net = self._free_net()
        self.made: list[str] = []

    @staticmethod
    def _free_net() -> int:
        # Taken: a 10.N on any address here, or any route into a 10.N (a VPN's, say, with no local address).
        used = set(re.findall(r"inet 10\.(\d+)\.", sh("ip", "-4", "-o", "addr", check=False).stdout))
        used |= set(re.findall(r"^10\.(\d+)\.", sh("ip", "-4", "route", check=False).stdout, re.M))
        start = 100 + os.getpid() % 150
        for n in [*range(start, 250), *range(100, start)]:
            if str(n) not in used:
                return n
        raise Refused("no free 10.N.0.0/16 for the bed's addresses")

    def addr(self, host: int, subnet: int = 0) -> str:
        return f"10.{self.net}.{subnet}.{host}"

    def store_link(self, i: int) -> tuple[str, str]:
        """The party's and the store's address on party ``i``'s own link to the store."""
        return self.addr(2, 10 + i), self.addr(1, 10 + i)

    def up(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(self.bridge)
        sh("ip", "addr", "add", f"{self.addr(1)}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        self._join(self.store_ns, "s", self.addr(2))
        self._join(self.fence_ns, "f", self.addr(3))
        for i, ns in enumerate(self.party_ns):
            self._join(ns, f"b{i}", self.addr(10 + i))
            mine, store = self.store_link(i)
            self._pair(ns, "st", mine, self.store_ns, f"p{i}", store, f"x{i}")

    def _join(self, ns: str, tag: str, address: str) -> None:
        sh("ip", "netns", "add", ns)
        self.made.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        host = f"hn{self.id}{tag}"
        sh("ip", "link", "add", host, "type", "veth", "peer", "name", host + "i")
        self.made.append(host)  # deleted by down() even if a step below fails (its peer goes with it)
        sh("ip", "link", "set", host + "i", "netns", ns)
        self._name(ns, host + "i", "eth0", f"{address}/24")
        sh("ip", "link", "set", host, "master", self.bridge)
        sh("ip", "link", "set", host, "up")

    def _pair(self, ns_a: str, name_a: str, addr_a: str, ns_b: str, name_b: str, addr_b: str, tag: str) -> None:
        a, b = f"hn{self.id}{tag}a", f"hn{self.id}{tag}b"
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        self.made.append(a)  # in the root namespace until moved: deleted by down() if a move fails
        sh("ip", "link", "set", a, "netns", ns_a)
        sh("ip", "link", "set", b, "netns", ns_b)
        self._name(ns_a, a, name_a, f"{addr_a}/24")
        self._name(ns_b, b, name_b, f"{addr_b}/24")

    @staticmethod
    def _name(ns: str, dev: str, name: str, cidr: str) -> None:
        sh("ip", "-n", ns, "link", "set", dev, "name", name)
        sh("ip", "-n", ns, "addr", "add", cidr, "dev", name)
        sh("ip", "-n", ns, "link", "set", name, "up")

    def link_ends(self, i: int) -> list[tuple[str, str]]:
        """Both ends of party ``i``'s store link, as (namespace, device)."""
        return [(self.party_ns[i], "st"), (self.store_ns, f"p{i}")]

    def down(self) -> None:
        for name in reversed(self.made):
            if name.startswith(PREFIX):
                _kill_namespace(name)
            else:
                sh("ip", "link", "del", name, check=False)
        self.made.clear()


class Run(Workers):
    def __init__(self, a: argparse.Namespace, workdir: Path) -> None:
        super().__init__(workdir, "parties", LOCK_KEY)
        self.a = a
        self.rng = random.Random(a.seed)
        self.offsets: dict[str, float] = {}
        self.pauses: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.netem_refused: str | None = None  # why netem is refused, if it is
        self.history_path = workdir / "fence.jsonl"

    def go(self) -> dict[str, Any]:
        a = self.a
        stale = clean_stale()
        net = Network(a.parties)
        self.net = net
        atexit.register(net.down)
        fence: subprocess.Popen[bytes] | None = None
        started = time.time()
        try:
            net.up()
            self.netem_refused = netem_refusal(net.store_ns)
            with NamespacedGCS(net.store_ns, net.addr(2)) as server:
                server.create_bucket(BUCKET)
                with server.env():
                    self.direct = GCSStorage(BUCKET)  # the bed's own view, over the bridge: never faulted
                fence = self.start_fence(net)
                self.start_workers(net)
                threads = [
                    threading.Thread(target=self.reported, args=(t,), daemon=True)
                    for t in (self.pauser, self.nemesis, self.sampler)
                ]
                try:
                    self.wait_for_workers()
                    for t in threads:
                        t.start()
                    self.wait_until(time.time() + a.duration)
                finally:  # interrupted or not, no party is left frozen or running, no link faulty
                    self.done.set()
                    for t in threads:
                        if t.ident is not None:
                            t.join(30)
                    for i in range(a.parties):
                        self.clear_link(i)
                    exits = self.stop_workers()
        finally:
            if fence is not None:
                fence.terminate()
                try:
                    fence.wait(10)
                except subprocess.TimeoutExpired:
                    fence.kill()
            net.down()
            atexit.unregister(net.down)
        return self.report(exits, time.time() - started, stale)

    def start_fence(self, net: Network) -> subprocess.Popen[bytes]:
        cmd = [
            "ip",
            "netns",
            "exec",
            net.fence_ns,
            sys.executable,
            str(HERE / "netbed_fence.py"),
            "--port",
            str(FENCE_PORT),
            "--history",
            str(self.history_path),
            *(["--bug", self.a.fence_bug] if self.a.fence_bug else []),
        ]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"the fence server did not start: {line + proc.stdout.read(4000)!r}")
        return proc

    def start_workers(self, net: Network) -> None:
        a = self.a
        deadline = time.time() + STARTUP_LIMIT + a.duration + 120
        for i, ns in enumerate(net.party_ns):
            name = f"p{i}"
            self.offsets[name] = round(self.rng.uniform(-a.skew / 2, a.skew / 2), 4)
            env = dict(
                os.environ,
                STORAGE_EMULATOR_HOST=f"http://{net.store_link(i)[1]}:{STORE_PORT}",
                PYTHONUNBUFFERED="1",
                NO_PROXY="*",
                no_proxy="*",
            )
            cmd = [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                str(HERE / "netbed_worker.py"),
                "--index",
                str(i),
                "--bucket",
                BUCKET,
                "--key",
                LOCK_KEY,
                "--fence",
                f"{net.addr(3)}:{FENCE_PORT}",
                "--dir",
                str(self.dir),
                "--seed",
                str(a.seed),
                "--ttl",
                str(a.ttl),
                "--skew",
                str(a.skew),
                "--offset",
                str(self.offsets[name]),
                "--hold-ms",
                str(a.hold_ms),
                "--unchecked",
                str(a.unchecked),
                "--deadline",
                str(deadline),
                *[arg for plant in a.plant for arg in ("--plant", plant)],
            ]
            self.start(name, cmd, env)

    # -- the nemeses ----------------------------------------------------------------

    def set_link(self, i: int, spec: str) -> None:
        for ns, dev in self.net.link_ends(i):
            sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *spec.split())

    def clear_link(self, i: int) -> None:
        for ns, dev in self.net.link_ends(i):
            sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)

    def nemesis(self) -> None:
        """Now and then, fault one party's store link (both ways) for a while, then heal it."""
        a, rng = self.a, random.Random(f"{self.a.seed}:nemesis")
        kinds = ["partition"] + ([] if self.netem_refused else ["delay", "loss", "duplicate", "mixed"])
        order: list[str] = []
        while not self.done.wait(rng.expovariate(1.0 / a.fault_every)):
            if not order:  # every kind once per round, in a random order: a short run meets them all
                order = rng.sample(kinds, len(kinds))
            i, kind = rng.randrange(a.parties), order.pop()
            if kind == "partition":
                seconds = rng.uniform(0.3, 3.0) * a.ttl
                spec = DROP_ALL if self.netem_refused else "netem loss 100%"
            else:
                seconds = rng.uniform(1.0, 4.0)
                delay, loss, dup = rng.randint(20, 400), rng.randint(5, 40), rng.randint(5, 40)
                spec = {
                    "delay": f"netem delay {delay}ms {delay // 4}ms",
                    "loss": f"netem loss {loss}%",
                    "duplicate": f"netem duplicate {dup}%",
                    "mixed": f"netem delay {delay}ms {delay // 4}ms loss {loss // 2}% duplicate {dup // 2}%",
                }[kind]
            began = time.time()
            try:
                self.set_link(i, spec)
            except RuntimeError as exc:
                self.errors.append(f"nemesis: {exc}")
                continue
            self.done.wait(seconds)
            self.clear_link(i)
            self.faults.append(
                {
                    "party": f"p{i}",
                    "kind": kind,
                    "qdisc": spec,
                    "start": began,
                    "seconds": round(time.time() - began, 3),
                }
            )

    def pauser(self) -> None:
        """SIGSTOP a party now and then; the first --late-writes pauses hold one that is about to write."""
        a, rng = self.a, random.Random(f"{self.a.seed}:pauser")
        names = sorted(self.procs)
        late_left = a.late_writes
        while not self.done.wait(rng.expovariate(1.0 / a.pause_every)):
            late = late_left > 0
            name = rng.choice(names)
            long = late or rng.random() < a.long_pauses
            seconds = rng.uniform(1.5 * a.ttl, 3.0 * a.ttl) if long else rng.uniform(0.02, 0.4 * a.ttl)
            # A late write: the party stops itself past its check, before its write (at its next one).
            if not (self.hold(name, 4 * a.ttl) if late else self.freeze(name)):
                continue
            began, mark = time.time(), self.history_size()
            self.done.wait(seconds)
            stale = False
            if late:  # until a write with a higher token is accepted: the held one's is then certainly stale
                token = [e for e in self.read_log(name) if e["ev"] == "held"][-1]["token"]
                give_up = time.monotonic() + 10 * a.ttl
                while not (stale := self.accepted_since(mark, token)) and time.monotonic() < give_up:
                    if self.done.wait(0.01):
                        break
                late_left -= stale
            self.thaw(name)
            self.pauses.append(
                {
                    "party": name,
                    "start": began,
                    "seconds": round(time.time() - began, 3),
                    "long": long,
                    "late_write": stale,
                }
            )

    def history_size(self) -> int:
        return self.history_path.stat().st_size if self.history_path.exists() else 0

    def accepted_since(self, offset: int, above: int) -> bool:
        """Whether the fence accepted a write with a token above ``above`` after ``offset`` in its history."""
        with open(self.history_path, "rb") as f:
            f.seek(offset)
            return any(
                e["accepted"] and e["token"] > above
                for e in (json.loads(line) for line in f.read().splitlines() if line.strip())
            )

    # -- the verdict -----------------------------------------------------------------

    def report(self, exits: dict[str, int | None], elapsed: float, stale: list[str]) -> dict[str, Any]:
        a = self.a
        logs = {name: self.read_log(name) for name in self.procs}
        history = [json.loads(line) for line in self.history_path.read_bytes().splitlines() if line.strip()]
        acks: dict[str, str] = {}
        acquisitions, handoffs, lost = [], 0, 0
        for name, events in logs.items():
            for ev in events:
                if ev["ev"] == "sending":
                    acks.setdefault(ev["op"], "unknown")  # a party stopped before the answer came
                elif ev["ev"] == "write":
                    acks[ev["op"]] = ev["outcome"]
                elif ev["ev"] == "acquired":
                    acquisitions.append((name, ev["token"]))
                elif ev["ev"] == "released" and ev.get("heir"):
                    handoffs += 1
                elif ev["ev"] == "lost":
                    lost += 1
                elif ev["ev"] == "fatal":
                    self.errors.append(f"{name} died with an untyped {ev['error']}: {ev['msg']}\n{ev.get('tb', '')}")
        for name, code in sorted(exits.items()):
            if code != 0:
                self.errors.append(
                    f"{name} exited with status {code}: {(self.dir / f'{name}.stderr').read_text()[-2000:]}"
                )
        checks = netbed_check.check(history, acks, acquisitions, self.samples)
        checks["the_bed_ran_cleanly"] = netbed_check._result(self.errors, len(exits))
        outcomes = {k: sum(1 for o in acks.values() if o == k) for k in ("accepted", "refused", "unknown")}
        fault_kinds: dict[str, int] = {}
        for f in self.faults:
            fault_kinds[f["kind"]] = fault_kinds.get(f["kind"], 0) + 1
        return {
            "ok": all(c["ok"] for c in checks.values()),
            "command": " ".join(["python", "scripts/netbed.py", *sys.argv[1:]]),
            "seed": a.seed,
            "config": {
                "parties": a.parties,
                "seconds": a.duration,
                "ttl": a.ttl,
                "max_clock_skew": a.skew,
                "hold_ms_mean": a.hold_ms,
                "unchecked_fraction": a.unchecked,
                "pause_every": a.pause_every,
                "long_pause_fraction": a.long_pauses,
                "late_writes": a.late_writes,
                "fault_every": a.fault_every,
                "plant": a.plant,
                "fence_bug": a.fence_bug,
                "clock_offsets": self.offsets,
            },
            "netem": f"unavailable ({self.netem_refused}): partitions only" if self.netem_refused else "available",
            "stale_cleaned": stale,
            "elapsed_seconds": round(elapsed, 1),
            "acquisitions": len(acquisitions),
            "handoffs": handoffs,
            "lost_before_write": lost,
            "fence_writes": outcomes,
            "fence_history": len(history),
            "faults": {
                "count": len(self.faults),
                "by_kind": fault_kinds,
                "seconds": round(sum(f["seconds"] for f in self.faults), 1),
                "log": self.faults,
            },
            "pauses": {
                "count": len(self.pauses),
                "longer_than_ttl": sum(1 for p in self.pauses if p["long"]),
                "late_writes": sum(1 for p in self.pauses if p["late_write"]),
                "log": self.pauses,
            },
            "lock_samples": len(self.samples),
            "exits": exits,
            "checks": checks,
        }


def summary(r: dict[str, Any]) -> str:
    w = r["fence_writes"]
    rows = [
        ("seed", r["seed"]),
        ("parties", r["config"]["parties"]),
        ("elapsed (s)", r["elapsed_seconds"]),
        ("netem", r["netem"]),
        ("acquisitions", r["acquisitions"]),
        ("  handed off to a waiter", r["handoffs"]),
        ("  stopped by check() (LockLost)", r["lost_before_write"]),
        ("fence writes accepted", w["accepted"]),
        ("  refused (stale token)", w["refused"]),
        ("  outcome unknown", w["unknown"]),
        ("link faults", r["faults"]["count"]),
        *[(f"  {k}", v) for k, v in sorted(r["faults"]["by_kind"].items())],
        ("  seconds faulted", r["faults"]["seconds"]),
        ("pauses (SIGSTOP)", r["pauses"]["count"]),
        ("  longer than the ttl", r["pauses"]["longer_than_ttl"]),
        ("  held for a late write", r["pauses"]["late_writes"]),
        ("lock object samples", r["lock_samples"]),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows] + [""]
    for name, res in r["checks"].items():
        lines.append(f"{'ok  ' if res['ok'] else 'FAIL'} {name} ({res['count']})")
        lines += [f"       {v}" for v in res["violations"][:5]]
    lines.append("PASSED" if r["ok"] else "FAILED")
    return "\n".join(lines)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parties", type=int, default=3)
    length = p.add_mutually_exclusive_group()
    length.add_argument("--seconds", type=float)
    length.add_argument("--minutes", type=float)
    length.add_argument("--long", action="store_true", help="five minutes")
    p.add_argument("--seed", type=int, default=None, help="default: random (printed, and in the JSON)")
    p.add_argument("--ttl", type=float, default=1.0, help="lease (s); renew every ttl/10, renew_deadline ttl/2")
    p.add_argument("--skew", type=float, default=0.2, help="max_clock_skew (s); party clocks are offset within ±skew/2")
    p.add_argument("--hold-ms", type=float, default=50.0, help="mean hold between a party's two writes (ms)")
    p.add_argument("--unchecked", type=float, default=0.3, help="fraction of holds that write without check()")
    p.add_argument("--pause-every", type=float, default=2.0, help="mean seconds between SIGSTOP pauses")
    p.add_argument("--long-pauses", type=float, default=0.3, help="fraction of pauses longer than the ttl")
    p.add_argument(
        "--late-writes",
        type=int,
        default=2,
        help="pauses that hold a party about to write until "
        "another's write is accepted (so the fence is certainly tested)",
    )
    p.add_argument("--fault-every", type=float, default=2.0, help="mean seconds between link faults")
    p.add_argument(
        "--plant",
        action="append",
        default=[],
        metavar="BUG",
        help="plant a buggify bug in every party (handofflock.testing.sim.bugs.BUGS); the run must FAIL",
    )
    p.add_argument("--fence-bug", choices=["accept-stale"], help="a fence that accepts every token; the run must FAIL")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument(
        "--dir", type=Path, help="keep the logs and the fence's history here (default: a temporary directory)"
    )
    a = p.parse_args(argv)
    a.duration = (
        a.seconds if a.seconds is not None else 60.0 * (a.minutes if a.minutes is not None else 5.0 if a.long else 0.5)
    )
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(2**31)
    if a.parties < 2 or a.parties > 50 or a.duration <= 0 or a.ttl <= 0:
        p.error("need 2 to 50 --parties, a positive duration and ttl")
    return a


def main(argv: list[str]) -> int:
    a = parse(argv)
    reason = refusal()
    if reason is not None:
        print(f"netbed: skipped: {reason}", flush=True)
        return 77
    print(f"netbed: {a.parties} parties for {a.duration:.0f} s, seed {a.seed}", flush=True)
    return drive("netbed", a, lambda workdir: Run(a, workdir).go(), summary)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
