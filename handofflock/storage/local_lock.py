"""The local backend's per-key lock: ``flock`` on a sidecar file beside the object.

Why a sidecar: every write replaces the object by rename, so a lock taken on
the object's inode would guard a file that is gone a moment later. The sidecar
is created once (``0o600``) and never replaced or removed.

Why ``flock`` and not ``fcntl`` record locks: a ``flock`` lock belongs to the
open file description, so two threads of one process that each open the
sidecar exclude each other, and closing some other descriptor of the same file
does not silently drop the lock (as it does with ``fcntl`` locks).

Fork safety: a child forked while another thread holds a lock inherits a copy
of the descriptor, and with it the lock, for as long as the child lives (a
DataLoader worker can live for hours). So the child closes its copies at once
(an at-fork hook), and a holder unlocks explicitly, which releases every copy,
before it closes.
"""

from __future__ import annotations

import os
import time

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX; LocalStorage refuses to run there
    fcntl = None  # type: ignore[assignment]

_FLAGS = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

#: Lock descriptors held (or being taken) right now, closed in forked children.
_HELD: set[int] = set()


def _close_inherited_locks() -> None:
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_locks)


def open_sidecar(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """Open the lock file ``name`` in ``dir_fd``, creating it with ``mode`` if needed.

    Never follows a symlink (``OSError`` with ELOOP) and never blocks on a FIFO;
    the caller checks that it got a regular file.
    """
    try:
        fd = os.open(name, _FLAGS | os.O_CREAT | os.O_EXCL, mode, dir_fd=dir_fd)
    except FileExistsError:
        return os.open(name, _FLAGS, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits from the mode above
    except BaseException:
        os.close(fd)
        raise
    return fd


def lock(fd: int, timeout: float) -> None:
    """Take an exclusive lock on ``fd``, waiting at most ``timeout`` seconds (then ``TimeoutError``).

    Polls rather than blocks, so a holder that is stopped (SIGSTOP, a hung disk)
    costs the others a typed error, not a hang. Holders keep the lock for one
    write, so the short first sleeps keep contended writes fast.
    """
    _HELD.add(fd)
    deadline, delay = time.monotonic() + timeout, 0.0005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"lock not free after {timeout:.1f}s") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def unlock_and_close(fd: int) -> None:
    """Release the lock for every copy of ``fd`` (forked ones included), then close it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        _HELD.discard(fd)  # before close(): the number may be reused at once
        os.close(fd)
