"""Each example in examples/ runs (short settings) and says what it should."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest
from fake_metadata import FakeMetadataServer
from jobsutil import CONSOLE_SCRIPT, ROOT, child_env, runner_logic, shared_url  # noqa: F401

from handofflock import HandoffLock
from childpipes import next_line

EXAMPLES = ROOT / "examples"

# The examples take any lock URL and do the same with it. trainer_yield.py, the first, runs on a local file
# and on the emulator; the rest on a local file only (``runner_logic``): their GCS runs are the suite's own
# (a release by SIGTERM, test_signal_handlers.py; run's handoff, test_cli.py; the async lock across
# processes, tests/processes/test_aio_processes.py), and a preemption notice asks for a release, as a
# signal does, whatever the store (tests/integrations/test_preemption*.py).


def example(name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(EXAMPLES / name), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or child_env())


def read_until(proc: subprocess.Popen, pattern: str, timeout: float = 30) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = next_line(proc)
        if not line:
            break
        lines.append(line)
        if re.search(pattern, line):
            return lines
    raise AssertionError(f"no line matching /{pattern}/ in {lines!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}")


@pytest.mark.timeout(120)
def test_trainer_yield_hands_over_at_a_checkpoint_and_the_next_trainer_resumes_there(shared_url, tmp_path):
    # A's steps leave B 12 s to start and ask (a busy 2-core machine took more than A's 2.5 s of 150
    # steps); B, once it resumes, runs the rest quickly.
    common = ["--url", shared_url, "--checkpoints", str(tmp_path / "ckpts"), "--steps", "600", "--check-interval", "0.2"]
    a = example("trainer_yield.py", "--name", "A", *common, "--step-time", "0.02")
    seen_a = read_until(a, r"^A: step 25 ")
    b = example("trainer_yield.py", "--name", "B", *common, "--step-time", "0.002")
    out_a, err_a = a.communicate(timeout=60)
    out_a = "".join(seen_a) + out_a
    out_b, err_b = b.communicate(timeout=60)
    assert a.returncode == 0 and b.returncode == 0, err_a + err_b
    assert re.search(r"A: B asked for the lock \(waiter\); yielding after step (\d+)", out_a), out_a
    last_a = int(re.search(r"A: checkpointed step (\d+)", out_a).group(1))
    assert "A: handed the lock to B" in out_a
    token_a = int(re.search(r"got the lock, token (\d+)", out_a).group(1))
    token_b, start_b = map(int, re.search(r"B: got the lock, token (\d+); resuming at step (\d+)", out_b).groups())
    assert start_b == last_a + 1 and token_b > token_a
    assert "B: finished all 600 steps" in out_b and "B: released the lock" in out_b


@runner_logic
@pytest.mark.timeout(60)
def test_sigterm_release_checkpoints_and_releases_on_sigterm(shared_url):
    job = example("sigterm_release.py", "--url", shared_url, "--grace", "9")
    read_until(job, r"holds .* send SIGTERM")
    time.sleep(0.3)
    job.send_signal(signal.SIGTERM)
    out, err = job.communicate(timeout=30)
    assert job.returncode == 0, err
    assert re.search(r"SIGTERM received \(signal\); [0-9.]+ s of grace left; checkpointing step \d+", out), out
    assert "released the lock; exiting" in out
    assert HandoffLock(shared_url).status().owner_id is None


@runner_logic
@pytest.mark.timeout(60)
def test_preemptible_job_checkpoints_on_the_preemption_notice(shared_url):
    with FakeMetadataServer() as metadata:
        job = example("preemptible_job.py", "--url", shared_url, env=child_env(GCE_METADATA_HOST=metadata.host))
        read_until(job, rf"watching {re.escape(metadata.host)}")
        time.sleep(0.5)
        metadata.preempt()
        out, err = job.communicate(timeout=30)
    assert job.returncode == 0, err
    assert re.search(r"asked to release: preemption \(by preemption\), (2\d|30) s left; checkpointing step \d+", out), out
    assert "released the lock" in out
    assert HandoffLock(shared_url).status().owner_id is None


@runner_logic
@pytest.mark.timeout(60)
def test_preemptible_job_without_a_metadata_server_just_runs(shared_url):
    env = child_env(GCE_METADATA_HOST="127.0.0.1:9")  # nothing listens: the watcher backs off quietly
    job = example("preemptible_job.py", "--url", shared_url, "--steps", "10", env=env)
    out, err = job.communicate(timeout=30)
    assert job.returncode == 0, err
    assert "checkpointed step 9" in out and "asked to release" not in out


@runner_logic
@pytest.mark.timeout(120)
def test_run_example_hands_the_lock_from_one_command_to_the_next(shared_url):
    # 240 steps of 0.05 s give the second run 12 s to start and ask, time a busy 2-core machine needs.
    env = child_env(HANDOFFLOCK=str(CONSOLE_SCRIPT), STEPS="240")
    proc = subprocess.run(["bash", str(EXAMPLES / "run_example.sh"), shared_url], capture_output=True,
                          text=True, env=env, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    asked = re.search(r"first: saved step (\d+) \(asked to yield\)", out)
    assert asked, proc.stdout + proc.stderr
    saved = int(asked.group(1))
    assert "second: token" in out and f"starting at step {saved}" in out
    assert "final step 240 of 240" in out
    assert "sending SIGUSR1 to bash" in proc.stderr and "handed" in proc.stderr
