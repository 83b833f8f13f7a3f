"""The deterministic simulation and the model check (handofflock/testing/sim) as part of the suite.

The suite runs 80 seeds (the issue's 2,000 are run by hand, see docs/reliability.md); each planted
bug is found within the first seeds named below (measured with 2,000 available, the default count);
every coverage key is above zero; a seed replays exactly; the model check finds no
violation and finds every planted protocol bug.
"""

from __future__ import annotations

import logging

import pytest

from handofflock.testing.sim.bugs import BUGS, PROTOCOL_BUGS
from handofflock.testing.sim import model
from handofflock.testing.sim.__main__ import coverage_line, run_seed, run_seeds

SEEDS = 80
#: The first seed that finds each planted bug (scripts/simulate.py --plant-bug NAME), with room (measured
#: 1, 2, 2, 3, 1, 1, 1, 1, 3, 10, 3 seeds on the world of issue 26). The two bugs about our own id need a
#: twin (our owner id, another instance) that takes a lease its holder let run out while paused, which
#: is rarer: found in 14 and 51 seeds.
FOUND_WITHIN = {
    "trust-a-read": 25, "still-mine-by-id": 80, "keep-slot-on-timeout": 5, "unconditional-handoff": 10,
    "unconditional-renewal": 5, "give-up-without-match": 20, "lease-past-its-margin": 10,
    "heir-keeps-old-token": 5, "heir-lease-from-its-read": 15, "cancelled-keeps-handed-lock": 20,
    "handoff-to-expired-slot": 40,
}  # fmt: skip


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("handofflock").setLevel(logging.CRITICAL)
    yield
    logging.getLogger("handofflock").setLevel(logging.NOTSET)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_seeds_show_no_violation_and_explore_every_corner():
    totals: dict[str, int] = {}
    found = run_seeds(range(SEEDS), totals=totals)
    report = "\n".join(f"seed {o.seed}: {o.violation}\n  " + "\n  ".join(o.trace[-15:]) for o in found[:3])
    assert found == [], (
        f"{len(found)} of {SEEDS} seeds broke an invariant (replay: scripts/simulate.py --seed N --trace):\n{report}"
    )
    line = coverage_line(totals)
    keys = ("handoffs", "twins", "waiter_pauses", "throttled", "suspends", "grouped_checks", "slow_reads", "async",
            "late_commits")  # fmt: skip
    for key in keys:
        assert totals.get("listings" if key == "grouped_checks" else key, 0) > 0, line


@pytest.mark.parametrize("seed", [155, 328])
def test_a_give_up_that_a_pause_carries_past_its_budget_still_reads_and_leaves_no_lock_behind(seed):
    """Seeds where a waiter's acquire timed out and, while it gave its slot back, paused past the give-up's
    budget as the owner handed the lock to it (its give-up write then failed its precondition): the
    give-up must still read, find the lock handed to it, and keep or release it, not leave it held."""
    outcome = run_seed(seed)
    assert outcome.violation is None, "\n".join(outcome.trace[-15:])


@pytest.mark.parametrize("seed", [3588, 3641, 4664, 5333, 2728])
def test_a_handoff_held_back_in_the_write_gate_is_decided_again_when_it_is_sent(seed):
    """Seeds in their worlds before late commits: an owner decides to hand off while the heir's slot is live,
    the write waits in the gate or meets a 429 and goes out after the slot has ended; decided again as it is
    sent, it frees the lock (5333). Seed 2728: a handed lease, in a world of survivable faults, is kept."""
    outcome = run_seed(seed, late_commits=False)
    assert outcome.violation is None, "\n".join(outcome.trace[-15:])


@pytest.mark.parametrize("seed", [18, 2237, 2835, 2906, 3168, 3971])
def test_what_the_checker_no_longer_excuses_for_a_fault_holds(seed):
    """Seeds the checker excused for a fault the party saw, and that hold without the excuse: an async acquire
    cancelled as the lock was handed to it gives it back (its release, refused by a 429, retried in the
    background: seed 18); a release called from another thread is the party's own (seed 2237); a give-up
    whose write is refused by 429s reads again while its budget lasts, and finds the lock handed to it
    meanwhile (2835); a give-back goes at the store's own spacing, not one 429s widened past its budget (2906);
    a slot that has ended holds nobody back, though the give-up could not clear it past a busy owner (3168);
    a registration whose reply was lost, then whose read-back met a 503, is still one that may have landed:
    the cancelled acquire reads and gives the slot back (3971)."""
    outcome = run_seed(seed)
    assert outcome.violation is None, "\n".join(outcome.trace[-15:])


def test_every_planted_bug_is_listed_with_a_bound():
    assert len(BUGS) >= 11 and set(FOUND_WITHIN) == set(BUGS)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("bug", list(BUGS))
def test_every_planted_bug_is_found(bug):
    found = run_seeds(range(FOUND_WITHIN[bug]), bug=bug, stop_at_first=True)
    assert found, f"planting {bug!r}: no seed of {FOUND_WITHIN[bug]} noticed"


@pytest.mark.parametrize("seed", [7, 3])  # seed 3's first party drives the async lock on an event loop
def test_a_seed_replays_exactly(seed):
    first, second = run_seed(seed), run_seed(seed)
    assert first.steps == second.steps > 100
    assert first.trace == second.trace and first.violation == second.violation
    assert first.config is not None and first.config.asynchronous == (seed == 3)
    assert (first.coverage.get("async", 0) > 0) == (seed == 3)


def test_the_model_check_finds_no_violation(capsys):
    assert model.check_all() == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(", 0 violations")


@pytest.mark.parametrize("bug", PROTOCOL_BUGS)
def test_the_model_check_finds_every_planted_protocol_bug(bug, capsys):
    assert model.check_all(bug=bug) == 1
    assert "counterexample" in capsys.readouterr().out
