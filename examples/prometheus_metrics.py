#!/usr/bin/env python3
"""Serve handofflock's metrics to Prometheus while two workers hand a lock back and forth.

    pip install 'handofflock[otel]' opentelemetry-sdk opentelemetry-exporter-prometheus
    python examples/prometheus_metrics.py --port 9464
    curl -s http://127.0.0.1:9464/metrics | grep handofflock_

The application, not the library, sets up metrics: it installs a meter
provider whose reader is the OpenTelemetry Prometheus exporter, and serves
``/metrics`` with ``prometheus_client``. handofflock records into whatever
provider is set (docs/observability.md lists the instruments). The lock lives
on the local backend, so nothing else is needed; a ``gs://`` URL (``--url``)
works the same.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import start_http_server

from handofflock import HandoffLock


def worker(url: str, name: str, stop: threading.Event, rounds: list[int]) -> None:
    # min_hold=0: a holder is asked at once (a demo of handoffs; real jobs keep the default minimum hold).
    lock = HandoffLock(url, ttl=3.0, waiter_check_interval=0.2, waiter_poll_interval=0.1, owner_id=name, min_hold=0)
    while not stop.is_set():
        with lock:  # waits as the single waiter while the other worker holds it
            for _ in lock.steps(range(10)):  # "work" until the other worker asks for the lock
                if stop.wait(0.1):
                    break
            rounds.append(lock.token or 0)
        # leaving the block handed the lock to the other worker, which waited for it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=9464, help="port for /metrics on 127.0.0.1 (default 9464)")
    parser.add_argument("--url", default=None, help="lock URL (default: a file in a temporary directory)")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
    args = parser.parse_args()

    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
    start_http_server(args.port, addr="127.0.0.1")

    with tempfile.TemporaryDirectory(prefix="handofflock-metrics-") as tmp:
        url = args.url or str(Path(tmp) / "train.json")
        stop, rounds = threading.Event(), []
        workers = [threading.Thread(target=worker, args=(url, name, stop, rounds), daemon=True) for name in ("alice", "bob")]
        for thread in workers:
            thread.start()
            time.sleep(0.3)  # alice takes the lock first; bob becomes the waiter
        print(f"serving http://127.0.0.1:{args.port}/metrics for lock {url}", flush=True)
        started = time.monotonic()
        try:
            while args.duration is None or time.monotonic() - started < args.duration:
                time.sleep(0.5)
                print(f"handoffs so far: {len(rounds)}", flush=True)
        except KeyboardInterrupt:
            pass
        stop.set()
        for thread in workers:
            thread.join(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
