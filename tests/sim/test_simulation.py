"""The deterministic simulation (tests/support/simulation.py, scripts/simulate.py) as part of the suite.

2,000 seeds must show no violation; each bug that can be planted must be found
within those seeds (so the checker can fail); a seed replays exactly.
"""

from __future__ import annotations

import pytest

import simulation

SEEDS = 2000


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_thousand_seeds_show_no_violation():
    found = simulation.run_seeds(range(SEEDS))
    report = "\n".join(f"seed {o.seed}: {o.violation}\n  " + "\n  ".join(o.trace[-15:]) for o in found[:3])
    assert found == [], f"{len(found)} of {SEEDS} seeds broke an invariant (replay: scripts/simulate.py --seed N):\n{report}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("bug", list(simulation.BUGS))
def test_every_planted_bug_is_found_within_the_default_seeds(bug):
    found = simulation.run_seeds(range(SEEDS), bug=bug, stop_at_first=True)
    assert found, f"planting {bug!r}: no seed of {SEEDS} noticed"
    assert found[0].violation


def test_a_seed_replays_exactly():
    first, second = simulation.run_seed(7), simulation.run_seed(7)
    assert first.steps == second.steps > 100
    assert first.trace == second.trace and first.violation == second.violation
