"""The table printed at the end, and the targets each figure is compared with."""

from __future__ import annotations

from typing import Any

from bench.counts import (  # noqa: E402
    BACKEND_COUNT_TARGETS,
    COUNT_TARGETS,
    count_target,  # noqa: E402
)
from handofflock.lock.scheduler import IO_WORKERS  # noqa: E402

# --------------------------------------------------------------------------- the table

_SHORT = {"read": "r", "write": "w", "list": "l", "delete": "d", "get-metadata": "m", "get-bucket": "b", "patch": "p"}


def breakdown(c: dict[str, Any]) -> str:
    parts = [f"{v}{_SHORT.get(k, k)}" for k, v in c.items() if k not in ("total", "writes") and v]
    return f"{c['total']}" + (f" ({'+'.join(parts)})" if parts else "")


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    return f"{a / b:.2f}x"


def table(r: dict[str, Any]) -> str:
    L: list[str] = []
    m = r["meta"]
    v = m["versions"]
    L.append(f"handofflock benchmark: {m['mode']} run, {m['started']}, {m.get('seconds', '?')} s")
    L.append(f"  Python {m['python']} on {m['platform']}, {m['cpus']} CPUs; handofflock {v['handofflock']}, "
             f"google-cloud-storage {v['google-cloud-storage']}, gcslock {v['gcslock']}")
    L.append(f"  gcs = {m.get('emulator', '?')}; local = LocalStorage in a temporary directory")
    if "s3_server" in m:
        L.append(f"  s3 = S3Storage (boto3 {m.get('versions', {}).get('boto3', '?')}) on {m['s3_server']}")
    if "local" in m:
        L.append(f"  {m['local']}")
    L.append(f"  latencies: {m['latency_method']}; p50 = median, p99 = nearest rank (the maximum below 100 samples)")
    L.append(f"  load average (1, 5, 15 min) at start {m['loadavg_start']}, at end {m.get('loadavg_end')}: "
             "other processes on this machine share its CPUs")
    targets_by_name = {t["name"]: t for t in r.get("targets", [])}

    def met(name: str) -> str:
        t = targets_by_name.get(name)
        return "" if t is None else ("yes" if t["met"] else "NO")

    if "rtt" in r:
        L += ["", "Round trip of one lock-sized request            p50 ms   p99 ms"]
        for b, x in r["rtt"].items():
            for op in ("read", "write"):
                L.append(f"  {b:<6} {op + (' (conditional)' if op == 'write' else ''):<40}{x[op]['p50_ms']:>7.2f}  {x[op]['p99_ms']:>7.2f}")

    if "requests" in r:
        backends = list(r["requests"])
        L += ["", "1. Requests per operation (r read, w write, l list, d delete, m metadata get, b bucket get, p patch)"]
        head = f"  {'operation':<58}" + "".join(f"{b + (' (HTTP)' if b in ('gcs', 's3') else ' (calls)'):<16}" for b in backends) + "target       met"
        L.append(head)
        ops = list(r["requests"][backends[0]])
        for op in ops:
            cells = "".join(f"{breakdown(r['requests'][b][op]) if op in r['requests'][b] else '-':<16}" for b in backends)
            what, limit = COUNT_TARGETS.get(op, ("", None))
            tgt = "" if limit is None else f"{'writes' if what == 'writes' else 'total'} <= {limit}"
            oks = [met(f"{b}: {op}") for b in backends if f"{b}: {op}" in targets_by_name]
            own = [f"{b}: {w} <= {n}" for b in backends for w, n in [BACKEND_COUNT_TARGETS.get(b, {}).get(op, ("", None))] if n is not None]
            L.append(f"  {op:<58}{cells}{tgt:<13}{'/'.join(oks)}" + (f"  ({'; '.join(own)})" if own else ""))
        comp = r.get("compare", {}).get("requests", {})
        for lib, ops2 in comp.items():
            for op, c in ops2.items():
                L.append(f"  {lib + ': ' + op:<58}{breakdown(c):<16}")

    if "handoff" in r:
        L += ["", "2. Handoff latency: owner's release() returned -> waiter's acquire() returned (two processes)",
              "   (RTT: p50 of 30 reads just before the row; target p50 <= poll/2 + 2 RTT)",
              f"  {'backend':<8}{'poll s':>7}{'n':>5}{'p50 ms':>9}{'p99 ms':>9}{'min ms':>9}{'RTT ms':>9}{'target':>9}   met"]
        for h in r["handoff"]:
            bound = h["poll_s"] * 500 + 2 * h["rtt_ms"]
            L.append(f"  {h['backend']:<8}{h['poll_s']:>7}{h['n']:>5}{h['p50_ms']:>9.1f}{h['p99_ms']:>9.1f}{h['min_ms']:>9.1f}"
                     f"{h['rtt_ms']:>9.2f}{bound:>9.1f}   {met(h['backend'] + ': p50 at poll ' + str(h['poll_s']) + ' s (ms)')}")

    if "notice" in r:
        L += ["", "3. Notice latency: waiter's `waiting` signal -> owner's on_release_requested (two processes)",
              f"  {'backend':<8}{'check s':>8}{'n':>5}{'p50 ms':>9}{'p99 ms':>9}{'RTT ms':>9}   reference: check/2 + 2 RTT"]
        for x in r["notice"]:
            ref = x["check_s"] * 500 + 2 * x["rtt_ms"]
            L.append(f"  {x['backend']:<8}{x['check_s']:>8}{x['n']:>5}{x['p50_ms']:>9.1f}{x['p99_ms']:>9.1f}{x['rtt_ms']:>9.2f}   {ref:>9.1f}")

    if "hot_path_ns" in r:
        L += ["", "4. Hot path, ns per call (timeit, best of 5)"]
        for k, ns in r["hot_path_ns"].items():
            L.append(f"  {k:<40}{ns:>8.1f}")

    if "scale" in r:
        s0 = r["scale"][0]
        L += ["", f"5. Scale: one process, N locks under one prefix on the emulator, ttl {s0['ttl_s']:.0f} s "
                  f"(renew every {s0['renew_interval_s']} s), check every {s0['check_interval_s']} s, {s0['window_s']:.0f} s window",
              "  setup: io = the scheduler's I/O workers; +50ms = every request held 50 ms before it is sent (a stand-in for real GCS)",
              "  locks  setup        threads  renewals  late p50  late p99  late max   req/s   (w/s, l/s, r/s)       check req  A/s     B/s    CPU %  lost  notice",
              "                      sch/proc           ms        ms        ms                                     /interval                              ms"]
        for s in r["scale"]:
            k = s["by_kind_per_s"]
            kinds = f"({k.get('write', 0)}, {k.get('list', 0)}, {k.get('read', 0)})"
            setup = (f"+{s['simulated_rtt_ms']:.0f}ms, " if s["simulated_rtt_ms"] else "") + f"io {s['io_workers']}"
            L.append(f"  {s['locks']:>5}  {setup:<12} {s['scheduler_threads']:>2}/{s['process_threads']:<4} {s['renewals']:>8}  "
                     f"{_f(s['lateness_p50_ms']):>8}  {_f(s['lateness_p99_ms']):>8}  {_f(s['lateness_max_ms']):>8}  "
                     f"{s['requests_per_s']:>7.2f}  {kinds:<21}{s['check_requests_per_interval']:>6.2f}  "
                     f"{s['class_a_per_s']:>7.2f} {s['class_b_per_s']:>6.2f} {s['cpu_percent']:>6.1f}  {s['lost']:>4}  {_f(s['notice_ms'])}")

    if "compare" in r:
        c = r["compare"]
        L += ["", f"6. What users would pick instead (same emulator, same run; {c['cycles']} uncontended cycles each)",
              f"  {'acquire + release, no contention':<46}{'acquire':>9}{'release':>9}{'cycle':>9}  requests  cycle vs ours"]
        base = c["ours"]["cycle"]["p50_ms"]
        rows = [("handofflock (min_write_interval=0)", c["ours"]), ("handofflock, default pacing (1 write/s/object)", c["ours_paced"]),
                ("gcslock 0.0.6", c["gcslock"]), ("seed 003 naive create/delete", c["naive"])]
        for label, x in rows:
            L.append(f"  {label:<46}{x['acquire']['p50_ms']:>9.2f}{x['release']['p50_ms']:>9.2f}{x['cycle']['p50_ms']:>9.2f}"
                     f"  {str(x.get('requests_per_cycle', '-')):>8}  {ratio(x['cycle']['p50_ms'], base):>9}")
        L.append("  (p50 ms. The paced row repeats cycles back to back on one object, so each write waits for the 1 s spacing.)")
        ours_h = [h for h in r.get("handoff", []) if h["backend"] == "gcs"]
        L += ["", f"  {'handoff: owner releases -> waiter holds':<46}{'n':>4}{'p50 ms':>10}{'p99 ms':>10}   vs ours"]
        ref = ours_h[-1] if ours_h else None
        for h in ours_h:
            L.append(f"  {'handofflock, poll ' + str(h['poll_s']) + ' s':<46}{h['n']:>4}{h['p50_ms']:>10.1f}{h['p99_ms']:>10.1f}")
        for label, x in ((f"seed 003 naive lock, polls every {c['naive_handoff']['poll_s']:.0f} s", c["naive_handoff"]),
                         (f"gcslock, {c['gcslock_handoff']['lease_s']} s lease (sleeps until expiry)", c["gcslock_handoff"])):
            L.append(f"  {label:<46}{x['n']:>4}{x['p50_ms']:>10.1f}{x['p99_ms']:>10.1f}   "
                     f"{ratio(x['p50_ms'], ref['p50_ms'] if ref else None)} (vs poll {ref['poll_s'] if ref else '-'} s)")

    if "async" in r:
        a0 = r["async"][0]
        L += ["", f"7. Event-loop lag: one process, N AsyncHandoffLocks held (renewed in the background) while M pairs hand off, "
                  f"{a0['window_s']:.0f} s window",
              f"   (a task sleeps {a0['probe_interval_ms']:.0f} ms at a time; lag = how late it wakes. Baseline: the same loop, no locks, just before.)",
              "   (GIL: sys.getswitchinterval() for the row, Python's default is 5 ms; writes, req/s: the held locks' store)",
              "  backend loop     GIL  locks hand-  ttl  renew  lag p50  lag p99  lag max  base p50  base p99  writes  req/s  handoff  CPU %  healthy  target",
              "                   ms          offs   s    s      ms       ms       ms       ms        ms        /s             p50 ms"]
        for a in r["async"]:
            name = _async_name(a)
            L.append(f"  {a['backend']:<7} {a['loop']:<8}{a['switch_interval_ms']:>4g}{a['locks']:>6} {a['handoffs_done']:>2}/{a['handoffs']:<3}{a['ttl_s']:>4.0f} {a['renew_interval_s']:>6.2f}"
                     f"{_f(a['lag_p50_ms']):>9}{_f(a['lag_p99_ms']):>9}{_f(a['lag_max_ms']):>9}{_f(a['baseline_p50_ms']):>10}{_f(a['baseline_p99_ms']):>10}"
                     f"{a['writes_per_s']:>8.1f}{a['requests_per_s']:>7.1f}{_f(a['handoff_p50_ms']):>9}{a['cpu_percent']:>7.1f}"
                     f"{a['healthy_at_end']:>7}/{a['locks']:<4} {('p99 < 5 ms: ' + met(name)) if met(name) else ''}")

    if r.get("targets"):
        missed = [t for t in r["targets"] if not t["met"]]
        L += ["", f"Targets: {len(r['targets']) - len(missed)} of {len(r['targets'])} met"]
        for t in missed:
            L.append(f"  NOT MET: {t['name']} = {t['value']} (target {t['target']})")
    return "\n".join(L)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _async_name(a: dict[str, Any]) -> str:
    return (f"{a['backend']}, {a['loop']}, ttl {a['ttl_s']:.0f} s, GIL switch {a['switch_interval_ms']:g} ms: "
            "event-loop lag p99 (ms)")


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target the brief sets, with the measured value and whether it was met."""
    out: list[dict[str, Any]] = []

    def add(kind: str, name: str, value: Any, target: str, met: bool) -> None:
        out.append({"kind": kind, "name": name, "value": value, "target": target, "met": bool(met)})

    for backend, counts in r.get("requests", {}).items():
        for op in COUNT_TARGETS:
            if op in counts:
                what, limit = count_target(backend, op)  # type: ignore[misc]
                value = counts[op]["writes" if what == "writes" else "total"]
                add("requests", f"{backend}: {op}", value, f"{what} <= {limit}", value <= limit)
    for h in r.get("handoff", []):
        bound = h["poll_s"] * 500 + 2 * h["rtt_ms"]
        add("handoff", f"{h['backend']}: p50 at poll {h['poll_s']} s (ms)", h["p50_ms"], f"<= {bound:.1f}", h["p50_ms"] <= bound)
    scale = [x for x in r.get("scale", []) if not x["simulated_rtt_ms"]]  # the slowed rows are an experiment, not the brief's
    if scale:
        most = max(s["scheduler_threads"] for s in scale)
        add("scale", "scheduler threads, 1 to %d locks" % scale[-1]["locks"], most,
            f"<= {1 + IO_WORKERS} (1 loop + {IO_WORKERS} I/O workers), whatever the count", most <= 1 + IO_WORKERS)
        for s in scale:
            if s["lateness_p99_ms"] is not None:
                add("scale", f"{s['locks']} locks: renewal lateness p99 (ms)", s["lateness_p99_ms"], "< 1000", s["lateness_p99_ms"] < 1000)
            add("scale", f"{s['locks']} locks: waiter-check requests per check interval", s["check_requests_per_interval"], "<= 2 (O(1))", s["check_requests_per_interval"] <= 2)
    for a in r.get("async", []):
        if a["locks"] >= 200 and a["handoffs"] >= 10:
            add("async", _async_name(a), a["lag_p99_ms"], "< 5", a["lag_p99_ms"] is not None and a["lag_p99_ms"] < 5)
    return out
