"""Swarm testing in the simulation: each seed turns fault classes and per-party settings on and off, and the
simulated clocks and store can do what real ones do (drift, steps, CLOCK_BOOTTIME through a suspend, slow
writes cut at their timeout that land later, GCS's one write a second); failures are grouped by signature."""

from __future__ import annotations

import logging
import random
from collections import Counter
from dataclasses import fields

import orjson
import pytest

import handofflock.testing.sim.__main__ as sim_main
from handofflock.core.clock import Clock
from handofflock.core.errors import TransientStorageError
from handofflock.storage import MemoryStorage
from handofflock.testing.sim.__main__ import Outcome, main, run_seed
from handofflock.testing.sim.bugs import planted
from handofflock.testing.sim.checker import KEY, Checker, Rules, read_record
from handofflock.testing.sim.faults import Faults, Net, SimStore
from handofflock.testing.sim.hub import MONO0, WALL0, Hub, Proc, SimClock, Violation
from handofflock.testing.sim.world import OLD_RECORDS, Config, Swarm, World, draw_config, old_record, with_swarm


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("handofflock").setLevel(logging.CRITICAL)
    yield
    logging.getLogger("handofflock").setLevel(logging.NOTSET)


def swarm_configs(n: int) -> list[Config]:
    return [with_swarm(draw_config(random.Random(seed)), seed) for seed in range(n)]


def test_each_seed_turns_fault_classes_and_per_party_settings_on_and_off():
    configs = swarm_configs(200)
    for f in fields(Swarm):
        values = Counter(bool(getattr(c.swarm, f.name)) for c in configs)
        assert values[True] > 5 and values[False] > 5, (f.name, values)
    for name in ("fail", "throttle", "lost_reply", "late_commit", "slow_read", "slow_write", "gcs_rate"):
        values = Counter(bool(getattr(c.faults, name)) for c in configs)
        assert values[True] > 5 and values[False] > 5, (name, values)
    real_rule = [c for c in configs if c.faults.burst_window == 1.0]
    assert real_rule and all(c.faults.gcs_rate for c in real_rule)
    assert {c.gentle for c in real_rule} == {True, False}
    assert {c.swarm.old_record for c in configs} >= set(OLD_RECORDS)


def test_a_gentle_world_keeps_only_survivable_faults_and_the_promised_timing():
    for c in swarm_configs(300):
        if c.gentle:
            f = c.faults
            assert not (f.fail or f.throttle or f.lost_reply or f.late_commit or f.slow_write)
            assert not (c.swarm.ttls or c.swarm.pacing)


def test_a_swarm_world_gives_each_party_its_own_settings():
    seed = next(s for s, c in enumerate(swarm_configs(200)) if c.swarm.ttls and c.swarm.waiter_ttls and c.swarm.pacing)
    world = World(seed)
    try:
        parties = [world.new_party() for _ in range(12)]
        timings = {(p.lock.timing.ttl, p.lock.timing.waiter_ttl, p.lock.timing.min_write_interval) for p in parties}
        assert len({t[0] for t in timings}) > 1 and len({t[1] / t[0] for t in timings}) > 1
        assert len({t[2] for t in timings}) > 1
    finally:
        world.close()


def clock(offset: float = 0.0) -> tuple[Hub, Proc, SimClock]:
    hub = Hub(random.Random(0))
    proc = Proc("p1")
    return hub, proc, SimClock(hub, proc, offset)


def test_boottime_runs_on_through_a_suspend_where_monotonic_time_stands():
    hub, proc, c = clock()
    assert c.boottime() == c.monotonic()  # a host without CLOCK_BOOTTIME: boot time is monotonic time
    c.boottime_runs = True
    proc.suspended_until, proc.suspended_for = hub.now + 5.0, 5.0
    hub.now += 5.0
    assert c.monotonic() == pytest.approx(MONO0)
    assert c.boottime() == pytest.approx(MONO0 + 5.0)
    assert c.time() == pytest.approx(WALL0 + 5.0)


def test_a_drifting_clock_runs_fast_and_its_wall_clock_stays_within_the_skew():
    hub, _, c = clock(offset=0.1)
    c.drift(1e-3, bound=0.5)
    hub.now += 100.0
    assert c.monotonic() - MONO0 == pytest.approx(100.1)
    assert c.time() - (WALL0 + 100.0) == pytest.approx(0.2)
    hub.now += 1000.0
    assert c.time() - (WALL0 + 1100.0) == pytest.approx(0.25)  # NTP keeps it within the bound
    at = c._until(10.0)
    assert at - hub.now == pytest.approx(10.0 / 1.001)


def test_a_stepped_wall_clock_jumps_and_monotonic_time_does_not():
    hub, _, c = clock(offset=0.2)
    c.step_at(MONO0 + 3.0, -0.2)
    hub.now += 2.0
    before, mono = c.time(), c.monotonic()
    hub.now += 1.0
    assert c.time() - before == pytest.approx(1.0 - 0.4)  # a step back
    assert c.monotonic() - mono == pytest.approx(1.0)


def test_the_library_counts_a_suspend_by_boottime_on_a_simulated_host_that_has_it():
    """The lease's second opinion on a suspend: on a host with CLOCK_BOOTTIME the lock's boot-time check
    sees the suspend though monotonic time stood still (Clock.boottime of a simulated clock was its
    monotonic time: that check was never exercised)."""
    hub, proc, c = clock()
    c.boottime_runs = True
    assert type(c).boottime is not Clock.boottime
    start_boot, start_mono = c.boottime(), c.monotonic()
    proc.suspended_for = 3.0
    hub.now += 3.0
    assert c.boottime() - start_boot == pytest.approx(3.0) and c.monotonic() == pytest.approx(start_mono)


def store(faults: Faults) -> tuple[Hub, Checker, SimStore]:
    hub = Hub(random.Random(0))
    checker = Checker(hub, Rules(ttl=2.0, skew=0.0, waiter_check_interval=0.4, gentle=False), [], by_protocol=False)
    backend = MemoryStorage(f"swarm-test-{random.random()}")
    net = Net(hub, random.Random(1), faults, backend, checker.note, checker.counts)
    # No client-side spacing: these tests aim writes 0.7 s apart at the store's own 429 rule and slow writes,
    # which a client that waits out a write interval would never reach.
    return hub, checker, SimStore(net, None, min_write_interval=0.0)


def run_in(hub: Hub, fn) -> dict[str, object]:
    box: dict[str, object] = {}

    def body() -> None:
        try:
            box["result"] = fn()
        except Exception as exc:
            box["result"] = exc
        box["at"] = hub.now

    hub.spawn("client", body)
    hub.run(hub.now + 30.0)
    return box


def test_a_slow_write_cut_off_at_its_timeout_lands_after_the_client_gave_up():
    """A late commit: the client sees a timeout (ambiguous), and the store applies the write later."""
    hub, checker, s = store(Faults(slow_write=1.0, max_latency=0.0))
    outcomes: Counter[str] = Counter()
    for seed in range(60):
        s.net.late.seed(seed)
        box = run_in(hub, lambda k=f"k{seed}": s.write(k, b"{}", if_generation_match=0, timeout=0.5))
        applied = [e for e in checker.history if e.what == "applied" and e.key == f"k{seed}"]
        if isinstance(box["result"], TransientStorageError):
            assert box["result"].ambiguous and "cut off at its timeout" in str(box["result"])
            outcomes["landed later" if applied and applied[0].at > box["at"] else "applied before the cut"] += 1
        else:
            assert applied and box["at"] - applied[0].at >= 0
            outcomes["slow"] += 1
    assert outcomes["landed later"] and outcomes["applied before the cut"] and outcomes["slow"], outcomes
    assert checker.counts["slow_writes"] == 60


def test_gcs_real_rule_refuses_a_write_within_a_second_of_the_last():
    for window, refused in ((0.5, False), (1.0, True)):
        hub, _, s = store(Faults(gcs_rate=1.0, burst_window=window, max_latency=0.0))

        def two_writes(s: SimStore = s, hub: Hub = hub) -> int:
            s.write(KEY, b"{}", if_generation_match=0)
            hub.park(hub.now + 0.7)
            return s.write(KEY, b"{}", if_generation_match=1)

        box = run_in(hub, two_writes)
        assert isinstance(box["result"], TransientStorageError) == refused
        if refused:
            assert box["result"].status == 429


@pytest.mark.parametrize("kind", sorted(OLD_RECORDS))
def test_an_old_record_is_read_by_the_checker_and_the_lock(kind):
    from handofflock.core.record import LockRecord

    data = old_record(kind, 2.0)
    rec, lib = read_record(data, legacy=True), LockRecord.decode(data)
    assert (rec.owner and rec.owner.id) == lib.owner_id and rec.token == lib.token
    if "version" not in OLD_RECORDS[kind]:
        with pytest.raises(Violation, match="not a version 1 object"):
            read_record(data)  # a record the library writes has its version


def test_a_world_that_starts_on_an_old_record_runs_clean():
    seeds = {c.swarm.old_record: s for s, c in enumerate(swarm_configs(200)) if c.swarm.old_record}
    for kind in ("live", "ours", "no-instance"):
        outcome = run_seed(seeds[kind])
        assert outcome.violation is None, "\n".join(outcome.trace[-15:])
        assert outcome.config is not None and outcome.config.swarm.old_record == kind


def test_violations_are_grouped_by_rule_and_kind_of_world():
    gentle, fast = Config(gentle=True, spacing=1.0), Config()
    a = Outcome(1, "p2 counts itself healthy 0.123 s after another party may take the lock (token 5)", [], 0, fast)
    b = Outcome(9, "p13 counts itself healthy 4.5 s after another party may take the lock (token 12)", [], 0, fast)
    c = Outcome(9, "p13 counts itself healthy 4.5 s after another party may take the lock (token 12)", [], 0, gentle)
    assert a.signature == b.signature != c.signature
    assert a.signature.startswith("[fast] pN counts itself healthy N s")
    assert c.signature.startswith("[gentle]")


def test_a_run_prints_its_seeds_per_second(capsys):
    assert main(["--seeds", "2", "--first", "7"]) == 0
    out = capsys.readouterr().out
    assert "2 seeds, 0 violations" in out and "seeds/s" in out


@pytest.mark.parametrize("boottime", [False, True])
def test_a_simulated_host_with_boottime_counts_a_suspend_that_monotonic_time_did_not(boottime):
    """With the wall clock's second opinion planted away, only ``CLOCK_BOOTTIME`` tells a resumed owner that its
    lease ran out while the host slept: on a simulated host that has it the lock's boot-time check runs and the
    owner is not healthy; on one without it the checker catches the plant."""
    with planted("no-wall-second-opinion"):
        world = World(0, Config(parties=1, ttl=2.0, skew=0.0))
        world.net.chaos = False  # no actor, no faults: one owner, suspended
        party = world.new_party()
        party.clock.boottime_runs = boottime
        box: dict[str, bool] = {}

        def owner() -> None:
            box["acquired"] = bool(party.lock.acquire(timeout=5))
            party.proc.suspended_until, party.proc.suspended_for = world.hub.now + 6.0, 6.0
            world.hub.park(world.hub.now + 0.001)  # runs again once the host resumes
            box["healthy"] = party.lock.healthy

        try:
            world.hub.spawn("owner", owner, party.proc)
            if boottime:
                world.hub.run(world.hub.now + 20.0)
            else:
                with pytest.raises(Violation, match="counts itself healthy after a host suspend"):
                    world.hub.run(world.hub.now + 20.0)
        finally:
            world.close()
    assert box == {"acquired": True, "healthy": not boottime}


def test_seeds_found_by_the_swarm_hold():
    """Seed 2985, a fast world with slow reads: a holder's read took 1.09 s where its request's timeout was
    0.375 s, and two grouped checks went by meanwhile, so its waiter was heard late. A real client cuts such a
    read off at its timeout; the simulated store now does too (a checker's false positive, not the lock's)."""
    outcome = run_seed(2985, aims=False)  # its world as it was found
    assert outcome.violation is None, "\n".join(outcome.trace[-15:])


def _fake_seeds(monkeypatch, bad: frozenset[int] = frozenset()) -> list[int]:
    """``run_seed`` replaced by one that notes the seed and fails those in ``bad``: the ledger's bookkeeping,
    without the worlds."""
    ran: list[int] = []

    def run_seed(seed, **_):
        ran.append(seed)
        return Outcome(seed, f"p1 broke rule {seed}" if seed in bad else None, [], 1, Config())

    monkeypatch.setattr(sim_main, "run_seed", run_seed)
    return ran


def test_a_long_run_with_a_ledger_goes_on_where_it_stopped(tmp_path, monkeypatch, capsys):
    ran, ledger = _fake_seeds(monkeypatch), tmp_path / "ledger.jsonl"
    assert main(["--seeds", "3", "--first", "7", "--ledger", str(ledger)]) == 0
    assert ran == [7, 8, 9]
    ran.clear()
    assert main(["--seeds", "5", "--first", "7", "--ledger", str(ledger)]) == 0
    assert ran == [10, 11], "the seeds the ledger holds for this tree are not run again"
    out = capsys.readouterr().out
    assert "3 of seeds 7-11 run" in out and "ledger: 5 of 5 seeds 7-11 run" in out
    lines = [orjson.loads(raw) for raw in ledger.read_bytes().splitlines()]
    assert [(x["first"], x["end"]) for x in lines] == [(7, 10), (10, 12)]
    assert {x["tree"] for x in lines} == {sim_main.tree_digest()}


def test_a_ledger_counts_only_whole_lines_of_this_tree_and_blocks_of_consecutive_seeds(tmp_path, monkeypatch):
    ran, ledger = _fake_seeds(monkeypatch), tmp_path / "ledger.jsonl"
    other = {"tree": "another", "first": 0, "end": 50, "violations": [], "seconds": 1.0}
    ledger.write_bytes(orjson.dumps(other) + b"\n" + b'{"tree": "' + sim_main.tree_digest().encode() + b'", "fir')
    monkeypatch.setattr(sim_main, "PROGRESS_EVERY", 2)
    assert main(["--seeds", "5", "--ledger", str(ledger)]) == 0
    assert ran == [0, 1, 2, 3, 4], "a line of another tree, or one cut short, counts for nothing"
    mine = sim_main.Ledger(ledger, sim_main.tree_digest())
    assert [(x["first"], x["end"]) for x in mine.lines()] == [(0, 2), (2, 4), (4, 5)]
    ran.clear()
    ledger.write_bytes(ledger.read_bytes().replace(b'"first":2,"end":4', b'"first":9,"end":9'))
    assert main(["--seeds", "6", "--ledger", str(ledger)]) == 0
    assert ran == [2, 3, 5]
    assert [(x["first"], x["end"]) for x in mine.lines()][-2:] == [(2, 4), (5, 6)], "a gap starts a line"


def test_a_ledger_keeps_each_violation_and_reports_it_until_the_tree_changes(tmp_path, monkeypatch, capsys):
    ran, ledger = _fake_seeds(monkeypatch, bad=frozenset({4})), tmp_path / "ledger.jsonl"
    assert main(["--seeds", "6", "--ledger", str(ledger)]) == 1
    ran.clear()
    capsys.readouterr()
    assert main(["--seeds", "6", "--ledger", str(ledger)]) == 1, "a resumed run with nothing left still fails"
    assert ran == []
    assert "1 violations\n  seed 4: p1 broke rule 4" in capsys.readouterr().out
    monkeypatch.setattr(sim_main, "tree_digest", lambda: "changed")
    assert main(["--seeds", "6", "--ledger", str(ledger)]) == 1
    assert ran == [0, 1, 2, 3, 4, 5], "on a tree changed since, every seed runs again"


def test_the_tree_digest_follows_the_source(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("not source")
    before = sim_main.tree_digest(tmp_path)
    (tmp_path / "notes.txt").write_text("still not source")
    assert sim_main.tree_digest(tmp_path) == before
    (tmp_path / "a" / "x.py").write_text("x = 2\n")
    assert sim_main.tree_digest(tmp_path) != before


def test_a_ledger_is_refused_where_a_run_does_not_judge_the_tree(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--plant-bug", "trust-a-read", "--ledger", str(tmp_path / "l")])
    assert "--ledger counts the seeds a tree passes" in capsys.readouterr().err
