"""The torture checker on hand-made histories: each check passes a good one and catches its violation.

A checker that never fails proves nothing; these show what each check would
report, so a clean torture run means something.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import torture_check as tc


def claim(w, t, i):
    return {"k": "c", "w": w, "t": t, "id": i}


def section(w, t, i, s, e):
    return {"k": "s", "w": w, "t": t, "id": i, "s": s, "e": e}


GOOD_JOURNAL = [
    claim("w0", 10, "w0-1"), section("w0", 10, "w0-1", 1.0, 1.1),
    claim("w1", 11, "w1-1"), section("w1", 11, "w1-1", 1.2, 1.3),
]


def ev(name, t, **kw):
    return {"ev": name, "t": t, **kw}


def good_logs():
    return {
        "w0": [
            ev("acquiring", 0.9, id="w0-1"), ev("acquired", 0.95, id="w0-1", token=10, registered=False),
            ev("write", 1.0, id="w0-1", k="c", token=10, outcome="accepted"),
            ev("checked", 1.1, id="w0-1", token=10, t_check=1.1),
            ev("write", 1.1, id="w0-1", k="s", token=10, outcome="accepted"),
            ev("write", 1.5, id="w0-2", k="s", token=9, outcome="refused", highest=11),
            ev("exit", 2.0),
        ],
        "w1": [
            ev("acquiring", 0.96, id="w1-1"), ev("acquired", 1.15, id="w1-1", token=11, registered=True),
            ev("write", 1.2, id="w1-1", k="c", token=11, outcome="accepted"),
            ev("write", 1.3, id="w1-1", k="s", token=11, outcome="accepted"),
            ev("exit", 2.0),
        ],
    }


def test_a_good_history_passes_every_check():
    results = tc.check(GOOD_JOURNAL, good_logs(), {"w0": 0, "w1": 0}, [(1, "w0", 10), (2, "w1", 11)])
    assert {k: v["violations"] for k, v in results.items() if not v["ok"]} == {}


def test_overlapping_sections_are_caught():
    journal = [*GOOD_JOURNAL[:3], section("w1", 11, "w1-1", 1.05, 1.3)]
    assert not tc.sections_never_overlap(journal)["ok"]


def test_a_token_going_back_is_caught():
    journal = [claim("w0", 10, "a"), section("w0", 10, "a", 1, 2), claim("w1", 9, "b"), section("w1", 9, "b", 3, 4)]
    assert not tc.tokens_strictly_increase(journal)["ok"]


def test_a_late_write_accepted_after_a_newer_claim_is_caught():
    journal = [claim("w0", 10, "a"), claim("w1", 11, "b"), section("w0", 10, "a", 1, 2)]
    assert not tc.no_stale_write_accepted(journal)["ok"]


def test_a_run_without_refused_writes_fails_and_a_refusal_that_landed_is_caught():
    logs = good_logs()
    logs["w0"] = [e for e in logs["w0"] if e.get("outcome") != "refused"]
    assert not tc.stale_writes_were_refused(GOOD_JOURNAL, logs)["ok"]
    logs = good_logs()
    logs["w0"][5]["id"] = "w0-1"  # "refused", yet its entry is in the journal
    logs["w0"][5]["k"] = "c"
    assert not tc.stale_writes_were_refused(GOOD_JOURNAL, logs)["ok"]


def test_an_accepted_write_missing_from_the_journal_is_caught():
    assert not tc.journal_matches_the_workers(GOOD_JOURNAL[:3], good_logs())["ok"]


def test_two_holders_healthy_at_once_are_caught():
    logs = good_logs()
    logs["w1"][1]["t"] = 1.05  # acquired while w0 was still healthy (checked at 1.1)
    assert not tc.healthy_holders_never_overlap(logs)["ok"]


def test_an_acquire_that_never_ended_is_caught():
    logs = good_logs()
    logs["w1"].insert(-1, ev("acquiring", 1.9, id="w1-2"))
    assert not tc.waiters_were_served(logs)["ok"]


def test_a_worker_that_died_untyped_is_caught():
    logs = good_logs()
    logs["w1"][-1] = ev("fatal", 1.9, error="KeyError", msg="boom", tb="...")
    assert not tc.workers_exited_cleanly(logs, {"w0": 0, "w1": 2})["ok"]


def test_a_lock_token_going_back_or_reused_is_caught():
    assert not tc.lock_tokens_only_grow(good_logs(), [(1, "w0", 11), (2, "w1", 10)])["ok"]
    logs = good_logs()
    logs["w1"][1]["token"] = 10
    assert not tc.lock_tokens_only_grow(logs, [])["ok"]
