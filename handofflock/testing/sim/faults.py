"""The simulated store (:class:`SimStore`, in place of a real backend) and the faults it injects.

One shared :class:`~handofflock.storage.MemoryStorage` is the bucket; each
simulated process talks to it through its own :class:`SimStore` connection.
A request takes time on the way there and back and is applied at one instant
in between, so a reply can describe a state that has moved on by the time it
arrives (the only staleness GCS shows: its reads are strongly consistent).
Faults, per world: requests refused before anything is applied (503), 429s
at GCS's per-object rate (about one write a second, bursts refused) and at
random, writes applied whose reply is lost, late commits (a write the client
cut off at its timeout, which the store applies seconds later: on its
precondition, as a real store does, so only if nobody wrote meanwhile),
slow reads (seconds, shorter than the lock's timeouts), and slow writes (up to
1.5 times the request's timeout: one that passes it is cut off there, applied
before the cut or landing after it). Every request, its reply and every write the store
applies (with its generation) go into the checker's history; nothing here judges them.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ...core import buggify
from ...core.errors import PreconditionFailed, TransientStorageError
from ...storage import MemoryStorage
from .checker import KEY, Event
from .hub import Hub

T = TypeVar("T")

#: GCS allows about one write a second to one object; faster writes risk a 429.
GCS_WRITES_PER_SECOND = 1.0
#: A write this soon after the object's last one is a burst, refused at ``gcs_rate``: the default window. A swarm
#: world may use GCS's real rule instead, a whole second (``Faults.burst_window``), which an owner at ttl 5 may not
#: survive (seed 4 with 1.0 here before the swarm).
BURST_WINDOW = 0.5 / GCS_WRITES_PER_SECOND


@dataclass
class Faults:
    fail: float = 0.0  # a request refused (503), nothing applied
    throttle: float = 0.0  # a 429 with Retry-After, at random
    gcs_rate: float = 0.0  # chance of a 429 for a write within 1 s of the object's last write
    lost_reply: float = 0.0  # a write applied, its reply lost
    late_commit: float = 0.0  # a write cut off at its timeout, applied by the store later
    late_commit_max: float = 3.0  # how long after the cut it may land
    slow_read: float = 0.0  # a read taking seconds
    slow_read_max: float = 0.0
    slow_write: float = 0.0  # a write (or delete) taking up to 1.5 times its timeout: past it, cut off there
    max_latency: float = 0.05
    burst_window: float = BURST_WINDOW  # a write this soon after the object's last one may meet a 429
    cut_reads: bool = False  # a slow read is cut off at its request's timeout, as a real client's is


@dataclass
class Net:
    """What every connection shares: the bucket, the hub, the dice, the faults, and who listens."""

    hub: Hub
    rng: random.Random
    faults: Faults
    backend: MemoryStorage
    history: Callable[[Event], None]  # the checker's: appends, never judges
    counts: Counter[str]  # the checker's: what the run explored
    chaos: bool = True
    last_write: dict[str, float] = field(default_factory=dict)
    #: The late commits' own dice: a world without them draws from ``rng`` exactly as before.
    late: random.Random = field(default_factory=lambda: random.Random(0))
    #: By party: how many of its next writes on the lock meet a 429, whatever the dice say (aimed by the world).
    refuse: Counter[Any] = field(default_factory=Counter)


class SimStore:
    """One process's connection to the shared store: requests take time and may fail."""

    def __init__(self, net: Net, party: Any, *, min_write_interval: float) -> None:
        self.net, self.party = net, party
        self.url = "memory://sim"
        self.min_write_interval = min_write_interval

    def _hit(self, p: float) -> bool:
        return self.net.chaos and p > 0 and self.net.rng.random() < p

    def _request(
        self,
        op: str,
        key: str,
        apply: Callable[[], T],
        *,
        mutation: bool,
        timeout: float | None = None,
        match: int | None = None,
    ) -> T:
        hub, sent = self.net.hub, self.net.hub.now
        # A write's or a delete's request carries the generation it is conditioned on.
        self.net.history(Event(sent, self.party, "request", key, op, result=match, local=self._local()))
        try:
            result = self._send(op, key, apply, mutation=mutation, timeout=timeout)
        except BaseException as exc:  # the thread may be unwound at the end of a run: said all the same
            self.net.history(Event(hub.now, self.party, "reply", key, f"{op}: {type(exc).__name__}: {exc}", sent=sent))
            raise
        # A read's reply carries the generation it was answered at (0: no object) and the bytes read, a write's
        # the generation it made, a listing's the generation it lists for the lock.
        generation = result[1] if isinstance(result, tuple) else result if isinstance(result, int) else 0
        if isinstance(result, dict):
            generation = result.get(KEY, 0)
        data = result[0] if isinstance(result, tuple) and isinstance(result[0], bytes) else b""
        reply = Event(hub.now, self.party, "reply", key, f"{op}: ok", data, generation, sent=sent, local=self._local())
        self.net.history(reply)
        return result

    def _local(self) -> float:
        """The party's wall clock now (0 for a store no party holds)."""
        return 0.0 if self.party is None else float(self.party.clock.time())

    def _send(self, op: str, key: str, apply: Callable[[], T], *, mutation: bool, timeout: float | None) -> T:
        net, f, hub = self.net, self.net.faults, self.net.hub
        if mutation and net.chaos and f.late_commit and net.late.random() < f.late_commit:
            return self._late(op, key, apply, 1.0 if timeout is None else timeout)
        if mutation and net.chaos and f.slow_write and net.late.random() < f.slow_write:
            return self._slow(op, key, apply, 1.0 if timeout is None else timeout)
        if op == "read" and f.slow_read and net.rng.random() < f.slow_read:
            net.counts["slow_reads"] += 1
            took = net.rng.uniform(1.0, f.slow_read_max)
            if f.cut_reads and timeout is not None and took > timeout:
                net.counts["reads_cut"] += 1
                hub.park(hub.now + timeout)
                raise TransientStorageError(f"sim: {op} cut off at its timeout ({timeout:.2f} s)", ambiguous=False)
            hub.park(hub.now + took)
        else:
            hub.park(hub.now + net.rng.random() * f.max_latency)
        if self._hit(f.fail):
            raise TransientStorageError(f"sim: 503 on {op}", status=503, ambiguous=False)
        if mutation:
            recent = hub.now - net.last_write.get(key, -1e9) < f.burst_window
            aimed = key == KEY and net.chaos and net.refuse[self.party] > 0
            if aimed:
                net.refuse[self.party] -= 1
            if aimed or self._hit(f.throttle) or (recent and self._hit(f.gcs_rate)):
                net.counts["throttled"] += 1
                raise TransientStorageError(f"sim: 429 on {op}", status=429, ambiguous=False, retry_after=1.0)
        result = apply()  # the store applies it at this instant
        if mutation:
            net.last_write[key] = hub.now
        hub.park(hub.now + net.rng.random() * f.max_latency)
        if mutation and self._hit(f.lost_reply):
            raise TransientStorageError(f"sim: reply to {op} lost", ambiguous=True)
        return result

    def _late(self, op: str, key: str, apply: Callable[[], T], timeout: float, lands: float | None = None) -> T:
        """The request stalls; the client cuts it at ``timeout`` and the store applies it later, at ``lands``
        if given (or refuses it on its precondition, if the object moved on meanwhile)."""
        net, hub = self.net, self.net.hub
        net.counts["late_commits"] += 1
        if lands is None:
            lands = hub.now + timeout + net.late.uniform(0.0, net.faults.late_commit_max)

        def commit() -> None:
            hub.park(lands)
            try:
                apply()
            except PreconditionFailed:
                return
            net.last_write[key] = hub.now

        hub.spawn(f"store-late-{op}", commit)  # the store's, not the process's: it lands if the process is gone
        hub.park(hub.now + timeout)
        raise TransientStorageError(f"sim: {op} cut off at its timeout ({timeout:.2f} s)", ambiguous=True)

    def _slow(self, op: str, key: str, apply: Callable[[], T], timeout: float) -> T:
        """A write that takes from 0.4 s to 1.5 times ``timeout``, applied somewhere along the way. Past the
        timeout the client cuts it off there: applied before the cut (its reply lost) or landing after it
        (a late commit, on its precondition)."""
        net, hub = self.net, self.net.hub
        net.counts["slow_writes"] += 1
        sent, took = hub.now, net.late.uniform(0.4, max(0.5, 1.5 * timeout))
        applies, cut = sent + net.late.uniform(0.0, took), took > timeout
        if cut and applies > sent + timeout:
            return self._late(op, key, apply, timeout, lands=applies)
        hub.park(applies)
        refused: PreconditionFailed | None = None
        try:
            result = apply()
            net.last_write[key] = hub.now
        except PreconditionFailed as exc:
            refused = exc
        if cut:
            net.counts["cut_after_applied"] += 1
            hub.park(sent + timeout)
            raise TransientStorageError(f"sim: {op} cut off at its timeout ({timeout:.2f} s)", ambiguous=True)
        hub.park(sent + took)
        if refused is not None:
            raise refused
        return result

    def read(self, key: str, *, max_bytes: int | None = None, timeout: float | None = None) -> tuple[bytes, int] | None:
        read = lambda: self.net.backend.read(key, max_bytes=max_bytes)  # noqa: E731
        return self._request("read", key, read, mutation=False, timeout=timeout)

    def write(self, key: str, data: bytes, *, if_generation_match: int, timeout: float | None = None) -> int:
        def apply() -> int:
            match = if_generation_match
            if match == buggify.NO_MATCH:  # only a planted bug writes without a precondition
                found = self.net.backend.read(key)
                match = 0 if found is None else found[1]
            generation = self.net.backend.write(key, data, if_generation_match=match)
            self.net.history(Event(self.net.hub.now, self.party, "applied", key, "write", data, generation, match))
            return generation

        return self._request("write", key, apply, mutation=True, timeout=timeout, match=if_generation_match)

    def delete(self, key: str, *, if_generation_match: int, timeout: float | None = None) -> None:
        def apply() -> None:
            self.net.backend.delete(key, if_generation_match=if_generation_match)

        self._request("delete", key, apply, mutation=True, timeout=timeout, match=if_generation_match)

    def list(self, prefix: str, *, timeout: float | None = None) -> dict[str, int]:
        self.net.counts["listings"] += 1
        return self._request("list", prefix, lambda: self.net.backend.list(prefix), mutation=False, timeout=timeout)

    def close(self) -> None:
        pass
