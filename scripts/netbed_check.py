"""The network test bed's offline checker: pure functions over what a run left behind (Jepsen style).

Inputs:

* ``history``: the fenced resource server's append-only history, one entry per
  write it was asked for, in the order it decided them:
  ``{"seq", "t", "writer", "token", "op", "accepted"}``;
* ``acks``: what each party was told, ``{op: "accepted" | "refused" | "unknown"}``
  (``unknown``: the reply never came, so the write may or may not be in);
* ``acquisitions``: ``(party, token)`` for every acquire that returned the lock;
* ``samples``: the lock object as sampled during the run, ``(generation, owner, token)``
  in generation order.

The checks trust none of the server's own bookkeeping: "the highest token" is
recomputed from the history. Each returns ``{"ok", "count", "violations"}``;
a run passes only if all do. ``tests/sim/test_netbed_check.py`` shows each one
failing on a hand-made history.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import pairwise
from typing import Any

MAX_SHOWN = 20


def _result(violations: list[str], count: int, **extra: Any) -> dict[str, Any]:
    return {
        "ok": not violations,
        "count": count,
        "violations": violations[:MAX_SHOWN],
        "violation_count": len(violations),
        **extra,
    }


def one_writer_per_token(history: list[dict]) -> dict[str, Any]:
    """No two writers had a write accepted with the same token."""
    writers: dict[int, set[str]] = defaultdict(set)
    for e in history:
        if e["accepted"]:
            writers[e["token"]].add(e["writer"])
    bad = [f"token {t} accepted from {sorted(w)}" for t, w in sorted(writers.items()) if len(w) > 1]
    return _result(bad, len(writers))


def accepted_tokens_never_go_back(history: list[dict]) -> dict[str, Any]:
    """No write was accepted with a token lower than one accepted before it."""
    bad, highest, by = [], None, None
    accepted = [e for e in history if e["accepted"]]
    for e in accepted:
        if highest is not None and e["token"] < highest:
            bad.append(f"{e['op']} ({e['writer']}, token {e['token']}) accepted after {by} with token {highest}")
        if highest is None or e["token"] > highest:
            highest, by = e["token"], e["op"]
    return _result(bad, len(accepted))


def refusals_were_due(history: list[dict]) -> dict[str, Any]:
    """Every refused write carried a token below the highest accepted before it: the fence refuses only stale ones."""
    bad, highest, refused = [], None, 0
    for e in history:
        if e["accepted"]:
            highest = e["token"] if highest is None else max(highest, e["token"])
            continue
        refused += 1
        if highest is None or e["token"] >= highest:
            bad.append(f"{e['op']} ({e['writer']}, token {e['token']}) refused with the highest accepted {highest}")
    return _result(bad, refused)


def no_acknowledged_write_lost(history: list[dict], acks: dict[str, str]) -> dict[str, Any]:
    """Every write a party was told was accepted is in the history as accepted, once; and no write
    the history accepted was reported refused to its writer (or is unknown to every party)."""
    bad = []
    decided = Counter(e["op"] for e in history)
    bad += [f"{op} was decided {n} times" for op, n in sorted(decided.items()) if n > 1]
    accepted = {e["op"] for e in history if e["accepted"]}
    for op, outcome in sorted(acks.items()):
        if outcome == "accepted" and op not in accepted:
            bad.append(f"{op} was acknowledged but is not accepted in the history")
        elif outcome == "refused" and op in accepted:
            bad.append(f"{op} was reported refused but the history accepted it")
    bad += [f"{op} is accepted in the history but no party sent it" for op in sorted(accepted - acks.keys())]
    return _result(
        bad, sum(1 for o in acks.values() if o == "accepted"), unknown=sum(1 for o in acks.values() if o == "unknown")
    )


def lock_tokens_rise_per_handoff(
    samples: list[tuple[int, str | None, int]], acquisitions: list[tuple[str, int]]
) -> dict[str, Any]:
    """The lock's token never goes back, rises whenever the owner changes, and no two acquisitions share one."""
    bad = []
    last_owner: tuple[str, int] | None = None  # the latest owner seen, and its token
    for (g1, _, t1), (g2, _, t2) in pairwise(samples):
        if not (g2 > g1 and t2 >= t1):
            bad.append(f"lock object at generation {g2} has token {t2} after generation {g1} token {t1}")
    owners = 0
    for generation, owner, token in samples:
        if owner is None:
            continue
        if last_owner is not None and owner != last_owner[0]:
            owners += 1
            if not token > last_owner[1]:
                bad.append(
                    f"generation {generation}: {owner} took over from {last_owner[0]} with token {token}, "
                    f"not above {last_owner[1]}"
                )
        last_owner = (owner, token)
    counts = Counter(token for _, token in acquisitions)
    bad += [f"token {t} was acquired {n} times" for t, n in sorted(counts.items()) if n > 1]
    return _result(bad, len(acquisitions), owner_changes_sampled=owners)


def check(
    history: list[dict],
    acks: dict[str, str],
    acquisitions: list[tuple[str, int]],
    samples: list[tuple[int, str | None, int]],
) -> dict[str, dict[str, Any]]:
    return {
        "one_writer_per_token": one_writer_per_token(history),
        "accepted_tokens_never_go_back": accepted_tokens_never_go_back(history),
        "refusals_were_due": refusals_were_due(history),
        "no_acknowledged_write_lost": no_acknowledged_write_lost(history, acks),
        "lock_tokens_rise_per_handoff": lock_tokens_rise_per_handoff(samples, acquisitions),
    }
