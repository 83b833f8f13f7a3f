"""What ``handofflock run`` shows while it waits: one live line on a terminal, a line now and then elsewhere.

The line says how long we have waited, who holds the lock (its label), whether
the holder has been told, and when its grace ends::

    waiting 1 min 12 s for gs://b/t.json: held by pod=ml/train-0; notified yes; grace ends by 2026-11-23T10:02:11.000Z

or, once the holder has declined (``run --no-yield`` writes so into the
record), that it has, and for a patient waiter (``run --no-request``), which
asks nobody, that it waits for the holder to finish::

    waiting 12.0 s for gs://b/t.json: held by pod=ml/train-0; declined by pod=ml/train-0 (it does not yield) ...
    waiting 12.0 s for gs://b/t.json: held by pod=ml/train-0; waiting for it to finish (not asking it to yield)

Where it comes from: a read of the lock every ``read_every`` seconds, in a
helper thread so that a slow store never holds up the main loop (reads cost
nothing on the store's write budget). "Notified" is yes once the holder
has renewed its lease since we registered as the waiter: a renewal is a write
conditional on the record that names us, so the holder had read us (and was
told, within its waiter check interval) before it. The grace is the one the
holder wrote into its label (``handofflock run --grace``); it ends at most that
long after the renewal we saw, hence "by".

On a terminal the line is drawn with `rich <https://rich.readthedocs.io>`_ when
it is installed (``pip install handofflock[cli]``), else with a carriage
return; elsewhere (a log file, a pipe) a plain line is printed when something
changes, and otherwise every ``heartbeat`` seconds, never two within
``min_spacing`` seconds.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from .core.errors import HandoffLockError
from .core.threads import quiet
from .core.timefmt import age, iso
from .storage import records


class WaitLine:
    """The waiting status of one ``run``; :meth:`tick` it from the main loop, :meth:`close` it when done."""

    #: Seconds between reads of the lock; elsewhere than on a terminal, at least ``min_spacing`` seconds
    #: between two printed lines and at most ``heartbeat`` seconds without one.
    read_every, min_spacing, heartbeat = 2.0, 5.0, 30.0

    def __init__(
        self,
        lock: Any,
        *,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        started: float | None = None,
        asks: bool = True,
    ) -> None:
        self.lock = lock
        self.asks = asks  # False: a patient waiter, which never asks the holder to yield
        self.stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self.started = clock() if started is None else started  # when the wait began (monotonic)
        self._next_read = clock()
        self._holder: str | None = None
        self._waiting_as: float | None = None  # the holder's expiresAt when we first saw ourselves waiting
        self._notified_at: float | None = None  # wall time we saw the holder renew since
        self._grace: float | None = None
        self._declined = False  # the holder declined our request (its record says so)
        self._printed_at = float("-inf")
        self._printed: tuple[Any, ...] | None = None
        self._broken = False
        self._reading = False
        self.terminal = is_terminal(self.stream)
        self._rich: Any = None
        self._drawn = False  # the plain terminal line is on screen
        if self.terminal:
            self._rich = _rich_status(self.stream)

    # -- state ------------------------------------------------------------------------------

    def _read_in_background(self) -> None:
        """One read, off the main loop (which must stay free to pass signals on); one at a time."""
        if self._reading:
            return
        self._reading = True

        def read() -> None:
            try:
                self._read()
            finally:
                self._reading = False

        threading.Thread(target=quiet(read), name="handofflock-run-waitline", daemon=True).start()

    def _read(self) -> None:
        try:
            st = self.lock.status()
        except HandoffLockError:
            return  # the next read may work; the line keeps what it knew
        me = self.lock.instance  # by instance: a holder with our owner id is another party, and we wait for it
        if st.owner_id is None or st.owner_instance == me:
            self._holder = "nobody" if st.owner_id is None else self._holder
            return
        self._holder = st.owner_label.text if st.owner_label is not None else st.owner_id
        self._grace = st.owner_label.grace if st.owner_label is not None else None
        self._declined = bool(st.waiter_instance == me and st.declined)
        if st.waiter_instance == me and st.expires_at is not None:
            if self._waiting_as is None:
                self._waiting_as = st.expires_at
            elif self._notified_at is None and st.expires_at > self._waiting_as:
                self._notified_at = time.time()
        else:
            self._waiting_as = self._notified_at = None  # not (or no longer) the waiter: nobody was told

    def text(self) -> str:
        """The status line as it stands."""
        waited = age(self._clock() - self.started)
        # Any store of this process: `run`'s is its only one. "held by ?" would read as contention.
        for why in records.down().values():
            return f"waiting {waited} for {self.lock.url}: cannot reach the store: {why} (retrying)"
        holder = self._holder or "?"
        line = f"waiting {waited} for {self.lock.url}: held by {holder}"
        if not self.asks:
            return f"{line}; waiting for it to finish (not asking it to yield)"
        if self._declined:
            return f"{line}; declined by {holder} (it does not yield): waiting for it to finish"
        line += f"; notified {'yes' if self._notified_at else 'no'}"
        if self._notified_at is not None:
            if self._grace is not None:
                line += f"; grace ends by {iso(self._notified_at + self._grace)}"
            else:
                line += "; the holder states no grace"
        return line

    # -- drawing ----------------------------------------------------------------------------

    def tick(self) -> None:
        """Read the lock if due, and redraw (terminal) or print (elsewhere, when due)."""
        now = self._clock()
        if now >= self._next_read:
            self._next_read = now + self.read_every
            self._read_in_background()
        if self._broken:
            return
        try:
            if self._rich is not None:
                self._rich.update(self.text())
            elif self.terminal:
                self.stream.write("\r\x1b[K" + self.text()[: self._width() - 1])  # a wrapped line would not redraw
                self.stream.flush()
                self._drawn = True
            else:
                state = (self._holder, self._notified_at is not None, self._declined)
                due = state != self._printed or now >= self._printed_at + self.heartbeat
                news = self._declined and self._printed is not None and not self._printed[2]  # said at once
                if due and (news or now >= self._printed_at + self.min_spacing) and self._holder is not None:
                    self._printed, self._printed_at = state, now
                    self.stream.write(f"handofflock: {self.text()}\n")
                    self.stream.flush()
        except (OSError, ValueError):
            self._broken = True  # a closed or hung-up stderr never ends run

    def _width(self) -> int:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
        return max(20, columns) if columns > 0 else 10_000  # 0: a terminal that does not say (a bare pty)

    def say(self, line: str) -> None:
        """Print ``line`` above the live line (or as is elsewhere)."""
        try:
            if self._drawn:
                self.stream.write("\r\x1b[K")
                self._drawn = False
            if self._rich is not None:
                self._rich.console.print(line, markup=False, highlight=False, soft_wrap=True)
            else:
                self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            self._broken = True

    def close(self) -> None:
        """Take the live line off the screen."""
        try:
            if self._rich is not None:
                self._rich.stop()
                self._rich = None
            elif self._drawn:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._drawn = False
        except (OSError, ValueError):
            pass


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (False for a stream that cannot say: closed, replaced, a test's)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _rich_status(stream: IO[str]) -> Any:
    """A started ``rich`` status (spinner and one line) on ``stream``, or None without rich."""
    try:
        from rich.console import Console
    except ImportError:
        return None
    console = Console(file=stream, force_terminal=True, highlight=False)
    status = console.status("waiting", spinner="dots")
    status.start()
    return status
