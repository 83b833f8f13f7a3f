"""The ``handofflock`` command: in-process through ``main([...])``, and as the real console script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from jobsutil import CONSOLE_SCRIPT, child_env, in_process, popen, runner_logic, shared_url  # noqa: F401
from lockparts import acquire_in_thread
from lockutil import eventually, make_lock, raw_read, raw_write

from handofflock import FakeClock, HandoffLock, LockRecord, Scheduler, StorageError, cli
from handofflock.cli import main
from handofflock.core.record import Holder, Waiter
from handofflock.core.timefmt import iso
from handofflock.exit_codes import (
    EXIT_CANNOT_EXECUTE,
    EXIT_CONFIG,
    EXIT_CONTENDED,
    EXIT_CORRUPT,
    EXIT_DECLINED,
    EXIT_LOST,
    EXIT_NOT_FOUND,
    EXIT_STORAGE,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)
from handofflock.storage import MemoryStorage, open_url
from childpipes import next_line

JOB = Path(__file__).resolve().parents[1] / "support" / "procs" / "job.py"
PY = sys.executable


@pytest.fixture
def url():
    name = f"cli-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}/locks/train.json"
    MemoryStorage.forget(name)


def quiet_lock(url, owner="trainer-A", **kw):
    clock = kw.pop("clock", None) or FakeClock(start=time.time())
    scheduler = kw.pop("scheduler", None)
    if scheduler is None:  # not `or`: a Scheduler with no locks yet is falsy (it has a length)
        scheduler = Scheduler(clock, autostart=False)
    return HandoffLock(url, ttl=60.0, owner_id=owner, clock=clock, scheduler=scheduler, **kw)


def put(url, data: bytes):
    store, key = open_url(url)
    found = store.read(key)
    return store.write(key, data, if_generation_match=found[1] if found else 0)


# --------------------------------------------------------------------------- status


def test_status_of_an_absent_lock_says_so(url, capsys):
    assert main(["status", url]) == 0
    assert "absent" in capsys.readouterr().out


def test_status_names_owner_waiter_token_generation_and_time_left(url, capsys):
    now = time.time()
    put(url, LockRecord(Holder("trainer-A", now + 42), Waiter("trainer-B", now + 50), ttl=60.0, token=1234).encode())
    assert main(["status", url]) == 0
    out = capsys.readouterr().out
    assert "held, lease live (4" in out and "trainer-A" in out
    assert "trainer-B (live" in out and "1234" in out and "generation" in out


def test_status_says_since_when_the_lock_is_held(url, capsys):
    now = time.time()
    put(url, LockRecord(Holder("trainer-A", now + 42), ttl=60.0, token=3, held_since=now - 100).encode())
    assert main(["status", url]) == 0
    out = capsys.readouterr().out
    assert "held since  " in out
    assert main(["status", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["heldSince"] == pytest.approx(now - 100, abs=0.01)
    assert doc["heldSinceIso"] == iso(doc["heldSince"]) and doc["heldSinceIso"] in out


def test_status_json_has_stable_keys_for_scripts(url, capsys):
    now = time.time()
    gen = put(url, LockRecord(Holder("trainer-A", now + 42), ttl=60.0, token=7).encode())
    assert main(["status", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {
        "url", "exists", "generation", "ownerId", "expiresAt", "heldSince", "waitingOwnerId", "waiterExpiresAt",
        "token", "ttl", "readAt", "ownerLive", "waiterLive", "state", "expiresIn", "waiterExpiresIn",
        # labels, the release request, and every time as ISO 8601 too
        "ownerLabel", "waiterLabel", "ownerGrace", "leaseSuspect", "expiresAtIso", "waiterExpiresAtIso", "readAtIso",
        "heldSinceIso",
        "releaseRequested", "releaseRequestedBy",
        # a patient waiter, its priority, and a declined request
        "waiterAsks", "waiterPriority", "releaseDeclined",
        # the holder's minimum hold: when a waiter's request is acted on
        "minHold", "minHoldEndsAt", "minHoldEndsAtIso",
    }
    assert (doc["state"], doc["ownerId"], doc["token"], doc["generation"], doc["ownerLive"]) == ("held", "trainer-A", 7, gen, True)
    assert 40 < doc["expiresIn"] <= 42
    assert (doc["heldSince"], doc["heldSinceIso"]) == (None, None)  # the record gives no start: null, as heldSince


def test_status_tells_an_expired_lease_from_a_live_one(url, capsys):
    put(url, LockRecord(Holder("gone", time.time() - 5), token=3).encode())
    assert main(["status", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "expired"
    assert main(["status", url]) == 0
    assert "ran out" in capsys.readouterr().out


def test_status_of_a_corrupt_record_says_how_to_clear_it(url, capsys):
    put(url, b"{not json")
    assert main(["status", url]) == EXIT_CORRUPT
    err = capsys.readouterr().err
    assert "corrupt" in err and f"handofflock release {url} --force" in err
    assert main(["status", url, "--json"]) == EXIT_CORRUPT
    assert json.loads(capsys.readouterr().out)["state"] == "corrupt"


def test_a_bad_url_is_exit_64_with_the_accepted_forms(capsys):
    assert main(["status", "ftp://nope/x.json"]) == EXIT_CONFIG
    assert "gs://bucket/path.json" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["release", "--force", "--yes"],
                                     ["watch", "--duration", "0"], ["run", "--", "true"]])
def test_a_directory_as_the_lock_url_is_a_bad_url_exit_64_not_an_outage(tmp_path, capsys, command):
    cut = command.index("--") if "--" in command else len(command)
    assert main([*command[:cut], str(tmp_path), *command[cut:]]) == EXIT_CONFIG
    assert f"{str(tmp_path)!r} names a directory, not a file; name a file in it" in capsys.readouterr().err


def test_a_bad_url_is_not_offered_the_in_process_memory_store(capsys):
    for bad in ("ftp://nope/x.json", "ftp:/nope/x.json"):
        assert main(["status", bad]) == EXIT_CONFIG
        err = capsys.readouterr().err
        assert "file:///path.json or a plain path" in err and "memory://" not in err


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["release", "--force", "--yes"],
                                     ["watch", "--duration", "0"], ["run", "--", "touch", "ran"]])
@pytest.mark.parametrize("memory", ["memory://cli/x.json", "MEMORY://cli", "mem://cli/x.json", "memory:/cli/x.json"])
def test_a_memory_url_on_the_command_line_is_refused_exit_64(command, memory, tmp_path, monkeypatch, capsys):
    cut = command.index("--") if "--" in command else len(command)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["handofflock", *command[:cut], memory, *command[cut:]])
    assert main() == EXIT_CONFIG
    assert "memory:// is a store inside one process" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists()


def test_the_console_script_refuses_a_memory_url_and_runs_nothing():
    proc = subprocess.run([str(CONSOLE_SCRIPT), "run", "memory://x/y.json", "--", "echo", "hi"], capture_output=True,
                          text=True, env=child_env(), timeout=60)
    assert (proc.returncode, proc.stdout) == (EXIT_CONFIG, "")
    assert "file:///path.json or a plain path on one host" in proc.stderr


def test_a_storage_failure_is_exit_69_with_the_stores_advice(url, capsys):
    store, _ = open_url(url)
    store.faults.fail_next("read", exc=lambda: StorageError("permission denied on bucket 'b': check which account ..."))
    assert main(["status", url]) == EXIT_STORAGE
    assert "permission denied" in capsys.readouterr().err


def test_usage_errors_are_exit_2(url, capsys):
    assert main([]) == EXIT_USAGE
    assert main(["status"]) == EXIT_USAGE
    assert main(["status", url, "--", "echo"]) == EXIT_USAGE
    assert main(["run", url]) == EXIT_USAGE
    assert main(["--help"]) == 0
    capsys.readouterr()


# --------------------------------------------------------------------------- release --force


def test_release_needs_force(url, capsys):
    quiet_lock(url).acquire()
    assert main(["release", url]) == EXIT_USAGE
    assert "--force" in capsys.readouterr().err
    assert raw_read(url)[0].owner_id == "trainer-A"


def test_release_force_frees_a_held_lock_moves_the_token_on_and_the_holder_finds_out(url, capsys):
    clock = FakeClock(start=time.time())
    sched = Scheduler(clock, autostart=False)
    holder = quiet_lock(url, clock=clock, scheduler=sched)
    holder.acquire()
    assert main(["release", url, "--force", "--yes"]) == 0
    err = capsys.readouterr().err
    assert f"held by {holder.label.text} (trainer-A)" in err and "LIVE" in err  # named as status names it
    record, _ = raw_read(url)
    assert record.owner_id is None and record.token > holder.token
    clock.advance(holder.renew_interval + 0.01)
    sched.run_pending()  # its next renewal sees the lock gone
    assert not holder.is_held
    newcomer = make_lock(url, owner_id="trainer-B")
    assert newcomer.acquire(blocking=False)
    assert newcomer.token > holder.token
    newcomer.release()


def test_release_force_clears_a_corrupt_record(url, capsys):
    put(url, b'{"ownerId": 5}')
    assert main(["release", url, "--force", "--yes"]) == 0
    assert "corrupt" in capsys.readouterr().err
    assert main(["status", url]) == 0 and "free" in capsys.readouterr().out
    newcomer = make_lock(url)
    assert newcomer.acquire(blocking=False)
    newcomer.release()


def test_release_force_asks_first_and_does_nothing_without_a_yes(url, capsys, monkeypatch):
    quiet_lock(url).acquire()
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # not a terminal: it must not guess
    assert main(["release", url, "--force"]) == EXIT_DECLINED
    assert "--yes" in capsys.readouterr().err
    assert raw_read(url)[0].owner_id == "trainer-A"

    class Tty:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Tty())
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert main(["release", url, "--force"]) == EXIT_DECLINED
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert main(["release", url, "--force"]) == 0
    assert raw_read(url)[0].owner_id is None


def test_release_force_writes_nothing_if_the_lock_moved_on_while_you_looked(url, capsys, monkeypatch):
    holder = quiet_lock(url)
    holder.acquire()

    class Tty:
        def isatty(self):
            return True

    def renew_while_reading(prompt):
        record, generation = raw_read(url)  # the holder renews between the description and the answer
        raw_write(url, record.replace(expires_at=record.expires_at + 30), generation)
        return "y"

    monkeypatch.setattr(sys, "stdin", Tty())
    monkeypatch.setattr("builtins.input", renew_while_reading)
    assert main(["release", url, "--force"]) == EXIT_CONTENDED
    assert "changed while you looked" in capsys.readouterr().err
    assert raw_read(url)[0].owner_id == "trainer-A"


def test_release_force_on_nothing_is_a_no_op(url, capsys):
    assert main(["release", url, "--force", "--yes"]) == 0
    assert "nothing to clear" in capsys.readouterr().out


# --------------------------------------------------------------------------- watch


class WatchSteps:
    """A story told in a thread in step with ``watch`` run in this process, instead of on sleeps: each change
    waits for two of watch's reads to end (the second began after the change, so the change was read and
    printed), and once the story is told, the read after one that began then is watch's Ctrl-C."""

    def __init__(self, monkeypatch):
        self.reads, self.told, self.over = 0, False, False
        self.cond = threading.Condition()
        real = cli.read_status

        def read_status(url, **kw):
            with self.cond:
                if self.over:
                    raise KeyboardInterrupt
                told = self.told
            status = real(url, **kw)
            with self.cond:
                self.reads += 1
                self.over = told
                self.cond.notify_all()
            return status

        monkeypatch.setattr(cli, "read_status", read_status)

    def seen(self):
        with self.cond:
            then = self.reads
            assert self.cond.wait_for(lambda: self.reads >= then + 2, timeout=30), "watch stopped reading"

    def told_all(self):
        with self.cond:
            self.told = True


def test_watch_prints_a_line_per_change(url, capsys, monkeypatch):
    steps = WatchSteps(monkeypatch)

    def story():
        a = make_lock(url, owner_id="trainer-A")
        b = make_lock(url, owner_id="trainer-B")
        steps.seen()
        a.acquire()
        steps.seen()
        t = threading.Thread(target=b.acquire)
        t.start()
        eventually(lambda: raw_read(url)[0].waiting_owner_id == "trainer-B", what="trainer-B waits")
        steps.seen()
        a.release()
        t.join()
        steps.seen()
        b.release()
        steps.told_all()

    teller = threading.Thread(target=story)
    teller.start()
    assert main(["watch", url, "--interval", "0.03", "--duration", "60", "--json"]) == 0
    teller.join()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    seen = [(d["state"], d["ownerId"], d["waitingOwnerId"] if d["waiterLive"] else None) for d in lines]
    assert seen[0] == ("absent", None, None)
    assert ("held", "trainer-A", None) in seen and ("held", "trainer-A", "trainer-B") in seen
    assert ("held", "trainer-B", None) in seen and seen[-1][0] == "free"
    assert len(seen) == len(set(seen)) or len(seen) < 8, "a line per change, not per read"


@runner_logic
def test_watch_in_the_console_script_ends_cleanly_on_ctrl_c(shared_url):
    proc = popen([str(CONSOLE_SCRIPT), "watch", shared_url, "--interval", "0.1"])
    assert "watching" in next_line(proc)
    assert "absent" in next_line(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


# --------------------------------------------------------------------------- run, in process


def test_run_holds_the_lock_around_the_command_and_exits_with_its_status(url, capfd):
    code = "import os, sys; print('token', os.environ['HANDOFFLOCK_TOKEN'], os.environ['HANDOFFLOCK_URL']); sys.exit(7)"
    assert main(["run", "-v", url, "--", PY, "-c", code]) == 7
    out, err = capfd.readouterr()
    assert "token " in out and url in out
    assert "acquired" in err and "exited with 7" in err
    assert raw_read(url)[0].owner_id is None, "released afterwards"


def test_run_says_its_command_was_killed_by_a_signal_and_exits_128_plus_n(url, capfd):
    assert main(["run", url, "--", "sh", "-c", "kill -TERM $$"]) == 128 + signal.SIGTERM
    err = capfd.readouterr().err
    assert "sh was killed by SIGTERM (exit status 143); released" in err and "exited with" not in err
    assert main(["run", url, "--", "sh", "-c", "exit 143"]) == 143  # a status of 143 is no signal
    assert "sh exited with 143; released" in capfd.readouterr().err


def test_run_reports_a_missing_command_as_127_without_asking_for_the_lock(url, capsys):
    assert main(["run", url, "--", "/no/such/command-here"]) == EXIT_NOT_FOUND
    assert raw_read(url)[0] is None, "the lock was never asked for"


def test_run_reports_a_command_it_cannot_execute_as_126_without_asking_for_the_lock(url, tmp_path, capsys):
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    assert main(["run", url, "--", str(script)]) == EXIT_CANNOT_EXECUTE
    assert "cannot execute" in capsys.readouterr().err
    assert raw_read(url)[0] is None, "the lock was never asked for"


def test_run_nonblock_on_a_held_lock_is_contended_silently_as_flock(url, capsys):
    quiet_lock(url).acquire()
    # As `flock -n`, which cron jobs use to skip a run: exit status only, no line for cron to mail.
    assert main(["run", url, "-n", "--", PY, "-c", "pass"]) == EXIT_CONTENDED
    assert capsys.readouterr().err == ""
    # -v says who holds it.
    assert main(["run", url, "-n", "-v", "--", PY, "-c", "pass"]) == EXIT_CONTENDED
    assert "trainer-A" in capsys.readouterr().err


def test_run_timeout_is_124(url, capsys):
    quiet_lock(url).acquire()
    started = time.monotonic()
    code = main(["run", url, "-q", "--timeout", "0.2", "--poll-interval", "0.05", "--min-hold", "0", "--", PY, "-c", "pass"])
    assert code == EXIT_TIMEOUT
    assert time.monotonic() - started < 5


def test_run_behind_another_waiter_waits_its_turn(url, capsys):
    quiet_lock(url).acquire()
    other = make_lock(url, owner_id="other-waiter", waiter_ttl=30.0)
    t = acquire_in_thread(other, timeout=3)
    eventually(lambda: (raw_read(url)[0] or LockRecord()).waiting_owner_id == "other-waiter")
    # Behind another waiter a blocking run waits for the slot, as a blocking acquire does: here until
    # its --timeout, still naming who waits. Only --nonblock answers "contended" at once.
    assert main(["run", url, "-q", "--timeout", "0.3", "--", PY, "-c", "pass"]) == EXIT_TIMEOUT
    assert "other-waiter" in capsys.readouterr().err
    assert main(["run", url, "-q", "-n", "--", PY, "-c", "pass"]) == EXIT_CONTENDED
    other.cancel()
    t.join(5)


# --------------------------------------------------------------------------- run, end to end


def run_cmd(url, name, ckpt, *extra, job_args=()):
    return [str(CONSOLE_SCRIPT), "run", "-v", url, "--ttl", "6", "--poll-interval", "0.2", "--min-hold", "0", *extra,
            "--", PY, str(JOB), name, str(ckpt), *job_args]


def second_run(url, name, ckpt, capfd, *extra, job_args=()):
    """The run that asks, in this process (the one asked, the real command, is what gets the signal): it
    returns once its job has run, with the job's output and its own words."""
    # --timeout: a run that never got the lock fails this test, instead of hanging the pytest process it runs in.
    return in_process(run_cmd(url, name, ckpt, "--timeout", "60", *extra, job_args=job_args)[1:], capfd)


@pytest.mark.timeout(90)
def test_run_hands_off_to_a_second_run_which_resumes_from_the_checkpoint(shared_url, tmp_path, capfd):
    a = popen(run_cmd(shared_url, "A", tmp_path, "--signal", "USR1", "--grace", "20"))
    first = next_line(a)
    assert first.startswith("A start 0 token"), first + a.stderr.read()
    token_a = int(first.split()[-1])
    b = second_run(shared_url, "B", tmp_path, capfd, job_args=["--steps", "5"])
    out_a, err_a = a.communicate(timeout=60)
    assert a.returncode == 0, err_a
    assert "asks for" in err_a and "sending SIGUSR1" in err_a and "handed" in err_a
    done_a = int(out_a.split("checkpointed ")[1].split()[0])
    assert "on SIGUSR1" in out_a
    out_b, err_b = b.stdout, b.stderr
    assert b.returncode == 0, err_b
    start_b, token_b = out_b.split()[2], int(out_b.split()[4])
    assert int(start_b) == done_a + 1, (out_a, out_b)
    assert token_b > token_a
    assert "waiting for" in err_b


@runner_logic
@pytest.mark.timeout(90)
def test_a_command_that_ignores_the_signal_is_killed_after_the_grace_then_the_lock_moves_on(
    shared_url, tmp_path, capfd
):
    a = popen(run_cmd(shared_url, "A", tmp_path, "--grace", "1", job_args=["--ignore-signals"]))
    assert next_line(a).startswith("A start")
    b = second_run(shared_url, "B", tmp_path, capfd, job_args=["--steps", "1"])
    out_a, err_a = a.communicate(timeout=60)
    assert a.returncode == 128 + signal.SIGKILL, err_a
    assert "did not exit within 1 s; killing it" in err_a
    assert b.returncode == 0 and b.stdout.startswith("B start 0"), b.stderr


@runner_logic
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_run_is_passed_on_and_the_lock_released_when_the_command_exits(shared_url, tmp_path, sig):
    a = popen(run_cmd(shared_url, "A", tmp_path, job_args=["--exit", "0"]))
    assert next_line(a).startswith("A start")
    a.send_signal(sig)
    out, err = a.communicate(timeout=30)
    assert a.returncode == 0, err
    assert f"on {sig.name}" in out and f"passing {sig.name} on to {PY}" in err
    assert HandoffLock(shared_url).status().owner_id is None


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)  # a zombie
    except FileNotFoundError:
        return True


@runner_logic
@pytest.mark.timeout(60)
def test_the_whole_command_is_stopped_before_the_lock_moves_on_not_just_its_shell(shared_url, tmp_path):
    """``run -- sh -c 'python train.py; ...'``: the signal must reach the trainer, not only the shell,
    or the trainer keeps working on the resource after the lock was handed on."""
    worker = f"{PY} -c 'import os, time; print(\"pid\", os.getpid(), flush=True); time.sleep(60)'; echo after"
    a = popen([str(CONSOLE_SCRIPT), "run", shared_url, "--grace", "10", "--", "sh", "-c", worker])
    line = next_line(a)
    assert line.startswith("pid"), line + a.stderr.read()
    grandchild = int(line.split()[1])
    a.send_signal(signal.SIGTERM)
    out, err = a.communicate(timeout=30)
    assert _gone(grandchild), f"the trainer outlived its run:\n{err}"
    assert HandoffLock(shared_url).status().owner_id is None


@runner_logic
@pytest.mark.timeout(60)
def test_sigterm_to_a_waiting_run_stops_it_and_gives_the_slot_back(shared_url, tmp_path):
    # Renewals far apart: this is about the waiter's give-up, not its race with the owner's renewals
    # (on a paced store a give-up write waits out the write spacing after its read, and an owner
    # renewing every second would win that race every time).
    holder = make_lock(shared_url, owner_id="holder", ttl=30.0, renew_interval=10.0, renew_deadline=20.0)
    holder.acquire()
    try:
        w = popen(run_cmd(shared_url, "W", tmp_path))
        eventually(lambda: HandoffLock(shared_url).status().waiter_live, timeout=20, what="the run registered as waiter")
        w.send_signal(signal.SIGTERM)
        out, err = w.communicate(timeout=30)
        assert w.returncode == 128 + signal.SIGTERM, err
        assert "stopped by SIGTERM while waiting" in err and out == ""
        assert HandoffLock(shared_url).status().waiter_id is None
    finally:
        holder.release()


def catches_sigterm(ckpt: Path) -> bool:
    """A job of this test (its checkpoint folder ``ckpt``) is running and has its SIGTERM handler in place."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            caught = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("SigCgt:"))
        except (OSError, StopIteration):
            continue
        if str(JOB) in args and str(ckpt) in args and int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1:
            return True
    return False


@runner_logic
@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_lock_lost_under_run_stops_the_command_and_exits_70(shared_url, tmp_path, capfd):
    """``run`` in this process around a real job; the lock is taken from it by ``release --force`` in a
    thread once the job is ready to answer SIGTERM.

    ``release --force`` writes only over the generation it read, and declines (75) when a renewal lands in
    between, as it may on a loaded machine: it is tried again. The job ends by itself after some 30 s, so
    a release that never lands fails this test instead of running past its timeout (which ends the worker)."""
    released = []

    def take_it():
        eventually(lambda: catches_sigterm(tmp_path), timeout=30, what="the job started")
        for _ in range(10):
            released.append(main(["release", shared_url, "--force", "--yes"]))
            if released[-1] != EXIT_CONTENDED:
                break

    thread = threading.Thread(target=take_it, daemon=True)
    thread.start()
    ttl = "2"  # the loss is found by the next renewal
    job = [PY, str(JOB), "A", str(tmp_path), "--steps", "1500"]
    code = main(["run", shared_url, "--ttl", ttl, "--grace", "10", "--", *job])
    thread.join(30)
    out, err = capfd.readouterr()
    assert released and released[-1] == 0, (released, err)
    assert out.startswith("A start")
    assert code == EXIT_LOST, err
    assert "LOST" in err and "on SIGTERM" in out


def test_the_console_script_reports_status(shared_url):
    proc = subprocess.run([str(CONSOLE_SCRIPT), "status", shared_url, "--json"], capture_output=True, text=True, env=child_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["state"] == "absent"
