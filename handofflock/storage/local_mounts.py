"""Whether ``flock`` under a local store's root excludes other hosts' processes: NFS mount options.

On an NFS mount with ``nolock``, or with ``local_lock=flock`` or ``local_lock=all``,
``flock`` succeeds and excludes only processes on the same client (nfs(5):
"applications can lock files, but such locks provide exclusion only against
other applications running on the same client"). Nothing fails, so two hosts
using one path would both hold the lock. The local backend is single host
only; on such a mount that is all it gives, silently. So the first lock taken
under a root on such a mount logs a warning, once per store, naming the
option (``handofflock.storage`` logger). It warns rather than refuses: on
one host the lock is still sound, and an NFS home directory is a common place
for one host's lock. ``local_lock=posix`` does not make ``flock`` local.
"""

from __future__ import annotations

import logging
import os

_log = logging.getLogger("handofflock.storage")

#: Where Linux lists the mounts of this process's namespace.
MOUNTS = "/proc/mounts"
#: Mount options under which NFS ``flock`` locks are local to the client.
LOCAL_ONLY = ("nolock", "local_lock=flock", "local_lock=all")


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash in paths as octal escapes (``\\040``)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def local_only_locks(path: str, mounts: str | None = None) -> str | None:
    """The mount option that makes ``flock`` under ``path`` local to this host, or None.

    ``path`` is absolute; the mount is the one with the longest mount point
    above it (the last listed wins among equals, as the kernel stacks them).
    None also when ``mounts`` cannot be read (not Linux).
    """
    try:
        with open(mounts or MOUNTS, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: tuple[int, str, list[str]] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        point, fstype, options = _unescape(fields[1]), fields[2], fields[3].split(",")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), fstype, options)
    if best is None or not best[1].startswith("nfs"):
        return None
    return next((option for option in best[2] if option in LOCAL_ONLY), None)


def warn_if_local_only(root: str, url: str, mounts: str | None = None) -> bool:
    """Log the warning described above if ``root`` is on such a mount; return whether it was."""
    option = local_only_locks(os.path.abspath(root), mounts)
    if option is None:
        return False
    _log.warning(
        "local store %s is on an NFS mount with %s: file locks there exclude only processes on this host, so "
        "processes on two hosts using this path would both hold the lock, with no error. Use it from one host "
        "only, or use gs:// or s3:// to share a lock between hosts (docs/local-backend.md)",
        url,
        option,
    )
    return True
