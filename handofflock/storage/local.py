"""``file:///dir/name.json``: objects as files under a root directory, on one host.

Each key is one file, ``<root>/<key>``, holding a one-line header and then the
exact data bytes::

    #handofflock/local 1 live <generation> <length>\\n<data>

Every mutation writes a temp file beside the object, fsyncs it and renames it
over the object, so the (data, generation) pair changes in one atomic step and
a reader never sees a torn object. A delete leaves a tombstone (``deleted``, no
data) that keeps the generation, so a recreated key continues its sequence.
Mutations of a key are serialized by ``flock`` on a sidecar lock file, which
excludes other processes and, because every call opens its own descriptor,
other threads too. Nothing below the root is ever followed through a symlink.
See ``docs/local-backend.md`` for the format, the rules and the limits.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from contextlib import ExitStack
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX; refused at first use
    fcntl = None  # type: ignore[assignment]

from ..errors import ConfigurationError, InvalidKey, NotFound, PreconditionFailed, StorageError, TransientStorageError
from .base import MAX_KEY_BYTES, validate_generation, validate_key, validate_prefix

#: File names starting with this are the backend's own (lock and temp files);
#: keys with such a segment are refused, so an object can never collide with one.
RESERVED_PREFIX = ".handofflock."

MAGIC = b"#handofflock/local"
FORMAT_VERSION = 1
_MAX_HEADER = 128  # a header is ~60 bytes; anything longer is not ours
_MAX_GENERATION = 2**63 - 1  # generations stay int64, like GCS's
_FILE_MODE = 0o600
_DIR_MODE = 0o700

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # so a FIFO planted at a path cannot hang open()
_OPEN_ROOT = os.O_RDONLY | _DIRECTORY | _CLOEXEC  # the root is used as given, symlink or not
_OPEN_DIR = _OPEN_ROOT | _NOFOLLOW
_OPEN_FILE = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC

# errno values after which a retry can succeed: they are about this moment's
# resources, not about the store. ENOSPC, EDQUOT, EROFS and EIO are *not* here:
# they last until someone acts, and retrying against a failing disk hides it.
_TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOLCK, errno.EAGAIN, errno.ENOMEM, errno.ETIMEDOUT}
_SYMLINK_ERRNOS = {errno.ELOOP, errno.EMLINK, errno.ENOTDIR}  # what O_NOFOLLOW reports, by platform
_HINTS = {
    errno.ENOSPC: "free space on the filesystem",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the filesystem is mounted read-only",
    errno.EIO: "the disk reported an I/O error; check the system log",
    errno.ENOTDIR: "a component of the path is not a directory",
    errno.ENAMETOOLONG: "a key segment is longer than the filesystem allows",
}


def _header(state: str, generation: int, length: int) -> bytes:
    return b"%s %d %s %d %d\n" % (MAGIC, FORMAT_VERSION, state.encode(), generation, length)


def _parse(head: bytes, size: int) -> tuple[str, int, int] | None:
    """``(state, generation, header_length)`` if ``head`` starts a complete file of ours, else None.

    Strict on purpose: a file that is not exactly what we write (hand edits,
    truncation, trailing bytes) is treated as foreign, never half-trusted.
    """
    end = head.find(b"\n")
    if end < 0:
        return None
    fields = head[:end].split(b" ")
    if len(fields) != 5 or fields[0] != MAGIC or fields[1] != b"%d" % FORMAT_VERSION:
        return None
    state, gen_s, len_s = fields[2], fields[3], fields[4]
    if not (gen_s.isdigit() and len_s.isdigit()) or gen_s[:1] == b"0" or (len_s[:1] == b"0" and len_s != b"0"):
        return None
    generation, length = int(gen_s), int(len_s)
    if generation > _MAX_GENERATION or size != end + 1 + length:
        return None
    if state == b"live":
        return "live", generation, end + 1
    if state == b"deleted" and length == 0:
        return "deleted", generation, end + 1
    return None


def _foreign_generation(st: os.stat_result) -> int:
    # A file without our header (written by hand) gets its mtime in microseconds:
    # on the same scale as our own generations, so the sequence keeps increasing
    # when we replace it, and it changes whenever the file is rewritten (at the
    # filesystem's timestamp granularity).
    return max(1, min(st.st_mtime_ns // 1000, _MAX_GENERATION))


def _pread_exactly(fd: int, n: int, offset: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = os.pread(fd, min(n - got, 1 << 20), offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _sidecar(name: str, suffix: str) -> str:
    # Hashed so the name stays short whatever the key's length (NAME_MAX is 255 bytes).
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
    return f"{RESERVED_PREFIX}{digest}.{suffix}"


def _fsync(fd: int) -> None:
    full = getattr(fcntl, "F_FULLFSYNC", None)  # macOS: fsync() alone does not flush the drive cache
    if full is not None:
        try:
            fcntl.fcntl(fd, full)
            return
        except OSError:
            pass
    os.fsync(fd)


_POSIX_OK = fcntl is not None and os.name == "posix" and bool(_NOFOLLOW) and os.open in os.supports_dir_fd


def _require_posix() -> None:
    if not _POSIX_OK:
        raise StorageError(
            "LocalStorage needs a POSIX system (flock, O_NOFOLLOW, dir_fd); on this platform use gs:// or memory://"
        )


class LocalStorage:
    """Objects as files under ``root``, safe across threads and processes of one host.

    Keys are relative ``/``-separated paths below ``root``; parent directories
    (and ``root`` itself) are created on first write, mode ``0o700``; files are
    ``0o600``. Symlinks below ``root`` are refused, never followed (``root``
    itself, and the path leading to it, are used as given).

    >>> store = LocalStorage("/var/lib/myjob/locks")
    >>> gen = store.write("train.json", b"{}", if_generation_match=0)
    >>> store.read("train.json") == (b"{}", gen)
    True

    ``lock_timeout`` bounds the wait for another writer of the same key (which
    holds the key's lock for one fsync'd write); past it the call raises
    :class:`~handofflock.errors.TransientStorageError` instead of hanging.
    Single host only: see ``docs/local-backend.md`` about network filesystems.
    """

    def __init__(self, root: str | os.PathLike[str], *, lock_timeout: float = 30.0) -> None:
        if not isinstance(root, (str, os.PathLike)):
            raise ConfigurationError(f"LocalStorage root must be a str or path, got {type(root).__name__}")
        text = os.fspath(root)
        if not isinstance(text, str) or not text or "\x00" in text:
            raise ConfigurationError(f"LocalStorage root {root!r} must be a non-empty text path without NUL")
        if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float)) or not lock_timeout > 0:
            raise ConfigurationError(f"lock_timeout must be a number > 0, got {lock_timeout!r}")
        # abspath, not resolve(): no I/O here, and symlinks are refused later, not resolved away.
        self.root = os.path.abspath(text)
        self.url = Path(self.root).as_uri()
        self.lock_timeout = float(lock_timeout)

    def __repr__(self) -> str:
        return f"LocalStorage({self.root!r})"

    # -- the contract ---------------------------------------------------------

    def read(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, int] | None:
        """Return ``(data, generation)`` or ``None``; reads at most ``max_bytes + 1`` data bytes.

        Lock-free: objects are only ever replaced by rename, so the file opened
        is one complete version. A file without our header is returned whole,
        as data, at a generation derived from its mtime (see the module docs).
        """
        self._check_key(key)
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0):
            raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        cap = None if max_bytes is None else max_bytes + 1
        with self._mapped(key), ExitStack() as stack:
            dir_fd, name = self._walk(stack, key, create=False)
            if dir_fd is None:
                return None
            found = self._open_object(stack, dir_fd, name, key)
            if found is None:
                return None
            fd, st, parsed = found
            if parsed is None:
                size = st.st_size if cap is None else min(cap, st.st_size)
                return _pread_exactly(fd, size, 0), _foreign_generation(st)
            state, generation, offset = parsed
            if state == "deleted":
                return None
            length = st.st_size - offset
            return _pread_exactly(fd, length if cap is None else min(cap, length), offset), generation

    def write(self, key: str, data: bytes, *, if_generation_match: int) -> int:
        """Write ``data`` if the generation is ``if_generation_match`` (0: must be absent).

        Returns the new generation: ``max(previous + 1, now in microseconds)``,
        where a tombstone's generation counts as previous.
        """
        self._check_key(key)
        validate_generation(if_generation_match)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        with self._mapped(key), ExitStack() as stack:
            dir_fd, name = self._walk(stack, key, create=True)
            assert dir_fd is not None
            self._precheck(dir_fd, name, key)  # refuse a symlink before creating its lock file
            self._lock(stack, dir_fd, name, key)
            current, floor = self._state(stack, dir_fd, name, key)
            if current != if_generation_match:
                raise PreconditionFailed(key, if_generation_match, url=self.url)
            generation = max(floor + 1, time.time_ns() // 1000)
            if generation > _MAX_GENERATION:
                raise StorageError(f"generation of {key!r} would pass 2**63-1", url=self.url, key=key)
            self._replace(dir_fd, name, key, _header("live", generation, len(data)) + bytes(data))
            return generation

    def delete(self, key: str, *, if_generation_match: int) -> None:
        """Delete if the generation matches, leaving a tombstone that keeps the generation."""
        self._check_key(key)
        validate_generation(if_generation_match)
        with self._mapped(key), ExitStack() as stack:
            dir_fd, name = self._walk(stack, key, create=False)
            if dir_fd is None:
                raise NotFound(key, url=self.url)
            self._precheck(dir_fd, name, key)
            self._lock(stack, dir_fd, name, key)
            current, floor = self._state(stack, dir_fd, name, key)
            if current == 0:
                raise NotFound(key, url=self.url)
            if current != if_generation_match:
                raise PreconditionFailed(key, if_generation_match, url=self.url)
            self._replace(dir_fd, name, key, _header("deleted", floor, 0))

    def list(self, prefix: str) -> dict[str, int]:
        """``{key: generation}`` of live objects under ``prefix``.

        Skips tombstones, the backend's own files, symlinks and anything that is
        not a regular file; hand-written files are listed as :meth:`read` sees them.
        """
        validate_prefix(prefix)
        dir_part, _, name_prefix = prefix.rpartition("/")
        found: dict[str, int] = {}
        with self._mapped(prefix or None), ExitStack() as stack:
            start, _ = self._walk(stack, f"{dir_part}/x" if dir_part else "x", create=False)
            if start is None:
                return found
            pending = [(os.dup(start), f"{dir_part}/" if dir_part else "", name_prefix)]
            while pending:
                fd, base, must_start = pending.pop()
                try:
                    with os.scandir(fd) as entries:
                        for entry in entries:
                            self._list_entry(fd, entry, base, must_start, found, pending)
                finally:
                    os.close(fd)
        return found

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own descriptors."""

    # -- paths ----------------------------------------------------------------

    def _check_key(self, key: str) -> None:
        validate_key(key)
        if any(part.startswith(RESERVED_PREFIX) for part in key.split("/")):
            raise InvalidKey(f"object key {key!r} uses {RESERVED_PREFIX!r}, reserved for the local backend's own files")

    def _walk(self, stack: ExitStack, key: str, *, create: bool) -> tuple[int | None, str]:
        """Open the directory holding ``key``, one component at a time, never following a symlink.

        Returns ``(dir_fd, file name)``, or ``(None, name)`` if a directory is
        missing and ``create`` is False.
        """
        _require_posix()
        *parts, name = key.split("/")
        try:
            fd = os.open(self.root, _OPEN_ROOT)
        except FileNotFoundError:
            if not create:
                return None, name
            self._make_root()
            fd = os.open(self.root, _OPEN_ROOT)
        stack.callback(os.close, fd)
        for i, part in enumerate(parts):
            sub = self._open_dir(fd, part, "/".join(parts[: i + 1]), create=create)
            if sub is None:
                return None, name
            stack.callback(os.close, sub)
            fd = sub
        return fd, name

    def _make_root(self) -> None:
        # Like os.makedirs, but each directory we create gets 0o700 whatever the
        # umask, and its entry is synced into its parent.
        missing, path = [], self.root
        while not os.path.lexists(path):
            missing.append(path)
            path = os.path.dirname(path)
        for path in reversed(missing):
            try:
                os.mkdir(path, _DIR_MODE)
            except FileExistsError:
                continue  # another writer made it first
            with ExitStack() as stack:
                fd, parent = os.open(path, _OPEN_ROOT), os.open(os.path.dirname(path), _OPEN_ROOT)
                stack.callback(os.close, fd)
                stack.callback(os.close, parent)
                os.fchmod(fd, _DIR_MODE)
                os.fsync(parent)

    def _open_dir(self, parent: int, name: str, relpath: str, *, create: bool) -> int | None:
        try:
            return os.open(name, _OPEN_DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as exc:
            if exc.errno in _SYMLINK_ERRNOS:
                self._refuse(parent, name, relpath, exc)
            raise
        try:
            os.mkdir(name, _DIR_MODE, dir_fd=parent)
            made = True
        except FileExistsError:
            made = False  # a concurrent writer created it; open it like any other
        try:
            fd = os.open(name, _OPEN_DIR, dir_fd=parent)
        except OSError as exc:  # a symlink swapped in meanwhile lands here
            if exc.errno in _SYMLINK_ERRNOS:
                self._refuse(parent, name, relpath, exc)
            raise
        if made:
            os.fchmod(fd, _DIR_MODE)
            os.fsync(parent)  # the new directory entry must survive a crash too
        return fd

    def _refuse(self, dir_fd: int, name: str, relpath: str, exc: OSError | None = None) -> None:
        path = os.path.join(self.root, relpath)
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            why = "is a symbolic link; handofflock never follows symlinks below its root. Replace it with a real one"
        elif stat.S_ISDIR(mode):
            why = "is a directory, not an object file"
        elif mode and exc is not None:
            why = "is not a directory: a file sits where the key needs a directory"
        elif mode:
            why = "is not a regular file"
        else:
            why = f"cannot be opened safely ({exc})"
        raise StorageError(f"local store {self.url}: {path!r} {why}", url=self.url, key=relpath) from exc

    # -- objects --------------------------------------------------------------

    def _open_object(self, stack: ExitStack, dir_fd: int, name: str, key: str, *, strict: bool = True):
        """Open an object file: ``(fd, stat, parsed header or None)``, or None if absent.

        ``strict`` refuses (raises) on a symlink or non-regular file; listing skips them.
        """
        try:
            fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno not in _SYMLINK_ERRNOS:
                raise
            if strict:
                self._refuse(dir_fd, name, key, exc)
            return None
        stack.callback(os.close, fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            if strict:
                self._refuse(dir_fd, name, key)
            return None
        return fd, st, _parse(os.pread(fd, _MAX_HEADER, 0), st.st_size)

    def _list_entry(self, fd: int, entry: os.DirEntry, base: str, must_start: str, found: dict, pending: list) -> None:
        name = entry.name
        if not name.startswith(must_start) or name.startswith(RESERVED_PREFIX):
            return
        key = base + name
        try:
            validate_key(key)
        except InvalidKey:
            return  # a name no key can have (e.g. not UTF-8): not an object
        if entry.is_dir(follow_symlinks=False):
            if len(key.encode()) < MAX_KEY_BYTES:
                sub = self._open_dir(fd, name, key, create=False)
                if sub is not None:
                    pending.append((sub, key + "/", ""))
        elif entry.is_file(follow_symlinks=False):
            with ExitStack() as stack:  # one file open at a time, however big the directory
                opened = self._open_object(stack, fd, name, key, strict=False)
                if opened is None:
                    return
                _, st, parsed = opened
                if parsed is None:
                    found[key] = _foreign_generation(st)
                elif parsed[0] == "live":
                    found[key] = parsed[1]

    def _precheck(self, dir_fd: int, name: str, key: str) -> None:
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISREG(mode):
            self._refuse(dir_fd, name, key)

    def _state(self, stack: ExitStack, dir_fd: int, name: str, key: str) -> tuple[int, int]:
        """``(current generation or 0 if absent, highest generation ever seen)``. Call under the lock."""
        found = self._open_object(stack, dir_fd, name, key)
        if found is None:
            return 0, 0
        _, st, parsed = found
        if parsed is None:
            generation = _foreign_generation(st)
            return generation, generation
        state, generation, _ = parsed
        return (0 if state == "deleted" else generation), generation

    def _lock(self, stack: ExitStack, dir_fd: int, name: str, key: str) -> None:
        """Take the key's lock: ``flock`` on a sidecar that is never replaced (unlike the object)."""
        lock_name = _sidecar(name, "lock")
        lock_rel = os.path.join(os.path.dirname(key), lock_name)
        flags = os.O_RDWR | _NOFOLLOW | _NONBLOCK | _CLOEXEC
        try:
            fd = os.open(lock_name, flags | os.O_CREAT | os.O_EXCL, _FILE_MODE, dir_fd=dir_fd)
            os.fchmod(fd, _FILE_MODE)
        except FileExistsError:
            try:
                fd = os.open(lock_name, flags, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno in _SYMLINK_ERRNOS:
                    self._refuse(dir_fd, lock_name, lock_rel, exc)
                raise
        stack.callback(os.close, fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            self._refuse(dir_fd, lock_name, lock_rel)
        # Poll rather than block, so a writer stopped (SIGSTOP, a hung disk) while
        # holding the lock costs others a typed error, not a hang. Holders keep it
        # for one write, so short first sleeps keep contended writes fast.
        deadline, delay = time.monotonic() + self.lock_timeout, 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TransientStorageError(
                        f"local store {self.url}: waited {self.lock_timeout:.1f}s for the lock of {key!r}; "
                        "another process holds it (stopped, or stuck on I/O?)",
                        url=self.url, key=key, ambiguous=False,
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def _replace(self, dir_fd: int, name: str, key: str, content: bytes) -> None:
        """Atomically and durably replace ``name`` with ``content``. Call under the key's lock."""
        tmp = _sidecar(name, "tmp")  # one per key: only the lock holder uses it; a crash leaves at most one
        try:
            os.unlink(tmp, dir_fd=dir_fd)  # a crash's leftover, or anything planted (unlink never follows)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, _FILE_MODE, dir_fd=dir_fd)
        try:
            os.fchmod(fd, _FILE_MODE)
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view):]
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
                url=self.url, key=key, ambiguous=True,
            ) from exc

    # -- errors ---------------------------------------------------------------

    def _mapped(self, key: str | None) -> "_ErrorMap":
        return _ErrorMap(self, key)


class _ErrorMap:
    """Turns any ``OSError`` escaping an operation into a typed storage error."""

    def __init__(self, store: LocalStorage, key: str | None) -> None:
        self.store, self.key = store, key

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if not isinstance(exc, OSError):
            return False
        store, key = self.store, self.key
        if isinstance(exc.filename, str) and os.path.isabs(exc.filename):
            where = exc.filename
        else:  # dir_fd-relative calls report only a name; the key says where
            where = os.path.join(store.root, key) if key else store.root
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise StorageError(
                f"local store {store.url}: permission denied on {where!r} ({exc.strerror}); check that the user "
                f"running this process (uid {os.geteuid()}) can read, write and search {store.root!r} and the files in it",
                url=store.url, key=key,
            ) from exc
        if exc.errno in _TRANSIENT:
            raise TransientStorageError(
                f"local store {store.url}: {exc.strerror or exc} on {where!r}; nothing was changed, retrying may help",
                url=store.url, key=key, ambiguous=False,
            ) from exc
        hint = _HINTS.get(exc.errno, "check the path and the filesystem")
        raise StorageError(
            f"local store {store.url}: {exc.strerror or exc} on {where!r} ({hint}); nothing was changed",
            url=store.url, key=key,
        ) from exc
