"""The network test bed's offline checker (scripts/netbed_check.py) on hand-made histories: each check
passes a good one and fails the bad one it exists for."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import netbed_check as nc


def w(seq: int, writer: str, token: int, op: str, accepted: bool = True) -> dict:
    return {"seq": seq, "t": float(seq), "writer": writer, "token": token, "op": op, "accepted": accepted}


#: p0 holds token 1 and writes twice, hands off to p1 (token 2); p0 comes back late and is refused.
GOOD = [
    w(1, "p0", 1, "p0-1-c"),
    w(2, "p0", 1, "p0-1-s"),
    w(3, "p1", 2, "p1-1-c"),
    w(4, "p0", 1, "p0-2-c", accepted=False),
    w(5, "p1", 2, "p1-1-s"),
]
GOOD_ACKS = {
    "p0-1-c": "accepted",
    "p0-1-s": "accepted",
    "p1-1-c": "accepted",
    "p0-2-c": "refused",
    "p1-1-s": "accepted",
}
GOOD_SAMPLES = [(10, "p0", 1), (11, "p0", 1), (12, "p0", 1), (13, "p1", 2), (14, None, 2), (15, "p1", 3), (16, "p0", 4)]
GOOD_ACQUIRED = [("p0", 1), ("p1", 2), ("p1", 3), ("p0", 4)]


def test_a_good_history_passes_every_check():
    results = nc.check(GOOD, GOOD_ACKS, GOOD_ACQUIRED, GOOD_SAMPLES)
    assert all(r["ok"] for r in results.values()), results
    assert results["refusals_were_due"]["count"] == 1
    assert results["lock_tokens_rise_per_handoff"]["owner_changes_sampled"] == 2


def test_two_writers_accepted_with_the_same_token_fail():
    history = [*GOOD, w(6, "p2", 2, "p2-1-c")]
    r = nc.one_writer_per_token(history)
    assert not r["ok"] and r["violations"] == ["token 2 accepted from ['p1', 'p2']"]


def test_an_accepted_write_with_a_lower_token_fails():
    history = [*GOOD[:3], w(4, "p0", 1, "p0-2-c")]  # the fence let the late write in
    r = nc.accepted_tokens_never_go_back(history)
    assert not r["ok"] and "p0-2-c (p0, token 1) accepted after p1-1-c with token 2" in r["violations"][0]
    # An equal token from the same holder is not a regression.
    assert nc.accepted_tokens_never_go_back(GOOD[:2])["ok"]


def test_a_refusal_without_a_higher_token_before_it_fails():
    assert not nc.refusals_were_due([w(1, "p0", 1, "p0-1-c", accepted=False)])["ok"]
    assert not nc.refusals_were_due([w(1, "p0", 1, "p0-1-c"), w(2, "p1", 1, "p1-1-c", accepted=False)])["ok"]


def test_an_acknowledged_write_missing_from_the_history_fails():
    r = nc.no_acknowledged_write_lost(GOOD[:-1], GOOD_ACKS)
    assert not r["ok"] and r["violations"] == ["p1-1-s was acknowledged but is not accepted in the history"]


def test_a_write_reported_refused_but_accepted_or_decided_twice_or_unsent_fails():
    assert not nc.no_acknowledged_write_lost(GOOD, {**GOOD_ACKS, "p0-1-c": "refused"})["ok"]
    assert not nc.no_acknowledged_write_lost([*GOOD, GOOD[0]], GOOD_ACKS)["ok"]
    assert not nc.no_acknowledged_write_lost([*GOOD, w(6, "p9", 9, "p9-1-c")], GOOD_ACKS)["ok"]


def test_a_write_whose_answer_was_lost_may_be_in_or_out():
    acks = {**GOOD_ACKS, "p1-1-s": "unknown"}
    assert nc.no_acknowledged_write_lost(GOOD, acks)["ok"]
    r = nc.no_acknowledged_write_lost(GOOD[:-1], acks)
    assert r["ok"] and r["unknown"] == 1


def test_a_handoff_that_keeps_the_token_fails():
    samples = [(10, "p0", 1), (11, "p1", 1)]
    r = nc.lock_tokens_rise_per_handoff(samples, [("p0", 1), ("p1", 1)])
    assert not r["ok"]
    assert r["violations"] == [
        "generation 11: p1 took over from p0 with token 1, not above 1",
        "token 1 was acquired 2 times",
    ]


def test_a_token_that_goes_back_fails():
    r = nc.lock_tokens_rise_per_handoff([(10, "p0", 5), (11, "p0", 4)], [("p0", 5)])
    assert not r["ok"] and "generation 11 has token 4 after generation 10 token 5" in r["violations"][0]
