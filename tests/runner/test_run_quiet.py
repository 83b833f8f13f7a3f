"""A quiet ``run``: nothing on stderr when it succeeds (cron mails every line; flock prints nothing), words
that read as what they are (a patient waiter asks nobody; a holder that declines is said to), and people
named by their labels, as ``status`` names them.

Through the real ``handofflock`` command where what a process prints is the point; the release request's
label on a lock in this process, on a fake clock.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid

import pytest
from jobsutil import CONSOLE_SCRIPT, child_env, in_process
from lockutil import eventually, raw_read, raw_write

from handofflock import FakeClock, HandoffLock, Label, Scheduler
from handofflock._waitline import WaitLine  # private module: run's waiting line, tested on its own
from handofflock.lock.types import LockStatus

pytestmark = pytest.mark.timeout(120)


def run(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([str(CONSOLE_SCRIPT), "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(), **kw)


def held_for(url: str, seconds: float) -> HandoffLock:
    """A labelled holder in this process that lets go after ``seconds``."""
    holder = HandoffLock(url, owner_id="holder", label=Label("pod=ml/train-0", grace=7.0), waiter_check_interval=0.2)
    assert holder.acquire()
    threading.Timer(seconds, holder.release).start()
    return holder


def test_run_that_succeeds_prints_nothing_on_stderr_even_after_a_wait(tmp_path):
    url = (tmp_path / "lock.json").as_uri()
    at_once = run(url, "--", "true")
    _, err = at_once.communicate(timeout=60)
    assert at_once.returncode == 0 and err == "", err
    held_for(url, 2.5)
    waited = run(url, "--poll-interval", "0.2", "--min-hold", "0", "--", "true")
    _, err = waited.communicate(timeout=60)
    assert waited.returncode == 0 and err == "", err


def test_run_v_says_what_it_does(tmp_path, capfd):
    url = (tmp_path / "lock.json").as_uri()
    done = in_process(["run", "-v", url, "--", "true"], capfd)
    assert done.returncode == 0
    assert "acquired" in done.stderr and "exited with 0; released" in done.stderr


def test_a_run_that_fails_still_says_so(tmp_path, capfd):
    done = in_process(["run", (tmp_path / "lock.json").as_uri(), "--", "false"], capfd)
    assert done.returncode == 1
    assert "false exited with 1; released" in done.stderr


def test_a_patient_waiter_never_says_notified_no(tmp_path):
    """``run --no-request`` asks nobody: its waiting line says it waits for the holder to finish."""
    url = (tmp_path / "lock.json").as_uri()
    held_for(url, 4.0)
    patient = run("-v", url, "--no-request", "--poll-interval", "0.2", "--min-hold", "0", "--", "true")
    _, err = patient.communicate(timeout=60)
    assert patient.returncode == 0, err
    assert "held by pod=ml/train-0; waiting for it to finish (not asking it to yield)" in err, err
    assert "notified" not in err, err


def test_the_asker_says_declined_by_the_holder_instead_of_a_grace_deadline(tmp_path):
    """Both ``run``s real: the holder declines (``--no-yield``), and the asker's line says so by the holder's
    label as soon as the record does, instead of "notified yes; grace ends by ..."."""
    url, flag = (tmp_path / "lock.json").as_uri(), tmp_path / "done"
    holder = run(url, "--no-yield", "--label", "trainer-A", "--ttl", "3", "--poll-interval", "0.2", "--min-hold", "0", "--",
                 "sh", "-c", f"while [ ! -e '{flag}' ]; do sleep 0.05; done")
    lines: list[str] = []
    asker = None
    try:
        eventually(lambda: (raw_read(url)[0] or None) and raw_read(url)[0].owner_id, timeout=30, what="the holder")
        asker = run("-v", url, "--poll-interval", "0.2", "--min-hold", "0", "--timeout", "60", "--", "true")
        reader = threading.Thread(target=lambda: lines.extend(asker.stderr), daemon=True)
        reader.start()
        eventually(lambda: any("declined by trainer-A" in ln for ln in lines), timeout=30,
                   what="the asker saying the holder declined")
    finally:
        flag.touch()
        holder.communicate(timeout=30)
        if asker is not None:
            asker.wait(timeout=30)
            reader.join(10)
    assert holder.returncode == 0
    assert asker.returncode == 0, lines
    assert not any("grace ends by" in ln for ln in lines), lines


class _Lock:
    url = "memory://x/lock.json"
    owner_id = "me"
    instance = "i1"  # the line knows itself by instance: a holder or waiter with our owner id may be another party

    def __init__(self, st: LockStatus) -> None:
        self.st = st

    def status(self) -> LockStatus:
        return self.st


def test_the_waiting_line_reads_declined_from_the_record(monkeypatch):
    from handofflock.core.record import Holder, LockRecord, Waiter
    from handofflock.storage import records

    # The line names any store of its process that is down (run's is its only one); in the suite's
    # process another test's store may be: this line is about the record alone.
    monkeypatch.setattr(records, "down", dict)

    now = time.time()
    record = LockRecord(Holder("vm:1:ab", now + 30, label=Label("pod=ml/train-0", grace=30.0)),
                        Waiter("me", now + 30, instance="i1"), ttl=30.0, token=3, nonce="n", declined=True)
    line = WaitLine(_Lock(LockStatus.of("memory://x/lock.json", record, 1, now)), stream=open("/dev/null", "w"))
    line._read()
    text = line.text()
    assert "declined by pod=ml/train-0" in text and "notified" not in text and "grace" not in text, text


def test_a_release_request_carries_the_waiters_label():
    clock = FakeClock(start=time.time())
    url = f"memory://labels-{uuid.uuid4().hex[:8]}/lock.json"
    sched = Scheduler(clock, autostart=False)
    holder = HandoffLock(url, ttl=30.0, owner_id="holder", clock=clock, scheduler=sched, waiter_check_interval=1.0,
                         min_hold=0)  # the label is the subject, not when it is acted on
    assert holder.acquire()
    record, generation = raw_read(url)
    raw_write(url, record.replace(waiting_owner_id="vm:13545:f8884428", waiter_expires_at=clock.time() + 60,
                                  waiter_label=Label("eval-job"), nonce="w"), generation)
    for _ in range(50):
        if holder.release_requested:
            break
        clock.advance(0.5)
        sched.run_pending()
    request = holder.release_request
    assert request is not None and request.requester == "vm:13545:f8884428"
    assert request.label == "eval-job" and request.who == "eval-job (vm:13545:f8884428)"
    holder.release()


def test_release_force_names_the_holder_and_the_waiter_by_their_labels(tmp_path, capfd):
    url = (tmp_path / "lock.json").as_uri()
    from handofflock.core.record import Holder, LockRecord, Waiter

    now = time.time()
    raw_write(url, LockRecord(Holder("vm:1:ab", now + 30, label=Label("pod=ml/train-0")),
                              Waiter("vm:2:cd", now + 30, label=Label("eval-job")), ttl=30.0, token=3, nonce="n"), 0)
    done = in_process(["release", url, "--force", "--yes"], capfd)
    assert done.returncode == 0, done.stderr
    assert "held by pod=ml/train-0 (vm:1:ab)" in done.stderr and "waiter eval-job (vm:2:cd)" in done.stderr
