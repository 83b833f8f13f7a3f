"""Threads of the library leave process signals to the main thread.

CPython runs signal handlers in the main thread only, and only between
bytecodes. The kernel hands a process-directed signal (SIGTERM from
Kubernetes, Ctrl-C, SIGUSR1) to any thread that does not block it. When it
picks one of our background threads while the main thread sits in a long C
call (``time.sleep``, a blocking read, a checkpoint's ``write``), the handler
waits for that call to end: a second SIGTERM meant to cut a slow checkpoint
short would wait out the checkpoint. So every thread the library starts
blocks the asynchronous signals first thing, and the kernel delivers them to
a thread that takes them, the main thread at least, which is interrupted at
once (EINTR) and runs the handler.

The one exception is the notifier thread that runs ``on_release_requested``
and the other receivers: it runs user code, and a process that code starts
would inherit a blocked mask (a child that cannot be stopped by SIGTERM).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

#: Signals the kernel sends to the thread that faulted (or that called abort()): never blocked.
_SYNCHRONOUS = frozenset(
    getattr(signal, name)
    for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGABRT")
    if hasattr(signal, name)
)


def leave_signals_to_the_main_thread() -> None:
    """Block this thread's asynchronous signals (a no-op where threads have no signal mask)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - _SYNCHRONOUS)


def quiet(target: Callable[..., Any]) -> Callable[..., Any]:
    """``target`` to run as a thread that first blocks asynchronous signals."""

    def run(*args: Any, **kwargs: Any) -> Any:
        leave_signals_to_the_main_thread()
        return target(*args, **kwargs)

    return run
