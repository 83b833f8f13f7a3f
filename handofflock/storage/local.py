"""``file:///dir/name.json``: objects as files under a root directory, on one host.

Each key is one file, ``<root>/<key>``: the envelope of :mod:`.base` (a header
line carrying the generation, then the data; magic ``#handofflock/local``).
Every mutation writes a temp file beside the object, fsyncs it, renames it
over the object and fsyncs the directory, so (data, generation) changes in one
atomic, durable step and a reader never sees a torn object. A delete leaves a
tombstone that keeps the generation, so a recreated key continues its
sequence. A file without our header (hand edits, truncation, a future
version) is foreign: read whole, as data, at its mtime in microseconds.

Mutations of a key are serialized by ``flock`` on a sidecar lock file beside
the object. A sidecar, because every write replaces the object by rename, so
a lock on the object's inode would guard a file that is gone a moment later.
``flock``, not ``fcntl`` record locks, because a ``flock`` lock belongs to the
open file description: two threads that each open the sidecar exclude each
other, and closing some other descriptor of the file does not drop the lock.
Nothing below the root is ever followed through a symlink: every operation
walks the same descriptor-relative path (``openat`` all the way down). See
``docs/local-backend.md``. Single host only: on an NFS mount whose locks are
local to the client, the first lock logs a warning (:func:`local_only_locks`).
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import logging
import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX; refused at first use
    fcntl = None  # type: ignore[assignment]

from ..core.errors import (
    ConfigurationError,
    InvalidKey,
    LockingUnsupported,
    NotFound,
    PreconditionFailed,
    StorageError,
    TransientStorageError,
)
from .base import (
    MAX_HEADER,
    MAX_KEY_BYTES,
    Header,
    checked_delete,
    checked_read,
    checked_write,
    encode,
    foreign_header,
    is_seconds,
    next_generation,
    parse_header,
    validate_key,
    validate_prefix,
    validate_timeout,
)

_log = logging.getLogger("handofflock.storage")

#: The first bytes of every object file of ours.
MAGIC = b"#handofflock/local"
#: File names starting with this are the backend's own (lock and temp files).
#: Keys with such a segment are refused, so an object never collides with one.
RESERVED_PREFIX = ".handofflock."
#: Where Linux lists the mounts of this process's namespace.
MOUNTS = "/proc/mounts"
#: NFS mount options under which ``flock`` excludes only processes on the same client (nfs(5)).
LOCAL_ONLY = ("nolock", "local_lock=flock", "local_lock=all")

_FILE_MODE, _DIR_MODE = 0o600, 0o700
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # so a FIFO planted at a path cannot hang open()
_OPEN_ROOT = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC  # the root is used as given
_OPEN_DIR = _OPEN_ROOT | _NOFOLLOW
_OPEN_FILE = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC
_SIDECAR = os.O_RDWR | _NOFOLLOW | _NONBLOCK | _CLOEXEC
_POSIX_OK = fcntl is not None and os.name == "posix" and bool(_NOFOLLOW) and os.open in os.supports_dir_fd

# errno values after which a retry can succeed: they are about this moment's
# resources, not the store. ENOSPC, EDQUOT, EROFS and EIO are *not* here: they
# last until someone acts, and retrying against a failing disk only hides it.
# Nor is ENOLCK: flock fails with it where the filesystem cannot reach a lock
# manager (NFS with rpc.statd/lockd not running), which no retry fixes
# (LockingUnsupported). A `nolock` mount does not fail: see local_only_locks.
_TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM, errno.ETIMEDOUT}
_REFUSED = {errno.ELOOP, errno.EMLINK, errno.ENOTDIR}  # what O_NOFOLLOW / O_DIRECTORY report, by platform
_HINTS = {
    errno.ENOSPC: "free space on the filesystem",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the filesystem is mounted read-only",
    errno.EIO: "the disk reported an I/O error; check the system log",
    errno.ENOTDIR: "a component of the path is not a directory",
    errno.ENAMETOOLONG: "a key segment is longer than the filesystem allows",
}


class LocalStorage:
    """Objects as files under ``root``, safe across threads and processes of one host.

    Keys are relative ``/``-separated paths below ``root``. ``root`` and the
    directories below it are created on first write, mode ``0o700``; files are
    ``0o600``, whatever the umask. In a group-writable directory (a lock
    directory shared by a group) they are ``0o770`` (keeping its setgid bit)
    and ``0o660``. A file that is replaced keeps its mode, and its owner and
    group as far as the writer may give them (root: both), so a forced release
    by another user leaves the lock usable by its users. Symlinks below ``root`` are refused, never
    followed (``root`` itself, and the path to it, are used as given).

    >>> store = LocalStorage("/var/lib/myjob/locks")
    >>> gen = store.write("train.json", b"{}", if_generation_match=0)
    >>> store.read("train.json") == (b"{}", gen)
    True

    ``lock_timeout`` bounds the wait for another writer of the same key (which
    holds the key's lock for one fsync'd write); past it the call raises
    :class:`~handofflock.core.errors.TransientStorageError` instead of hanging.
    Single host only: see ``docs/local-backend.md`` about network filesystems.
    """

    def __init__(self, root: str | os.PathLike[str], *, lock_timeout: float = 30.0) -> None:
        text = os.fspath(root) if isinstance(root, (str, os.PathLike)) else None
        if not isinstance(text, str) or not text or "\x00" in text:
            raise ConfigurationError(f"LocalStorage root must be a non-empty text path without NUL, got {root!r}")
        if not is_seconds(lock_timeout):
            raise ConfigurationError(f"lock_timeout must be a finite number > 0, got {lock_timeout!r}")
        # abspath, not resolve(): no I/O here, and symlinks are refused later, not resolved away.
        self.root = os.path.abspath(text)
        self.url = Path(self.root).as_uri()
        self.lock_timeout = float(lock_timeout)
        self._mount_checked = False  # warned (or not) about an NFS mount whose locks are local

    def __repr__(self) -> str:
        return f"LocalStorage({self.root!r})"

    # -- the contract ---------------------------------------------------------

    def read(self, key: str, *, max_bytes: int | None = None, timeout: float | None = None) -> tuple[bytes, int] | None:
        """Return ``(data, generation)`` or ``None``; reads at most ``max_bytes + 1`` data bytes.

        Lock-free: objects are only ever replaced by rename, so the file opened
        is one complete version. A file without our header is returned whole,
        as data, at its mtime in microseconds (see ``docs/local-backend.md``).
        """
        checked_read(key, max_bytes, timeout)
        self._check_reserved(key)
        with self._mapped(key), ExitStack() as stack:
            dir_fd, name = self._walk(stack, key, create=False)
            found = None if dir_fd is None else self._open_object(stack, dir_fd, name, key)
            if found is None or found[1].deleted:
                return None
            fd, header, size = found
            n = size if max_bytes is None else min(max_bytes + 1, size)
            return _pread(fd, n, header.offset), header.generation

    def write(self, key: str, data: bytes, *, if_generation_match: int, timeout: float | None = None) -> int:
        """Write ``data`` if the generation is ``if_generation_match`` (0: must be absent).

        Returns the new generation, ``max(previous + 1, now in microseconds)``,
        where a tombstone's generation counts as previous.
        """
        data = checked_write(key, data, if_generation_match, timeout)
        self._check_reserved(key)
        with self._mapped(key), ExitStack() as stack:
            dir_fd, name = self._walk(stack, key, create=True)
            assert dir_fd is not None
            current, floor = self._locked_state(stack, dir_fd, name, key)
            if current != if_generation_match:
                raise PreconditionFailed(key, if_generation_match, url=self.url)
            generation = next_generation(floor, time.time_ns() // 1000)
            if generation is None:
                raise StorageError(f"generation of {key!r} would pass 2**63-1", url=self.url, key=key)
            self._replace(dir_fd, name, key, encode(MAGIC, generation, data))
            return generation

    def delete(self, key: str, *, if_generation_match: int, timeout: float | None = None) -> None:
        """Delete if the generation matches, leaving a tombstone that keeps the generation."""
        checked_delete(key, if_generation_match, timeout)
        self._check_reserved(key)
        with self._mapped(key), ExitStack() as stack:
            dir_fd, name = self._walk(stack, key, create=False)
            if dir_fd is None or not _mode(dir_fd, name):  # absent: no need to make it a lock file
                raise NotFound(key, url=self.url)
            current, floor = self._locked_state(stack, dir_fd, name, key)
            if current == 0:
                raise NotFound(key, url=self.url)
            if current != if_generation_match:
                raise PreconditionFailed(key, if_generation_match, url=self.url)
            self._replace(dir_fd, name, key, encode(MAGIC, floor, b"", deleted=True))

    def list(self, prefix: str, *, timeout: float | None = None) -> dict[str, int]:
        """``{key: generation}`` of live objects whose key starts with ``prefix``.

        Skips tombstones, the backend's own files, symlinks and anything that is
        not a regular file; hand-written files are listed as :meth:`read` sees them.
        """
        validate_prefix(prefix)
        validate_timeout(timeout)
        dir_part, _, name_prefix = prefix.rpartition("/")
        found: dict[str, int] = {}
        with self._mapped(prefix or None), ExitStack() as stack:
            start, _ = self._walk(stack, f"{dir_part}/-" if dir_part else "-", create=False)  # "-": any name
            if start is None:
                return found
            pending = [(os.dup(start), f"{dir_part}/" if dir_part else "", name_prefix)]
            # Directories waiting their turn hold descriptors: close them however the walk ends.
            stack.callback(_close_all, pending)
            while pending:  # depth-first
                fd, base, must_start = pending.pop()
                try:
                    with os.scandir(fd) as entries:
                        for entry in entries:
                            key = base + entry.name
                            if not entry.name.startswith(must_start) or entry.name.startswith(RESERVED_PREFIX):
                                continue
                            try:
                                validate_key(key)
                            except InvalidKey:
                                continue  # a name no key can have (e.g. not UTF-8): not an object
                            if entry.is_dir(follow_symlinks=False) and len(key.encode()) < MAX_KEY_BYTES:
                                sub = self._open_dir(fd, entry.name, key, create=False)
                                if sub is not None:
                                    pending.append((sub, key + "/", ""))
                            elif entry.is_file(follow_symlinks=False):
                                with ExitStack() as one:  # one file open at a time, however big the directory
                                    opened = self._open_object(one, fd, entry.name, key, strict=False)
                                if opened is not None and not opened[1].deleted:
                                    found[key] = opened[1].generation
                finally:
                    os.close(fd)
        return found

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own descriptors."""

    # -- paths ----------------------------------------------------------------

    def _check_reserved(self, key: str) -> None:
        if any(part.startswith(RESERVED_PREFIX) for part in key.split("/")):
            raise InvalidKey(f"object key {key!r} uses {RESERVED_PREFIX!r}, reserved for the local backend's own files")

    def _walk(self, stack: ExitStack, key: str, *, create: bool) -> tuple[int | None, str]:
        """Open the directory holding ``key`` one component at a time, never following a symlink.

        Returns ``(dir_fd, file name)``; ``dir_fd`` is None if a directory is
        missing and ``create`` is False.
        """
        if not _POSIX_OK:
            raise StorageError("LocalStorage needs POSIX (flock, O_NOFOLLOW, dir_fd); here use gs:// or memory://")
        *parts, name = key.split("/")
        fd = self._open_root(self.root, create=create)
        if fd is None:
            return None, name
        stack.callback(os.close, fd)
        for i, part in enumerate(parts):
            sub = self._open_dir(fd, part, "/".join(parts[: i + 1]), create=create)
            if sub is None:
                return None, name
            stack.callback(os.close, sub)
            fd = sub
        return fd, name

    def _open_root(self, path: str, *, create: bool) -> int | None:
        """Open ``path``, the root or a directory above it, as given; None if it is missing.

        With ``create``, the missing directories down to it are made as :meth:`_open_dir` makes them.
        """
        try:
            return os.open(path, _OPEN_ROOT)
        except FileNotFoundError:
            if not create:
                return None
            if os.path.islink(path):  # a dangling symlink: not ours to replace (a directory made meanwhile is opened)
                raise
        parent = self._open_root(os.path.dirname(path), create=True)
        assert parent is not None  # create=True opens or raises
        try:
            return self._open_dir(parent, os.path.basename(path), path, create=True)
        finally:
            os.close(parent)

    def _open_dir(self, parent: int, name: str, relpath: str, *, create: bool) -> int | None:
        made = False
        while True:
            try:
                fd = os.open(name, _OPEN_DIR, dir_fd=parent)
                break
            except FileNotFoundError:
                if not create:
                    return None
                if made:
                    raise
            except OSError as exc:
                if exc.errno not in _REFUSED:
                    raise
                if not create and stat.S_ISREG(_mode(parent, name)):
                    return None  # an object file: nothing below it exists (a write says why it cannot)
                self._refuse(parent, name, relpath, exc)  # a symlink is refused, never skipped
            with suppress(FileExistsError):  # a concurrent writer made it: open it like any other
                os.mkdir(name, _DIR_MODE, dir_fd=parent)
                made = True
        if made:
            try:
                os.fchmod(fd, _new_dir_mode(parent))
                os.fsync(parent)  # the new directory entry must survive a crash too
            except BaseException:
                os.close(fd)
                raise
        return fd

    def _refuse(self, dir_fd: int, name: str, relpath: str, exc: OSError | None = None) -> None:
        """Raise a StorageError saying why ``name`` cannot be used (``relpath``: for the message)."""
        mode = _mode(dir_fd, name)
        if stat.S_ISLNK(mode):
            why = "is a symbolic link; handofflock never follows symlinks below its root. Replace it with a real one"
        elif stat.S_ISDIR(mode):
            why = "is a directory, not an object file"
        elif mode:
            why = "is not a directory: a file sits where the key needs one" if exc else "is not a regular file"
        else:
            why = f"cannot be opened safely ({exc})"
        path = os.path.join(self.root, relpath)  # an absolute relpath stands for itself
        raise StorageError(f"local store {self.url}: {path!r} {why}", url=self.url, key=relpath) from exc

    # -- objects --------------------------------------------------------------

    def _open_object(
        self, stack: ExitStack, dir_fd: int, name: str, key: str, *, strict: bool = True
    ) -> tuple[int, Header, int] | None:
        """``(fd, header, size of the data)``, or None if absent.

        A foreign file's header says: live, at its mtime in microseconds, data from
        the first byte. ``strict`` raises on a symlink or a non-regular file; listing skips them.
        """
        try:
            fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno not in _REFUSED:
                raise
            if strict:
                self._refuse(dir_fd, name, key, exc)
            return None
        stack.callback(os.close, fd)
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            header = parse_header(MAGIC, os.pread(fd, MAX_HEADER, 0), st.st_size) or foreign_header(
                st.st_mtime_ns // 1000
            )
            return fd, header, st.st_size - header.offset
        if strict:
            self._refuse(dir_fd, name, key)
        return None

    def _locked_state(self, stack: ExitStack, dir_fd: int, name: str, key: str) -> tuple[int, int]:
        """Take the key's lock (the sidecar's ``flock``), or say why it cannot be taken; return
        (current generation or 0 if absent, highest generation yet)."""
        like = _stat(dir_fd, name)
        if like is not None and not stat.S_ISREG(like.st_mode):  # a symlink or a FIFO: refused before locking
            self._refuse(dir_fd, name, key)
        lock_name = sidecar_name(name, "lock")
        lock_rel = os.path.join(os.path.dirname(key), lock_name)
        # a lock file made beside an existing object takes its mode and owner, as a replacement does
        try:
            fd = _open_sidecar(dir_fd, lock_name, _new_file_mode(dir_fd, like))
        except OSError as exc:
            if exc.errno in _REFUSED:
                self._refuse(dir_fd, lock_name, lock_rel, exc)
            raise
        stack.callback(_unlock_and_close, fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            self._refuse(dir_fd, lock_name, lock_rel)
        if like is not None and st.st_uid == os.geteuid() and (st.st_uid, st.st_gid) != (like.st_uid, like.st_gid):
            _keep_owner(fd, like)  # ours (made just now, most likely): give it to the object's owner
        if not self._mount_checked:
            self._mount_checked = True
            _warn_if_local_only(self.root, self.url)
        try:
            _flock(fd, self.lock_timeout)
        except TimeoutError:
            raise TransientStorageError(
                f"local store {self.url}: waited {self.lock_timeout:.1f}s for the lock of {key!r}; "
                "another process holds it (stopped, or stuck on I/O?)",
                url=self.url,
                key=key,
                ambiguous=False,
            ) from None
        found = self._open_object(stack, dir_fd, name, key)  # again: it may have changed before we locked
        if found is None:
            return 0, 0
        header = found[1]
        return (0 if header.deleted else header.generation), header.generation

    def _replace(self, dir_fd: int, name: str, key: str, content: bytes) -> None:
        """Atomically and durably replace ``name`` with ``content``. Call under the key's lock."""
        tmp = sidecar_name(name, "tmp")  # one per key: only the lock holder uses it; a crash leaves at most one
        with suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)  # a crash's leftover, or anything planted (unlink never follows)
        old = _stat(dir_fd, name)
        # A file that is replaced keeps its mode and owner, so that a write by another user
        # (root's `release --force`) does not take the lock away from the users who share it.
        fd = _create(dir_fd, tmp, os.O_WRONLY | _NOFOLLOW | _CLOEXEC, _new_file_mode(dir_fd, old))
        try:
            if old is not None:
                _keep_owner(fd, old)
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            _fsync(fd)  # the data must be on disk before the name points at it
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        try:
            _fsync(dir_fd)  # makes the rename itself durable
        except OSError as exc:
            raise TransientStorageError(
                f"local store {self.url}: {key!r} was replaced but its directory could not be synced ({exc}); "
                "the write is visible and may not survive a crash",
                url=self.url,
                key=key,
                ambiguous=True,
            ) from exc

    @contextmanager
    def _mapped(self, key: str | None) -> Iterator[None]:
        """Turn any ``OSError`` escaping an operation into a typed storage error."""
        try:
            yield
        except OSError as exc:
            raise self._typed(exc, key) from exc

    def _typed(self, exc: OSError, key: str | None) -> StorageError:
        if isinstance(exc.filename, str) and os.path.isabs(exc.filename):
            where = exc.filename
        else:  # dir_fd-relative calls report only a name; the key says where
            where = os.path.join(self.root, key) if key else self.root
        if exc.errno == errno.ENOLCK:
            return LockingUnsupported(
                f"local store {self.url}: the filesystem under {self.root!r} does not support file locks "
                f"(flock: {exc.strerror or 'No locks available'}), so writes to it cannot be serialized; "
                "typically NFS whose lock manager cannot be reached (rpc.statd/lockd not running). "
                "Put the lock on a local filesystem, or use gs:// to share it between hosts; nothing was changed",
                url=self.url,
                key=key,
            )
        if exc.errno in (errno.EACCES, errno.EPERM):
            return StorageError(
                f"local store {self.url}: permission denied on {where!r}; check that the user running this "
                f"process (uid {os.geteuid()}) can read, write and search {self.root!r} and the files in it",
                url=self.url,
                key=key,
            )
        what = f"local store {self.url}: {exc.strerror or exc} on {where!r}"
        if exc.errno in _TRANSIENT:
            return TransientStorageError(
                f"{what}; nothing was changed, retrying may help", url=self.url, key=key, ambiguous=False
            )
        hint = _HINTS.get(exc.errno or 0, "check the path and the filesystem")
        return StorageError(f"{what} ({hint}); nothing was changed", url=self.url, key=key)


def _new_file_mode(dir_fd: int, like: os.stat_result | None) -> int:
    """The permission bits of ``like``, the file replaced; without one ``0o600``, and ``0o660``
    in a group-writable directory (a lock directory shared by a group)."""
    if like is not None:
        return stat.S_IMODE(like.st_mode) & 0o777
    return _FILE_MODE | 0o060 if os.fstat(dir_fd).st_mode & stat.S_IWGRP else _FILE_MODE


def _new_dir_mode(parent_fd: int) -> int:
    """``0o700``; in a group-writable directory ``0o770``, with its setgid bit (the group carries on)."""
    mode = os.fstat(parent_fd).st_mode
    if not mode & stat.S_IWGRP:
        return _DIR_MODE
    return _DIR_MODE | 0o070 | (mode & stat.S_ISGID)


def _keep_owner(fd: int, old: os.stat_result) -> None:
    """Give the new file the old one's owner and group, as far as this process may (root: both;
    the owner: a group it belongs to). What it may not give, it leaves as created."""
    if (old.st_uid, old.st_gid) == (os.geteuid(), os.getegid()):
        return
    for uid, gid in ((old.st_uid, old.st_gid), (-1, old.st_gid)):
        try:
            os.fchown(fd, uid, gid)
            return
        except PermissionError:
            continue


def _stat(dir_fd: int, name: str) -> os.stat_result | None:
    """``name``'s status, symlinks not followed; None if it does not exist."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _mode(dir_fd: int, name: str) -> int:
    """``name``'s file type and mode, symlinks not followed; 0 if it does not exist."""
    st = _stat(dir_fd, name)
    return 0 if st is None else st.st_mode


def _pread(fd: int, n: int, offset: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = os.pread(fd, min(n - len(data), 1 << 20), offset + len(data))
        if not chunk:
            break  # a hand-written file shrank under us: return what is there
        data += chunk
    return bytes(data)


def _fsync(fd: int) -> None:
    full = getattr(fcntl, "F_FULLFSYNC", None)  # macOS: fsync() alone does not flush the drive's cache
    if full is not None:
        try:
            fcntl.fcntl(fd, full)
            return
        except OSError:
            pass
    os.fsync(fd)


def _close_all(pending: list[tuple[int, str, str]]) -> None:
    for fd, _, _ in pending:
        os.close(fd)


# --------------------------------------------------------------------------- names and generations on disk


def sidecar_name(name: str, suffix: str) -> str:
    """The name of an object's lock (``"lock"``) or temp (``"tmp"``) file, beside it.

    Hashed so it stays short whatever the object's name (NAME_MAX is 255 bytes).
    Two names that collide would only share a lock, which is still safe.
    """
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
    return f"{RESERVED_PREFIX}{digest}.{suffix}"


# --------------------------------------------------------------------------- the sidecar lock

#: Lock descriptors held (or being taken) right now. A child forked while another thread holds
#: one would keep the lock for as long as it lives (a DataLoader worker can live for hours): it
#: closes its copies at once, and a holder unlocks explicitly, which releases every copy.
_HELD: set[int] = set()


def _close_inherited_locks() -> None:
    for fd in list(_HELD):
        with suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_locks)


def _create(dir_fd: int, name: str, flags: int, mode: int) -> int:
    """Create and open ``name`` in ``dir_fd`` (``FileExistsError`` if it exists), with ``mode`` whatever the umask."""
    fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, mode, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_sidecar(dir_fd: int, name: str, mode: int) -> int:
    """Open the lock file ``name`` in ``dir_fd``, creating it with ``mode`` if needed.

    Never follows a symlink (``OSError`` with ELOOP) and never blocks on a FIFO;
    the caller checks that it got a regular file. The file is never replaced or removed.
    """
    try:
        return _create(dir_fd, name, _SIDECAR, mode)
    except FileExistsError:
        return os.open(name, _SIDECAR, dir_fd=dir_fd)


def _flock(fd: int, timeout: float) -> None:
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


def _unlock_and_close(fd: int) -> None:
    """Release the lock for every copy of ``fd`` (forked ones included), then close it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        _HELD.discard(fd)  # before close(): the number may be reused at once
        os.close(fd)


# --------------------------------------------------------------------------- NFS mounts whose locks are local


def local_only_locks(path: str, mounts: str | None = None) -> str | None:
    """The mount option that makes ``flock`` under ``path`` local to this host, or None.

    On an NFS mount with one of :data:`LOCAL_ONLY`, ``flock`` succeeds and
    excludes only processes on the same client, so two hosts using one path
    would both hold the lock, with no error anywhere. ``path`` is absolute; the
    mount is the one with the longest mount point above it (the last listed
    wins among equals, as the kernel stacks them). None also when ``mounts``
    cannot be read (not Linux).
    """
    try:
        with open(mounts or MOUNTS, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: tuple[int, str, builtins.list[str]] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        # /proc/mounts writes space, tab, newline and backslash in paths as octal escapes (\040)
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[1])
        fstype, options = fields[2], fields[3].split(",")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), fstype, options)
    if best is None or not best[1].startswith("nfs"):
        return None
    return next((option for option in best[2] if option in LOCAL_ONLY), None)


def _warn_if_local_only(root: str, url: str) -> None:
    """Warn (it does not refuse: on one host the lock is sound) if ``root`` is on such a mount."""
    option = local_only_locks(os.path.abspath(root))
    if option is not None:
        _log.warning(
            "local store %s is on an NFS mount with %s: file locks there exclude only processes on this host, so "
            "processes on two hosts using this path would both hold the lock, with no error. Use it from one host "
            "only, or use gs:// or s3:// to share a lock between hosts (docs/local-backend.md)",
            url,
            option,
        )
