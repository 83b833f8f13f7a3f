"""The ``handofflock`` command on ``s3://`` URLs, against the session's moto server.

In process through ``main([...])`` for status, release --force and watch; as
the real console script (child processes finding the server through
``AWS_ENDPOINT_URL_S3``) for status and the holder of a ``run`` handoff, whose
second ``run`` is in this process.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from jobsutil import CONSOLE_SCRIPT, child_env, popen
from lockutil import make_lock, raw_read
from test_cli import WatchSteps, run_cmd, second_run

from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock.cli import main
from handofflock.exit_codes import EXIT_CORRUPT
from handofflock.storage import open_url
from childpipes import next_line

pytestmark = pytest.mark.s3


@pytest.fixture
def url(s3_server):
    bucket = f"cli-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    return f"s3://{bucket}/locks/train.json"


def quiet_lock(url, owner="trainer-A", clock=None, scheduler=None):
    clock = clock or FakeClock(start=time.time())
    if scheduler is None:  # not `or`: a Scheduler with no locks yet is falsy (it has a length)
        scheduler = Scheduler(clock, autostart=False)
    return HandoffLock(url, ttl=60.0, owner_id=owner, clock=clock, scheduler=scheduler)


def test_status_on_s3_names_the_owner_token_and_generation(url, capsys):
    assert main(["status", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "absent"
    lock = quiet_lock(url)
    lock.acquire()
    assert main(["status", url, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["state"] == "held" and status["ownerId"] == "trainer-A"
    assert status["token"] == lock.token and status["generation"] == raw_read(url)[1]


def test_status_of_a_corrupt_record_on_s3_says_how_to_clear_it_and_release_force_clears_it(url, capsys):
    store, key = open_url(url)
    store.write(key, b"not json", if_generation_match=0)
    assert main(["status", url]) == EXIT_CORRUPT
    assert "--force" in capsys.readouterr().err
    assert main(["release", url, "--force", "--yes"]) == 0
    assert raw_read(url)[0].owner_id is None


def test_release_force_on_s3_frees_a_held_lock_and_the_holder_finds_out(url, capsys):
    clock = FakeClock(start=time.time())
    sched = Scheduler(clock, autostart=False)
    holder = quiet_lock(url, clock=clock, scheduler=sched)
    holder.acquire()
    assert main(["release", url, "--force", "--yes"]) == 0
    assert f"held by {holder.label.text} (trainer-A)" in capsys.readouterr().err  # named as status names it
    record, _ = raw_read(url)
    assert record.owner_id is None and record.token > holder.token
    clock.advance(holder.renew_interval + 0.01)
    sched.run_pending()
    assert not holder.is_held
    newcomer = make_lock(url, owner_id="trainer-B")
    assert newcomer.acquire(blocking=False) and newcomer.token > holder.token
    newcomer.release()


def test_watch_on_s3_prints_a_line_per_change(url, capsys, monkeypatch):
    # The SDK made first (imports, credentials: seconds in a fresh venv under load, which a 1.5 s
    # watch once spent entirely on the story's acquire); the watch starts well before the acquire.
    a = make_lock(url, owner_id="trainer-A")
    a.status()

    steps = WatchSteps(monkeypatch)

    def story():
        steps.seen()
        a.acquire()
        steps.seen()
        a.release()
        steps.told_all()

    teller = threading.Thread(target=story)
    teller.start()
    assert main(["watch", url, "--interval", "0.05", "--duration", "60", "--json"]) == 0
    teller.join()
    seen = [(d["state"], d["ownerId"]) for d in map(json.loads, capsys.readouterr().out.splitlines())]
    assert seen[0] == ("absent", None) and ("held", "trainer-A") in seen and seen[-1][0] == "free"


def test_the_console_script_reports_status_of_an_s3_lock(url):
    import subprocess

    proc = subprocess.run([str(CONSOLE_SCRIPT), "status", url, "--json"], capture_output=True, text=True, env=child_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["state"] == "absent"


@pytest.mark.timeout(90)
def test_run_on_s3_hands_off_to_a_second_run_which_resumes_from_the_checkpoint(url, tmp_path, capfd):
    a = popen(run_cmd(url, "A", tmp_path, "--signal", "USR1", "--grace", "20"))
    first = next_line(a)
    assert first.startswith("A start 0 token"), first + a.stderr.read()
    token_a = int(first.split()[-1])
    b = second_run(url, "B", tmp_path, capfd, job_args=["--steps", "3"])
    out_a, err_a = a.communicate(timeout=60)
    assert a.returncode == 0, err_a
    assert "handed" in err_a
    done_a = int(out_a.split("checkpointed ")[1].split()[0])
    out_b, err_b = b.stdout, b.stderr
    assert b.returncode == 0, err_b
    assert int(out_b.split()[2]) == done_a + 1 and int(out_b.split()[4]) > token_a
