"""``SimClock()``: the tests' old name for ``FakeClock(step=0.25)``, on which waiting *is* the passage of time.

The clock double is :class:`handofflock.core.clock.FakeClock`; see its docstring for ``step``,
``on_tick``, ``at`` and ``run_for``. This name stays only because tests/support/simworld.py (owned by
the lock's developers, edited elsewhere) imports it; new tests use ``FakeClock(step=...)``.
"""

from __future__ import annotations

from handofflock.core.clock import FakeClock


def SimClock(step: float = 0.25, **kwargs: float) -> FakeClock:  # noqa: N802 (was a class)
    """A self-advancing :class:`FakeClock`, ``step`` seconds a tick."""
    return FakeClock(step=step, **kwargs)
