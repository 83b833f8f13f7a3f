"""``handofflock run`` where no cgroup can be made: no descendant of CMD outlives the hold.

Each test runs ``run`` the way a Kubernetes pod with a read-only cgroup mount
does: in a private mount namespace whose cgroup mounts are remounted read-only
(root only; skipped elsewhere). CMD starts processes that leave its session (a
double-forked ``setsid`` daemon, torchrun's workers), a waiter asks for the
lock, and the waiter's own command, which runs only once the lock is its,
records whether any of those processes is still alive at that moment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from jobsutil import CONSOLE_SCRIPT, child_env, in_process
from lockutil import eventually, raw_read

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the guarantees are Linux's")]

#: ``nocgroup CMD...``: CMD in a private mount namespace where every cgroup mount is read-only
#: (as /work/shared/tools/nocgroup.sh, kept here so the tests need nothing outside the tree).
_NOCGROUP = """
for m in $(awk '$3 == "cgroup" || $3 == "cgroup2" || $2 == "/sys/fs/cgroup" {print $2}' /proc/self/mounts); do
  mount -o remount,bind,ro "$m" 2>/dev/null || true
done
exec "$@"
"""


def nocgroup(*cmd: str) -> list[str]:
    return ["unshare", "-m", "sh", "-c", _NOCGROUP, "sh", *cmd]


def _no_cgroup_there() -> bool:
    """Whether ``nocgroup`` works here, and run inside it really cannot make a cgroup."""
    # A private helper, reached on purpose: whether run itself could make a cgroup here.
    probe = "from handofflock.runner import _make_cgroup; import sys; sys.exit(0 if _make_cgroup() is None else 1)"
    try:
        done = subprocess.run(nocgroup(sys.executable, "-c", probe), capture_output=True, timeout=30, env=child_env())
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


NOCGROUP = pytest.mark.skipif(
    os.geteuid() != 0 or not _no_cgroup_there(), reason="needs root for a private mount namespace (unshare -m)"
)

#: The waiter's command: whether each pid written in the files named is alive, now that the lock is the waiter's.
_RECORD = """
import json, sys
from pathlib import Path
def alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
pids = [int(Path(p).read_text()) for p in sys.argv[2:]]
Path(sys.argv[1]).write_text(json.dumps({str(pid): alive(pid) for pid in pids}))
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _pid_in(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _hand_over(tmp_path: Path, holder_cmd: list[str], pid_files: list[Path], capfd: pytest.CaptureFixture[str], *,
               grace: str, timeout: float) -> dict:
    """Start ``run`` holding the lock around ``holder_cmd`` (no cgroup), wait for ``pid_files``, then a
    waiter (a ``run`` in this process, its command a process of its own); return what the waiter's command
    saw at its start, with every process cleaned up after."""
    url = (tmp_path / "lock.json").as_uri()
    seen = tmp_path / "seen.json"
    log = tmp_path / "holder.log"  # a file, not a pipe: a process that outlives run would keep a pipe open
    with open(log, "w") as out:
        holder = subprocess.Popen(
            nocgroup(str(CONSOLE_SCRIPT), "run", url, "--grace", grace, "--poll-interval", "0.2", "--min-hold", "0", "--", *holder_cmd),
            stdout=out, stderr=out, env=child_env(),
        )
    waiter = None
    try:
        pids = eventually(lambda: [p for f in pid_files if (p := _pid_in(f))] if all(_pid_in(f) for f in pid_files) else None,
                          timeout=timeout, interval=0.1, what="the command's processes started")
        assert holder.poll() is None, log.read_text()
        waiter = in_process(
            ["run", url, "--poll-interval", "0.2", "--min-hold", "0", "--timeout", str(timeout), "--",
             sys.executable, "-c", _RECORD, str(seen), *map(str, pid_files)],
            capfd,
        )
        holder.wait(30)
        holder_out = log.read_text()
        assert waiter.returncode == 0, waiter.stderr + holder_out
        assert raw_read(url)[0].owner_id is None
        return {"seen": json.loads(seen.read_text()), "pids": pids, "holder": holder_out}
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(20)
        for f in pid_files:  # whatever outlived everything (the bug this file is about): not past the test
            if (pid := _pid_in(f)) is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)


@NOCGROUP
@pytest.mark.timeout(90)
def test_a_daemon_that_left_the_session_is_gone_before_the_lock_moves_on_without_a_cgroup(tmp_path, capfd):
    """CMD double-forks a daemon into a session of its own that ignores the stop signal, and exits when
    asked. Before, the lock was handed on as soon as CMD's session was empty, the daemon running."""
    daemon = tmp_path / "daemon.pid"
    script = (f"(setsid sh -c 'trap \"\" TERM; echo $$ > {daemon}; exec sleep 300' &); "
              "trap 'exit 0' TERM; sleep 300 & wait")
    result = _hand_over(tmp_path, ["sh", "-c", script], [daemon], capfd, grace="2", timeout=40)
    assert not any(result["seen"].values()), f"alive when the lock moved on: {result['seen']}\n{result['holder']}"


TRAINER = """
import os, signal, sys, time
from pathlib import Path
# A rank that takes long to checkpoint after SIGTERM: longer than run's grace.
signal.signal(signal.SIGTERM, lambda s, f: time.sleep(300))
Path(sys.argv[1], f"worker-{os.environ['RANK']}.pid").write_text(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


@NOCGROUP
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_torchrun_workers_are_gone_before_the_lock_moves_on_without_a_cgroup(tmp_path, capfd):
    """torchrun starts each worker in a session of its own. Before, run SIGKILLed torchrun after the
    grace and handed the lock on while both workers kept running."""
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun is not installed")
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", "--max-restarts", "0", str(script), str(tmp_path)]
    workers = [tmp_path / "worker-0.pid", tmp_path / "worker-1.pid"]
    result = _hand_over(tmp_path, cmd, workers, capfd, grace="2", timeout=120)
    assert len(set(result["pids"])) == 2
    assert not any(result["seen"].values()), f"alive when the lock moved on: {result['seen']}\n{result['holder']}"


@NOCGROUP
@pytest.mark.timeout(90)
def test_a_nested_run_leaves_nothing_of_its_command_without_a_cgroup(tmp_path, capfd):
    """run A -- run B -- CMD, where CMD ignores SIGTERM and starts a daemon in a session of its own:
    the inner run is a subreaper too, but it is a descendant of the outer one, so the outer run's
    SIGKILL after its grace reaches everything before lock A moves on."""
    daemon = tmp_path / "daemon.pid"
    inner = [str(CONSOLE_SCRIPT), "run", str(tmp_path / "b.json"), "--grace", "30", "--",
             "sh", "-c", f"trap '' TERM; (setsid sh -c 'echo $$ > {daemon}; exec sleep 300' &); sleep 300 & wait"]
    result = _hand_over(tmp_path, inner, [daemon], capfd, grace="1", timeout=40)
    assert not any(result["seen"].values()), f"alive when the lock moved on: {result['seen']}\n{result['holder']}"
