"""The mutation run (scripts/mutate.py, ``scripts/simulate.py --mutate``): a few fixed mutants it must catch,
what it mutates and what it leaves alone, and the survivors' report a reader judges them by.

The measured score, over a sample of every module's mutants, is in docs/reliability.md.
"""

from __future__ import annotations

import importlib.util
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mutate_script", ROOT / "scripts" / "mutate.py")
assert _spec is not None and _spec.loader is not None
mutate = importlib.util.module_from_spec(_spec)
sys.modules["mutate_script"] = mutate
_spec.loader.exec_module(mutate)


def pick(path: str, operator: str, before: str, after: str):
    """The first mutant of ``path`` that turns ``before`` into ``after`` (found by text, not by an index that
    any edit of the module shifts)."""
    found = [m for m in mutate.mutants(path) if (m.operator, m.before, m.after) == (operator, before, after)]
    assert found, f"no mutant of {path} turns {before!r} into {after!r}"
    return found[0]


#: Mistakes anyone could write, each caught at once: (module, operator, before, after, by which net and verdict).
CAUGHT = [
    # a new owner's token no higher than the last: the model check's first counterexample, and seed 0's
    ("handofflock/core/protocol.py", "add/sub", "floor + 1", "floor - 1", "model"),
    # a request that never replaces the one in the book: a holder never hears a waiter
    ("handofflock/lock/requests.py", "compare", "current is None", "current is not None", "sim"),
    # a non-blocking acquire that waits, a blocking one that does not: the lock is not free in time
    ("handofflock/lock/handoff.py", "drop-not", "not blocking", "blocking", "sim"),
    # the scheduler's view of a lock without its weak reference: each turn of its loop raises, and the loop
    # logs that and goes on; no waiter check runs, and a holder that never looks at the lock is its symptom
    ("handofflock/lock/handoff.py", "delete", "self._lock = weakref.ref(lock)", "pass", "sim"),
    # grouping by prefix indexes a group nobody holds: the scheduler's loop raises and goes on (caught only as an
    # exception the lock logged: a "crash")
    ("handofflock/lock/scheduler.py", "and/or", "g not in members or len(members[g]) < 2 or g in self._ungrouped",
     "g not in members and len(members[g]) < 2 and (g in self._ungrouped)", "sim crash"),
]


@pytest.mark.timeout(120)
def test_fixed_mutants_are_caught_each_by_the_net_that_should_catch_it():
    chosen = [pick(path, op, before, after) for path, op, before, after, _ in CAUGHT]
    with ThreadPoolExecutor(2) as pool:
        # seed 0 or 1 catches each "sim" one; a "model" one is model-checked alone (no seed)
        seeds = [0 if by == "model" else 2 for *_, by in CAUGHT]
        verdicts = list(pool.map(lambda ms: mutate.run_one(*ms), zip(chosen, seeds, strict=True)))
    for v, (*_, by) in zip(verdicts, CAUGHT, strict=True):
        assert v.outcome == "caught", f"{v.mutant.path}:{v.mutant.line} survived: {v}"
        part, verdict = [*by.split(), "violation"][:2]
        assert (v.model if part == "model" else v.sim) == verdict, v


#: Survivors of the measured sample that break a documented guarantee, each now caught by its own symptom at the
#: seed given, by the simulation alone (the model check is not run here).
#: (module, the function the mutant is in, operator, before, after, seed)
CAUGHT_AT = [
    # at equal rank the older waiter never takes the slot from a younger one: it polls instead of registering
    ("handofflock/core/protocol.py", "_takes_slot", "return",
     "return since is not None and waiter.since is not None and since < waiter.since", "return False", 37),
    # a slot written without when its acquire began: the equal-rank order is lost (the slot's since is judged)
    ("handofflock/core/protocol.py", "decide_acquire", "drop-keyword",
     "Waiter( me.owner_id, now + timing.waiter_ttl, ttl=timing.ttl, instance=me.instance, label=me.label, "
     "request=request, since=since, )",
     "Waiter(me.owner_id, now + timing.waiter_ttl, ttl=timing.ttl, instance=me.instance, label=me.label, "
     "request=request)", 0),
    # wait_for_slot=False without a timeout, over an ended lease and a live waiter: it polls, not LockContended
    ("handofflock/core/protocol.py", "decide_acquire", "return", "return Contended(record)", "return None", 4),
    # a renewal that waits out every 429's widened spacing: two 429s aimed at a gentle world's holder lose its lease
    ("handofflock/core/timing.py", "backoff_until", "return",
     "return valid_until - RETRY_SPACINGS * self.min_write_interval", "return None", 28),
    # the scheduler never runs a lock's duties: a holder in a gentle world stops renewing
    ("handofflock/lock/scheduler.py", "add", "delete", "self._locks[id(lock)] = lock", "pass", 4),
    # workers never counted out: after eight, no job runs, and again renewals stop
    ("handofflock/lock/scheduler.py", "_work", "delete", "self._workers -= 1", "pass", 4),
    # a hold's end leaves the state as it was (releasing): the next acquire is refused for ever
    ("handofflock/lock/handoff.py", "_end_hold", "delete", "self._state = IDLE", "pass", 0),
    # a lost hold's requests are kept into the next hold: its holder hears a waiter of the hold it lost
    ("handofflock/lock/handoff.py", "_acquire", "negate", "self._state == LOST", "not self._state == LOST", 2),
    # the async acquire drops its priority: the slot it writes asks at priority 0
    ("handofflock/aio.py", "acquire", "drop-keyword",
     "functools.partial(sync.acquire, blocking, timeout, request_release=request_release, priority=priority)",
     "functools.partial(sync.acquire, blocking, timeout, request_release=request_release)", 3),
    # every timeout read as none: an acquire waits on past its timeout
    ("handofflock/lock/handoff.py", "acquire", "compare", "timeout == -1", "timeout != -1", 1),
    # cancel() does nothing: a cancelled acquire goes on
    ("handofflock/lock/handoff.py", "cancel", "delete", "self._cancel.set()", "pass", 37),
    # the give-back of a slot held by a spacing earlier 429s widened: it gives up with nothing sent, the slot left
    ("handofflock/lock/handoff.py", "_leave_slot", "drop-keyword",
     "self._io.write(decision, by, urgent=True, send_by=by - MIN_REQUEST_TIME)",
     "self._io.write(decision, by, urgent=True)", 21),
    # a release that failed is never retried in the background: the lock stays releasing, every acquire refused
    ("handofflock/lock/handoff.py", "_release_held", "negate", "self._state == RELEASING",
     "not self._state == RELEASING", 73),
    # grouped waiter checks never run: a holder in a group never looks at the lock
    ("handofflock/lock/scheduler.py", "_plan", "delete",
     "jobs.append( _Job(1, beat, next(self._seq), functools.partial(self._check_group, gkey, group, batch), []) )",
     "pass", 28),
    # the owner's check never counts a record that is not its own as lost: it holds on after reading it taken
    # (the planted bug owner-misses-take is this very change; the first seed that reaches it is past the draw's 60)
    ("handofflock/core/protocol.py", "observe_as_owner", "return", "return lost", "return None", 88),
]  # fmt: skip


@pytest.mark.timeout(300)
def test_survivors_that_broke_a_guarantee_are_caught_by_their_own_symptom():
    def one(case):
        path, function, op, before, after, seed = case
        lines = (ROOT / path).read_text().splitlines()
        heads = (f"def {function}(", f"async def {function}(")
        start = next(i for i, line in enumerate(lines, 1) if line.lstrip().startswith(heads))
        found = [m for m in mutate.mutants(path) if (m.operator, m.before, m.after) == (op, before, after)]
        found = [m for m in found if m.line > start]
        assert found, f"no mutant of {path} after {function}() turns {before!r} into {after!r}"
        return mutate.run_one(found[0], 1, first=seed, model=False)

    with ThreadPoolExecutor(2) as pool:
        verdicts = list(pool.map(one, CAUGHT_AT))
    for v, case in zip(verdicts, CAUGHT_AT, strict=True):
        assert (v.outcome, v.sim, v.seed) == ("caught", "violation", case[-1]), v


def test_every_operator_has_mutants_and_no_mutant_touches_a_planted_bug_switch():
    everything = [m for path in mutate.TARGETS for m in mutate.mutants(path)]
    ops = {m.operator for m in everything}
    assert ops >= {"compare", "and/or", "negate", "drop-not", "number", "add/sub", "return", "delete",
                   "drop-keyword", "swap-args"}  # fmt: skip
    assert not [m for m in everything if "buggify" in m.after and "buggify" not in m.before]
    assert not [m for m in everything if m.before.startswith("buggify.")], "a switch is planted by its own name"
    assert len({m.ident for m in everything}) == len(everything)


def _codes(code):
    """Every code object in a module's, as (name, first line, bytecode)."""
    out = [(code.co_name, code.co_firstlineno, code.co_code)]
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            out += _codes(const)
    return out


def test_a_mutant_keeps_the_files_line_numbers_and_changes_only_the_function_it_is_in():
    m = pick("handofflock/core/protocol.py", "compare", "now >= write.until", "now > write.until")
    source = (ROOT / m.path).read_text()
    original, mutant = _codes(compile(source, str(ROOT / m.path), "exec")), _codes(mutate.compile_mutant(m))
    assert [c[:2] for c in original] == [c[:2] for c in mutant]
    changed = [o[:2] for o, n in zip(original, mutant, strict=True) if o[2] != n[2]]
    assert len(changed) == 1 and changed[0][1] <= m.line, changed


def test_a_mutant_counts_as_reached_when_any_line_of_its_spot_ran():
    m = mutate.Mutant("handofflock/core/protocol.py", 0, "compare", 10, 12, "a < b", "a <= b")
    assert mutate._reached(m, {m.path: {12}}) and not mutate._reached(m, {m.path: {9, 13}})


def test_the_report_counts_each_outcome_and_prints_each_survivor_with_its_spot_and_change():
    M = mutate.Mutant
    verdicts = [
        mutate.Verdict(M("handofflock/lock/handoff.py", 7, "negate", 120, 120, "x", "not x"), "caught", "n/a",
                       "violation", 0, "sim: ...", 2.0),
        mutate.Verdict(M("handofflock/core/protocol.py", 3, "compare", 88, 88, "a < b", "a <= b"), "survived",
                       "clean", "clean", -1, "", 30.0),
        mutate.Verdict(M("handofflock/lock/scheduler.py", 9, "delete", 300, 300, "self.n += 1", "pass"), "hang",
                       "?", "?", -1, "hang", 120.0),
    ]  # fmt: skip
    out = mutate.report(verdicts, total=10, not_reached=7, seeds=200, jobs=2, took=152.0).splitlines()
    assert out[0].startswith("mutants: 10 in ") and "7 not reached" in out[0] and out[0].endswith("3 run")
    assert out[1].startswith("caught: 1 of 3 (33.3%): by the simulation 1, by the model check 0 (of 1")
    assert "hangs 1" in out[1]
    assert out[2] == "survivors: 1"
    assert "seeds per mutant 200" in out[3] and "-j 2" in out[3] and "per mutant run" in out[3]
    assert out[4] == ("SURVIVED handofflock/core/protocol.py:88 [compare] a < b  ->  a <= b   "
                      "(--mutant handofflock/core/protocol.py:3)")  # fmt: skip
    assert out[5].startswith("HANG handofflock/lock/scheduler.py:300 [delete] self.n += 1  ->  pass")
