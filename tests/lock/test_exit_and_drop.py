"""Interpreter exit and a dropped lock: exit never waits for a receiver.

Release at exit across real processes is in tests/processes/test_exit_release.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest


@pytest.mark.timeout(60)
def test_exit_does_not_wait_for_a_receiver(tmp_path):
    script = textwrap.dedent(f"""
        import threading, time
        from handofflock import HandoffLock, signals
        lock = HandoffLock({str(tmp_path / 'lock.json')!r}, ttl=2.0, renew_interval=0.2, renew_deadline=1.0)
        lock.acquire()
        running = threading.Event()
        signals.on_release_requested.connect(lambda s, **kw: (running.set(), time.sleep(60)), sender=lock, weak=False)
        lock.request_release("manual")
        assert running.wait(30)  # the receiver is running
        print("exiting", flush=True)
    """)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert "exiting" in proc.stdout
    assert time.monotonic() - started < 30, "interpreter exit waited for the receiver"
