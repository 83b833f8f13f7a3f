"""The network test bed (scripts/netbed.py), run for real: parties and the GCS emulator in network
namespaces of their own, their store links faulted, the parties frozen at random, skewed clocks, and
the fenced resource's history checked offline.

Needs root and a kernel that allows namespaces, veth pairs and a bridge; skipped with the reason
otherwise. netem (delay, loss, duplication) is optional: without it the links are only partitioned,
and the test that needs it is skipped with the kernel's answer.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import netbed  # noqa: E402

pytestmark = pytest.mark.gcs


@pytest.fixture(scope="module", autouse=True)
def bed_allowed() -> None:
    """Probe once, when the first test here runs (not at collection): the probe makes and deletes a namespace."""
    reason = netbed.refusal()
    if reason is not None:
        pytest.skip(reason)


def run(tmp_path: Path, *args: str, timeout: float) -> tuple[int, dict, str]:
    out = tmp_path / "result.json"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "netbed.py"), *args, "--json", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.terminate()  # the bed deletes its namespaces on SIGTERM
            proc.communicate(timeout=60)
    # Whatever the outcome, the bed left no namespace or bridge of its own behind.
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{netbed.PREFIX}{proc.pid}-" not in names
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert re.search(rf"\bhn{proc.pid}\D", links) is None
    assert out.exists(), f"no result written (exit {proc.returncode}):\n{stdout[-4000:]}"
    return proc.returncode, json.loads(out.read_text()), stdout


def seed() -> str:
    return str(random.SystemRandom().randrange(2**31))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_short_run_of_three_parties_under_faults_passes_the_offline_check(tmp_path):
    s = seed()
    code, result, stdout = run(tmp_path, "--seconds", "25", "--parties", "3", "--seed", s, timeout=240)
    print(stdout)
    failed = {name: c["violations"] for name, c in result["checks"].items() if not c["ok"]}
    assert code == 0 and result["ok"] and failed == {}, f"seed {s}: {failed}"
    # It exercised what it claims to: handoffs, the fence refusing late writes, partitions, long pauses, skew.
    assert result["handoffs"] > 0 and result["acquisitions"] >= 10
    assert result["fence_writes"]["refused"] > 0
    assert result["pauses"]["longer_than_ttl"] > 0
    assert len(set(result["config"]["clock_offsets"].values())) > 1
    assert result["checks"]["lock_tokens_rise_per_handoff"]["owner_changes_sampled"] > 0
    kinds = result["faults"]["by_kind"]
    if result["netem"] == "available":  # a 25 s run meets a few of the five kinds, drawn in a shuffled order
        assert sum(kinds.values()) >= 2 and any(kinds.get(k, 0) for k in ("delay", "loss", "duplicate")), kinds
    else:  # partitions only (a drop-all tbf queue); the netem test below skips with the kernel's reason
        assert kinds.get("partition", 0) > 0, kinds


def test_netem_faults_are_available_here():
    """Delay, loss and duplication need the kernel's netem qdisc: say plainly when it is missing."""
    name = f"{netbed.PREFIX}{os.getpid()}-netem"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        reason = netbed.netem_refusal(name)
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)
    if reason is not None:
        pytest.skip(f"{reason}: the bed runs with partitions (a drop-all tbf qdisc) only")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_fence_that_accepts_a_stale_token_fails_the_offline_check(tmp_path):
    s = seed()
    code, result, stdout = run(tmp_path, "--seconds", "12", "--seed", s, "--fence-bug", "accept-stale", timeout=160)
    assert code == 1 and not result["ok"], f"seed {s}: the broken fence passed:\n{stdout}"
    assert not result["checks"]["accepted_tokens_never_go_back"]["ok"], stdout


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_handoff_that_keeps_the_old_token_fails_the_offline_check(tmp_path):
    s = seed()
    code, result, stdout = run(tmp_path, "--seconds", "12", "--seed", s, "--plant", "heir-keeps-old-token", timeout=160)
    assert code == 1 and not result["ok"], f"seed {s}: the planted handoff bug passed:\n{stdout}"
    assert not result["checks"]["lock_tokens_rise_per_handoff"]["ok"], stdout
    assert not result["checks"]["one_writer_per_token"]["ok"], stdout


def test_namespaces_bridges_and_links_of_a_dead_run_are_cleaned_up():
    dead = subprocess.Popen(["true"])
    dead.wait()
    ns, bridge, veth = f"{netbed.PREFIX}{dead.pid}-store", f"hn{dead.pid}br", f"hn{dead.pid}x0a"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    # A veth end left in the root namespace by a run whose move into a namespace failed.
    subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", f"hn{dead.pid}x0b"], check=True)
    try:
        assert set(netbed.clean_stale()) >= {ns, bridge, veth}
        assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert bridge not in links and f"hn{dead.pid}x0" not in links
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
