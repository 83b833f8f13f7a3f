"""Where ``handofflock run`` sends the polite signal, through the real command (the run that asks for the lock
in this process).

A trainer with a SIGTERM handler and one spawned helper process (what a
PyTorch DataLoader has) needs its helper for the step it finishes and the
checkpoint it writes. Sent to the whole process group, SIGTERM killed the
helper, the trainer blocked on it until the SIGKILL after the grace, and no
checkpoint was written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobsutil import CONSOLE_SCRIPT, child_env, in_process
from lockutil import eventually, raw_read

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"), pytest.mark.timeout(90)]

#: A trainer: each step fetches a batch from its spawned worker (as from a DataLoader); on SIGTERM it
#: finishes the step, which needs the worker, writes a checkpoint and exits 0.
TRAINER = """
import multiprocessing as mp, os, signal, sys
from pathlib import Path

def worker(requests, batches):
    for i in iter(requests.get, None):
        batches.put(i)

if __name__ == "__main__":
    out = Path(sys.argv[1])
    stop = []
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    ctx = mp.get_context("spawn")
    requests, batches = ctx.Queue(), ctx.Queue()
    helper = ctx.Process(target=worker, args=(requests, batches))
    helper.start()
    step = 0
    while True:
        requests.put(step)
        batches.get()  # blocks for ever if the worker is gone
        if step == 0:
            (out / "worker.pid").write_text(str(helper.pid))
        if stop:
            break
        step += 1
    (out / "ckpt").write_text(str(step))
    requests.put(None)
    helper.join()
"""


def _start(tmp_path: Path, *cmd: str, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    url = (tmp_path / "lock.json").as_uri()
    log = open(tmp_path / "holder.log", "w")  # a file: a helper left running would hold a pipe open
    proc = subprocess.Popen([str(CONSOLE_SCRIPT), "run", url, "--grace", "20", "--poll-interval", "0.2", "--min-hold", "0", *extra,
                             "--", *cmd], stdout=log, stderr=log, env=child_env())
    log.close()
    return proc


def _ask_for_the_lock(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess:
    """A ``run`` in this process that asks for the lock: what is checked is the holder's process and its command."""
    return in_process(["run", (tmp_path / "lock.json").as_uri(), "--poll-interval", "0.2", "--timeout", "60", "--", "true"],
                      capfd)


def _cleanup(proc: subprocess.Popen, tmp_path: Path) -> None:
    if proc.poll() is None:
        proc.kill()  # the command and its helper die with run (parent-death signal, watchdog)
        proc.wait(20)
    pid = tmp_path / "worker.pid"
    if pid.exists():
        try:
            os.kill(int(pid.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("wrapped", [False, True], ids=["trainer", "shell-around-trainer"])
def test_a_trainer_with_a_helper_process_checkpoints_when_a_waiter_asks(tmp_path, wrapped, capfd):
    """By default the polite signal goes to CMD's own process; its helper stays up for the last step.
    Wrapped in a shell that does not exec it (``sh -c 'python train.py; ...'``), the shell gets the
    signal and exits, and the trainer it left gets it then, with the rest of the grace."""
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    cmd = ("sh", "-c", f'{sys.executable} {script} {tmp_path}; echo after') if wrapped else (sys.executable, str(script), str(tmp_path))
    holder = _start(tmp_path, *cmd)
    try:
        eventually(lambda: (tmp_path / "worker.pid").exists(), timeout=30, what="the trainer's first step")
        started = time.monotonic()
        waiter = _ask_for_the_lock(tmp_path, capfd)
        took = time.monotonic() - started
        log = (tmp_path / "holder.log").read_text()
        assert waiter.returncode == 0, waiter.stderr + log
        holder.wait(20)
        assert (tmp_path / "ckpt").exists(), f"no checkpoint:\n{log}"
        assert "did not exit within" not in log and took < 15, f"{took:.1f} s:\n{log}"  # well inside the 20 s grace
        if not wrapped:
            assert holder.returncode == 0, log
        assert raw_read((tmp_path / "lock.json").as_uri())[0].owner_id is None
    finally:
        _cleanup(holder, tmp_path)


#: CMD with one helper in its process group. The helper records whether its parent (CMD) was still
#: there when the polite signal reached it; CMD gives the helper 2 s to go before exiting itself.
GROUP_MEMBER = r"""
import os, signal, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[1])
HELPER = '''
import os, signal, sys, time
from pathlib import Path
parent = os.getppid()
def on_term(s, f):
    Path(sys.argv[1]).write_text("with its parent" if os.getppid() == parent else "after its parent")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
Path(sys.argv[1] + ".ready").write_text("")
time.sleep(60)
'''
helper = subprocess.Popen([sys.executable, "-c", HELPER, str(out / "helper")])
def on_term(s, f):
    try:
        helper.wait(2)
    except subprocess.TimeoutExpired:
        pass
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("to, helper_got_it", [("group", "with its parent"), ("main", "after its parent")])
def test_signal_to_says_whether_the_process_group_gets_the_polite_signal(tmp_path, to, helper_got_it):
    """``group``: every process of CMD's group at once. ``main``: CMD's own process; what it leaves
    behind when it exits gets the signal then."""
    holder = _start(tmp_path, sys.executable, "-c", GROUP_MEMBER, str(tmp_path), extra=("--signal-to", to))
    try:
        eventually(lambda: (tmp_path / "helper.ready").exists(), timeout=30, what="the helper started")
        os.kill(holder.pid, signal.SIGTERM)  # passed on as the polite signal
        holder.wait(40)
        log = (tmp_path / "holder.log").read_text()
        assert (tmp_path / "helper").read_text() == helper_got_it, log
        assert holder.returncode == 0 and "did not exit within" not in log, log
    finally:
        _cleanup(holder, tmp_path)


def test_signal_to_refuses_anything_else(tmp_path, capsys):
    proc = in_process(["run", str(tmp_path / "lock.json"), "--signal-to", "all", "--", "true"], capsys)
    assert proc.returncode == 2 and "--signal-to" in proc.stderr
