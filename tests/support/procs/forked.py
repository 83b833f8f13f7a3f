"""Scenarios that fork, run in a process of their own (pytest's threads make fork() there unsafe).

    python forked.py gcs-reads BUCKET N        parent and child read two objects through one store
    python forked.py s3-reads BUCKET N         the same on S3 (AWS_ENDPOINT_URL_S3 names the server)
    python forked.py held URL                  a child forked while its parent holds the lock

Each prints one JSON line with what it saw and exits 0; a child that hangs is
killed by the parent after a timeout, and that is reported.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import orjson


def wait_child(pid: int, timeout: float) -> int | None:
    """The child's exit status, or None (and the child killed) if it did not end within ``timeout``."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def gcs_reads(bucket: str, n: int, kind: str = "gcs") -> dict:
    """Parent reads ``a`` and child reads ``b``, ``n`` times each, at once, through one shared store.

    Before the fork the store has a live keep-alive connection. Every read must
    return its own object's bytes and generation.
    """
    if kind == "s3":
        from handofflock.storage.s3 import S3Storage

        store = S3Storage.shared(bucket)
    else:
        from handofflock.storage.gcs import GCSStorage

        store = GCSStorage.shared(bucket)
    gens = {key: store.write(key, key.encode() * 100, if_generation_match=0) for key in ("a", "b")}
    store.read("a")  # a connection in the pool, inherited by the child
    r, w = os.pipe()
    pid = os.fork()
    key = "b" if pid == 0 else "a"
    wrong = errors = 0
    for _ in range(n):
        try:
            data, generation = store.read(key)
        except Exception:  # noqa: BLE001 - counted: a reply meant for the other process
            errors += 1
            continue
        if data != key.encode() * 100 or generation != gens[key]:
            wrong += 1
    if pid == 0:
        os.write(w, orjson.dumps({"wrong": wrong, "errors": errors}))
        os._exit(0)
    os.close(w)
    status = wait_child(pid, 60)
    child = orjson.loads(os.read(r, 1000) or b"null")
    return {"parent": {"wrong": wrong, "errors": errors}, "child": child, "child_status": status}


def held(url: str) -> dict:
    """The parent holds the lock (with ``release_at_exit``) and forks.

    The child: the inherited lock is not held there, release() and acquire()
    refuse with InheritedAcrossFork, a new lock of its own on another key is
    acquired and released (a fresh scheduler), a SIGTERM ends it as if no
    handler were installed, or else it exits normally, running the inherited
    atexit hook, which must neither hang nor release the parent's lock.
    """
    from handofflock import HandoffLock, InheritedAcrossFork, install_signal_handlers

    lock = HandoffLock(url, ttl=5, owner_id="parent")
    assert lock.acquire(timeout=10)
    install_signal_handlers(lock, release_at_exit=True)
    token = lock.token
    report: dict = {}
    for mode in ("exit", "sigterm"):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            seen = {"is_held": lock.is_held, "healthy": lock.healthy, "token": lock.token}
            for name, call in (("release", lock.release), ("acquire", lambda: lock.acquire(blocking=False))):
                try:
                    call()
                    seen[name] = "returned"
                except InheritedAcrossFork:
                    seen[name] = "InheritedAcrossFork"
            own = HandoffLock(url + ".child", ttl=5, owner_id="child")
            seen["own"] = bool(own.acquire(timeout=10))
            acquired = own.status().generation
            until = time.monotonic() + 10
            while own.status().generation == acquired and time.monotonic() < until:
                time.sleep(0.05)  # until the child's own scheduler has renewed it (every ttl/8)
            seen["own_healthy"] = own.healthy and own.status().generation != acquired
            own.release()
            os.write(w, orjson.dumps(seen))
            os.close(w)
            if mode == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
                os._exit(3)  # the signal did not end us
            sys.exit(0)  # runs the inherited atexit hook
        os.close(w)
        status = wait_child(pid, 30)
        seen = orjson.loads(os.read(r, 10_000) or b"null")
        os.close(r)
        report[mode] = {"child": seen, "status": status}
    report["parent_healthy"] = lock.healthy
    report["record_owner"] = lock.status().owner_id
    report["token_kept"] = lock.token == token
    lock.release()
    return report


def fence_mutex(url: str) -> dict:
    """A child forked while a parent thread is inside a fenced write (holding the fence's mutex):
    the child's own read of the fence must not wait for a thread that does not exist there."""
    from handofflock import FencedObject
    from handofflock.storage import open_url

    store, key = open_url(url)
    fence = FencedObject(store, key, writer_id="parent")
    fence.write({"step": 1}, token=5)
    fence._mutex.acquire()  # as a write in another thread holds it (across store I/O and the write gate)
    pid = os.fork()
    if pid == 0:
        signal.alarm(10)  # a hang ends the child with SIGALRM
        value = fence.read()
        os._exit(0 if value.payload == {"step": 1} else 2)
    fence._mutex.release()  # private: as above
    return {"child_status": wait_child(pid, 30)}


def main(argv: list[str]) -> int:
    if argv[1] in ("gcs-reads", "s3-reads"):
        out = gcs_reads(argv[2], int(argv[3]), argv[1].split("-")[0])
    elif argv[1] == "held":
        out = held(argv[2])
    elif argv[1] == "fence-mutex":
        out = fence_mutex(argv[2])
    else:
        raise SystemExit(f"unknown scenario {argv[1]!r}")
    print(orjson.dumps(out).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
