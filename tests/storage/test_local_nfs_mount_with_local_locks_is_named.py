"""An NFS mount whose locks exclude only this host is named, not mistaken for ENOLCK (issue 25).

nfs(5): with ``nolock`` (or ``local_lock=flock|all``) ``flock`` succeeds and
excludes only processes on the same client. The local store warns once, at its
first lock, when /proc/mounts (a fake one here) puts its root on such a mount.
"""

from __future__ import annotations

import logging

import pytest

from handofflock.storage import local
from handofflock.storage.local import LocalStorage

MOUNTS = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
/dev/sda1 / ext4 rw,relatime 0 0
server:/export/home {home} nfs rw,relatime,vers=3,{opt},proto=tcp,addr=10.0.0.2 0 0
server:/export/scratch {home}/scratch\\040space nfs4 rw,relatime,vers=4.2,local_lock=none,addr=10.0.0.2 0 0
"""


@pytest.mark.parametrize("opt", ["nolock", "local_lock=flock", "local_lock=all"])
def test_a_root_on_an_nfs_mount_with_local_only_locks_is_found(tmp_path, opt):
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS.format(home="/home", opt=opt))
    assert local.local_only_locks("/home/alice/locks", str(mounts)) == opt
    assert local.local_only_locks("/home", str(mounts)) == opt
    assert local.local_only_locks("/home/scratch space/locks", str(mounts)) is None, "its own mount locks"
    assert local.local_only_locks("/homework", str(mounts)) is None
    assert local.local_only_locks("/var/tmp", str(mounts)) is None


@pytest.mark.parametrize("opt", ["local_lock=posix", "local_lock=none", "lock"])
def test_options_that_leave_flock_to_the_server_are_not_flagged(tmp_path, opt):
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS.format(home="/home", opt=opt))
    assert local.local_only_locks("/home/alice", str(mounts)) is None


def test_an_unreadable_mounts_file_says_nothing(tmp_path):
    assert local.local_only_locks("/home", str(tmp_path / "absent")) is None


def test_the_store_warns_once_at_its_first_lock_naming_the_option(tmp_path, monkeypatch, caplog):
    root = tmp_path / "locks"
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS.format(home=str(tmp_path), opt="nolock"))
    monkeypatch.setattr(local, "MOUNTS", str(mounts))
    store = LocalStorage(root)
    with caplog.at_level(logging.WARNING, logger="handofflock.storage"):
        generation = store.write("a.json", b"{}", if_generation_match=0)
        store.write("a.json", b"{}", if_generation_match=generation)
    warnings = [r.getMessage() for r in caplog.records if r.name == "handofflock.storage"]
    assert len(warnings) == 1 and "nolock" in warnings[0] and "this host" in warnings[0], warnings
