"""The job's newest checkpoint: a fenced pointer that every rank reads and only the lock's holder moves.

"The newest file" is a guess across processes (a new process knows nothing of
the saves before it), and a checkpoint under a fixed name is overwritten by
every holder. The pointer names the newest whole checkpoint any holder of the
job wrote: a :class:`~handofflock.FencedObject` (see ``docs/fencing.md``) at a
path or URL of the job's choosing, beside its checkpoints, whose payload is
``{"path": ..., "step": ..., "token": ...}``.

* The holder claims it right after taking the lock
  (:meth:`~handofflock.integrations.ranks.RankLock.acquire` does, before any
  rank returns): from then on a replaced holder that does not know it yet
  cannot move it.
* After each checkpoint is whole, the holder points it there: a write fenced
  by the lock's token. A stale holder's write raises
  :class:`~handofflock.StaleToken` and changes nothing. In a job of many
  ranks every rank calls :meth:`~handofflock.integrations.ranks.RankLock.point`
  instead, so that all of them learn the outcome at the same save.
* To resume, every rank reads it.

>>> latest = LatestCheckpoint("ckpts/latest.json", lock=lock)   # on the holder; lock=None on the others
>>> found = latest.read()                                       # every rank: the same Checkpoint, or None
>>> save(f"ckpts/step-{step}-token-{lock.token}.pt")            # a name no other holder uses
>>> latest.point(f"ckpts/step-{step}-token-{lock.token}.pt", step)

The pointer orders the holders of one lock object: a job's pointer is moved
under one lock URL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigurationError
from ..core.record import MAX_TOKEN
from ..fencing import FencedObject, FencedObjectCorrupt, FencedValue
from ..storage import open_url

if TYPE_CHECKING:
    from ..lock.handoff import HandoffLock

__all__ = ["Checkpoint", "LatestCheckpoint"]


@dataclass(frozen=True)
class Checkpoint:
    """What the pointer names: the checkpoint's path, its step (if given), the token of the hold that wrote it."""

    path: str
    step: int | None
    token: int


class LatestCheckpoint:
    """The fenced pointer at ``url`` (a path, or a lock-style URL) to a job's newest checkpoint.

    Pass the :class:`~handofflock.HandoffLock` on the rank that holds it:
    :meth:`claim` and :meth:`point` write with its token, after
    ``lock.check()``. Without ``lock`` the object only reads, and
    :meth:`point` does nothing, so every rank can make the same calls.
    No I/O in the constructor.
    """

    def __init__(self, url: str | os.PathLike[str], *, lock: HandoffLock | None = None, timeout: float = 30.0) -> None:
        storage, key = open_url(url)
        self.url = os.fspath(url)
        self.lock = lock
        writer_id, clock = (None, None) if lock is None else (lock.owner_id, lock.clock)
        self._fence = FencedObject(storage, key, writer_id=writer_id, clock=clock, timeout=timeout)

    def read(self) -> Checkpoint | None:
        """The checkpoint the pointer names now, or None if no holder has pointed it anywhere yet."""
        return self._decode(self._fence.read())

    def claim(self) -> Checkpoint | None:
        """Raise the pointer's fence to the lock's token (the holder, right after acquiring); return what it names.

        Raises :class:`~handofflock.StaleToken` if a newer holder has already
        written, and :class:`~handofflock.LockLost` if the lock knows it is lost.
        """
        if self.lock is None:
            raise ConfigurationError("claim() needs the lock: pass lock= on the rank that holds it")
        self.lock.check()
        return self._decode(self._fence.claim(self.lock.token))

    def point(self, path: str | os.PathLike[str], step: int | None = None) -> Checkpoint | None:
        """Name ``path`` (a whole checkpoint, of ``step``) as the newest; returns it. Does nothing without ``lock``.

        A local path is stored absolute. Raises :class:`~handofflock.StaleToken`
        (nothing written) if a holder with a higher token has claimed or
        written the pointer: this holder was replaced. This raises on the
        holder alone; ranks call :meth:`RankLock.point <handofflock.integrations.ranks.RankLock.point>`,
        which makes the outcome every rank's.
        """
        if self.lock is None:
            return None
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ConfigurationError(f"a checkpoint's step is an int >= 0 or None, not {step!r}")
        where = os.fspath(path)
        if "://" not in where:
            where = os.path.abspath(where)
        self.lock.check()
        token = self.lock.token
        return self._decode(self._fence.write({"path": where, "step": step, "token": token}, token))

    def _decode(self, value: FencedValue) -> Checkpoint | None:
        """The payload as a :class:`Checkpoint`; anything but ours or nothing raises ``FencedObjectCorrupt``."""
        payload: Any = value.payload
        if payload is None:
            return None
        if isinstance(payload, dict):
            path, step, token = payload.get("path"), payload.get("step"), payload.get("token")
            if (
                isinstance(path, str)
                and path
                and (step is None or (type(step) is int and step >= 0))
                and type(token) is int
                and 1 <= token <= MAX_TOKEN
            ):
                return Checkpoint(path, step, token)
        raise FencedObjectCorrupt(
            self._fence.url,
            "a latest-checkpoint pointer's payload is {'path': a non-empty string, 'step': an int >= 0 or null, "
            f"'token': a fencing token}}, not {str(payload)[:200]!r}",
        )

    def __repr__(self) -> str:
        return f"<LatestCheckpoint {self.url!r} {'holder' if self.lock is not None else 'reader'}>"
