"""The torture run's checker: pure functions over what the run left behind.

Inputs:

* ``journal``: the fenced journal's entries in the order the store accepted
  them: claims ``{"k": "c", "w", "t", "id"}`` and sections
  ``{"k": "s", "w", "t", "id", "s", "e"}`` (``s``/``e``: wall-clock start and
  end of the critical section, taken by the worker after its claim was
  accepted and before its final check);
* ``logs``: each worker's own events (``scripts/torture_worker.py``);
* ``exits``: each worker's exit status;
* ``history``: the lock object as sampled during the run,
  ``(generation, owner, token)`` in generation order.

Each check returns ``{"ok": bool, "count": n, "violations": [...]}``; the run
passes only if every check is ok. What each proves is in docs/reliability.md.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Iterable

MAX_SHOWN = 20


def _result(violations: list[str], count: int, **extra: Any) -> dict[str, Any]:
    return {"ok": not violations, "count": count, "violations": violations[:MAX_SHOWN], "violation_count": len(violations), **extra}


def sections_never_overlap(journal: list[dict]) -> dict[str, Any]:
    """Accepted critical sections are pairwise disjoint in time, in the journal's order.

    Each section ends before the next one in the journal starts; with start <=
    end for each, that makes them pairwise disjoint and the journal's order
    their order in time.
    """
    sections = [e for e in journal if e.get("k") == "s"]
    bad = [f"{e['id']} ends before it starts" for e in sections if not e["s"] <= e["e"]]
    for prev, nxt in zip(sections, sections[1:]):
        if not prev["e"] < nxt["s"]:
            bad.append(f"{prev['id']} [{prev['s']:.6f}, {prev['e']:.6f}] overlaps {nxt['id']} [{nxt['s']:.6f}, {nxt['e']:.6f}]")
    return _result(bad, len(sections))


def tokens_strictly_increase(journal: list[dict]) -> dict[str, Any]:
    """Claims, and sections, carry strictly increasing tokens in the order the journal accepted them."""
    bad = []
    for kind in ("c", "s"):
        entries = [e for e in journal if e.get("k") == kind]
        for prev, nxt in zip(entries, entries[1:]):
            if not nxt["t"] > prev["t"]:
                bad.append(f"{kind}: {nxt['id']} token {nxt['t']} after {prev['id']} token {prev['t']}")
    return _result(bad, len(journal))


def no_stale_write_accepted(journal: list[dict]) -> dict[str, Any]:
    """Every accepted section belongs to the holder whose claim is the latest one before it.

    A stale write (an earlier holder's, after a newer holder claimed) would
    show up as a section whose token or writer differs from the latest claim's.
    """
    bad = []
    latest: dict | None = None
    sections_per_claim: Counter[str] = Counter()
    for e in journal:
        if e.get("k") == "c":
            latest = e
        elif e.get("k") == "s":
            if latest is None or (latest["w"], latest["t"]) != (e["w"], e["t"]):
                bad.append(f"section {e['id']} (token {e['t']}) accepted after claim {latest and latest['id']} (token {latest and latest['t']})")
            sections_per_claim[e["id"]] += 1
        else:
            bad.append(f"unknown journal entry {e!r}")
    bad += [f"{i}: {n} sections for one acquisition" for i, n in sections_per_claim.items() if n > 1]
    return _result(bad, len(journal))


def _writes(logs: dict[str, list[dict]]) -> Iterable[dict]:
    for events in logs.values():
        for ev in events:
            if ev["ev"] == "write":
                yield ev


def stale_writes_were_refused(journal: list[dict], logs: dict[str, list[dict]]) -> dict[str, Any]:
    """Every refused write was stale (a claim with a higher token is in the journal), and is not in it.

    Also counts them: a run in which nothing was refused did not exercise the fence.
    """
    in_journal = {(e["id"], e["k"]) for e in journal}
    claims = {e["t"] for e in journal if e.get("k") == "c"}
    bad, refused = [], Counter()
    for ev in _writes(logs):
        if ev["outcome"] != "refused":
            continue
        refused[ev["k"]] += 1
        if (ev["id"], ev["k"]) in in_journal:
            bad.append(f"{ev['id']} {ev['k']} was reported refused but is in the journal")
        if not ev["highest"] > ev["token"]:
            bad.append(f"{ev['id']} {ev['k']} refused with highest {ev['highest']} <= its token {ev['token']}")
        elif ev["highest"] not in claims:
            bad.append(f"{ev['id']} {ev['k']} refused by token {ev['highest']}, which no claim in the journal carries")
    total = sum(refused.values())
    if total == 0:
        bad.append("no write was refused: the pauses never made a holder write late, so the fence was not tested")
    return _result(bad, total, refused_claims=refused["c"], refused_sections=refused["s"])


def journal_matches_the_workers(journal: list[dict], logs: dict[str, list[dict]]) -> dict[str, Any]:
    """The journal holds exactly the writes the workers saw accepted (plus, possibly, ones whose outcome they could not learn)."""
    bad = []
    seen = Counter((e["id"], e["k"]) for e in journal)
    bad += [f"{key} is in the journal {n} times" for key, n in seen.items() if n > 1]
    outcome = {(ev["id"], ev["k"]): ev["outcome"] for ev in _writes(logs)}
    for key in seen:
        if outcome.get(key) not in ("accepted", "unknown"):
            bad.append(f"{key} is in the journal but its writer reported {outcome.get(key)!r}")
    for key, out in outcome.items():
        if out == "accepted" and key not in seen:
            bad.append(f"{key} was accepted but is missing from the journal")
    unknown = sum(1 for out in outcome.values() if out == "unknown")
    return _result(bad, len(seen), unknown_outcomes=unknown)


def healthy_holders_never_overlap(logs: dict[str, list[dict]]) -> dict[str, Any]:
    """While one worker's lock said healthy (from acquire to a passing check), no other worker held it."""
    spans = []
    for events in logs.values():
        acquired: dict[str, dict] = {}
        for ev in events:
            if ev["ev"] == "acquired":
                acquired[ev["id"]] = ev
            elif ev["ev"] == "checked" and ev["id"] in acquired:
                spans.append((acquired[ev["id"]]["t"], ev["t_check"], ev["id"]))
    acquisitions = sorted(
        (ev["t"], ev["id"]) for events in logs.values() for ev in events if ev["ev"] == "acquired"
    )
    bad = []
    import bisect

    starts = [t for t, _ in acquisitions]
    for begin, end, sid in spans:
        i = bisect.bisect_right(starts, begin)
        while i < len(acquisitions) and acquisitions[i][0] <= end:
            other = acquisitions[i][1]
            if other != sid:
                bad.append(f"{other} acquired at {acquisitions[i][0]:.6f} while {sid} was healthy [{begin:.6f}, {end:.6f}]")
            i += 1
    return _result(bad, len(spans))


def waiters_were_served(logs: dict[str, list[dict]]) -> dict[str, Any]:
    """Every acquire ended, in the lock or a typed error; in particular every one that registered as the waiter."""
    bad, outcomes = [], Counter()
    for events in logs.values():
        started: dict[str, dict] = {}
        for ev in events:
            if ev["ev"] == "acquiring":
                started[ev["id"]] = ev
            elif ev["ev"] in ("acquired", "acquire_failed"):
                if started.pop(ev["id"], None) is None:
                    bad.append(f"{ev['id']}: an outcome without an attempt")
                if ev["ev"] == "acquire_failed" and not ev.get("typed", False):
                    bad.append(f"{ev['id']} ended with an untyped {ev['error']}")
                if ev.get("registered"):
                    outcomes["acquired" if ev["ev"] == "acquired" else ev["error"]] += 1
        bad += [f"{i}: an acquire that never ended" for i in started]
    return _result(bad, sum(outcomes.values()), registered_outcomes=dict(outcomes))


def workers_exited_cleanly(logs: dict[str, list[dict]], exits: dict[str, int | None]) -> dict[str, Any]:
    bad = []
    for w, code in sorted(exits.items()):
        events = logs.get(w, [])
        fatal = [ev for ev in events if ev["ev"] == "fatal"]
        for ev in fatal:
            bad.append(f"{w} died with an untyped {ev['error']}: {ev['msg']}\n{ev.get('tb', '')}")
        if code != 0 and not fatal:
            bad.append(f"{w} exited with status {code}")
        # Not necessarily the last event: a receiver on the lock's notifier thread (``lost``) may log after it.
        if not any(ev["ev"] == "exit" for ev in events):
            bad.append(f"{w} did not log its exit")
    return _result(bad, len(exits))


def lock_tokens_only_grow(logs: dict[str, list[dict]], history: list[tuple[int, str | None, int]]) -> dict[str, Any]:
    """The lock object's token never goes back, and no two acquisitions share a token."""
    bad = []
    for (g1, _, t1), (g2, _, t2) in zip(history, history[1:]):
        if not (g2 > g1 and t2 >= t1):
            bad.append(f"lock object at generation {g2} has token {t2} after generation {g1} token {t1}")
    tokens = Counter(ev["token"] for events in logs.values() for ev in events if ev["ev"] == "acquired")
    bad += [f"token {t} was acquired {n} times" for t, n in tokens.items() if n > 1]
    return _result(bad, sum(tokens.values()), samples=len(history))


def check(journal, logs, exits, history) -> dict[str, dict[str, Any]]:
    return {
        "sections_never_overlap": sections_never_overlap(journal),
        "tokens_strictly_increase": tokens_strictly_increase(journal),
        "no_stale_write_accepted": no_stale_write_accepted(journal),
        "stale_writes_were_refused": stale_writes_were_refused(journal, logs),
        "journal_matches_the_workers": journal_matches_the_workers(journal, logs),
        "healthy_holders_never_overlap": healthy_holders_never_overlap(logs),
        "waiters_were_served": waiters_were_served(logs),
        "workers_exited_cleanly": workers_exited_cleanly(logs, exits),
        "lock_tokens_only_grow": lock_tokens_only_grow(logs, history),
    }


def tally(logs: dict[str, list[dict]]) -> dict[str, Any]:
    """Counts of what the workers did (for the summary; not checks)."""
    c: Counter[str] = Counter()
    errors: dict[str, Counter[str]] = defaultdict(Counter)
    for events in logs.values():
        for ev in events:
            name = ev["ev"]
            if name == "write":
                c[f"write_{ev['k']}_{ev['outcome']}"] += 1
                if ev["outcome"] == "refused" and not ev.get("checked", True):
                    c["refused_unchecked"] += 1
            elif name == "acquired":
                c["acquisitions"] += 1
                c["handoffs_to_waiter" if ev.get("registered") else "direct_acquisitions"] += 1
            elif name in ("acquire_failed", "release_failed", "lost_before_write"):
                errors[name][ev.get("error") or ev.get("k", "?")] += 1
            elif name == "released":
                c["released_handoff" if ev.get("heir") else "released_free"] += 1
            elif name == "lost_signal":
                c["lost_signals"] += 1
    return {"counts": dict(c), "errors": {k: dict(v) for k, v in errors.items()}}
