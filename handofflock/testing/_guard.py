"""Runs fake-gcs-server for :class:`FakeGCSServer` and takes it down once the process that started it is gone.

``FakeGCSServer.start()`` runs this script (by path, ``python -I -S``, stdlib
only) with the read end of a pipe whose write end only the starting process
holds. The script starts the binary as its child and reads the pipe: end of
file comes when the starter exits, however it ends (SIGKILL included), or
when ``stop()`` closes the pipe. Then it stops the binary (SIGTERM, then
SIGKILL) and exits. SIGTERM, SIGINT and SIGHUP do the same. If the binary
exits first, this script exits with its status.

On Linux the binary also gets ``PR_SET_PDEATHSIG`` = SIGKILL: if this script
is itself killed, the kernel kills the binary. The script is single-threaded,
so "the thread that started it" is the whole process. The starter gets no
such signal itself: its ``start()`` may run in a thread that ends long before
the process does, which is why the starter is watched through a pipe.

Usage (by FakeGCSServer only): ``python -I -S _guard.py FD PIDFILE -- BINARY [ARGS...]``;
the binary's pid is written to PIDFILE once it has started.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
_stop: list[int] = []


def _die_with_parent(parent: int) -> None:
    """In the child before exec: SIGKILL when this script dies (Linux); exit if it already has."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl: nobody would signal us
        os._exit(1)


def main(argv: list[str]) -> int:
    fd, pidfile = int(argv[1]), argv[2]
    command = argv[argv.index("--") + 1 :]
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), lambda signum, frame: _stop.append(signum))
    parent = os.getpid()
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=lambda: _die_with_parent(parent))
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.replace(pidfile + ".tmp", pidfile)
    while not _stop:
        status = child.poll()
        if status is not None:
            return status if status >= 0 else 128 - status
        try:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready and not os.read(fd, 64):
                break  # the starter is gone, or stop() closed the pipe
        except InterruptedError:
            continue
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
