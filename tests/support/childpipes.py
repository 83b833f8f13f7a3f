"""Reading a child's output line by line without losing what follows.

``proc.stdout.readline()`` on a text pipe reads a whole chunk and keeps the lines after the first in
its buffer, while ``communicate()`` (with more than one pipe) reads the pipe's file descriptor itself:
the buffered lines never reach it. On a loaded machine the child has often written them all by the
time the test reads, and a later assertion on ``communicate()``'s output fails on a line that was
printed. :func:`next_line` reads a byte at a time, so nothing is buffered past the line it returns.
"""

from __future__ import annotations

import os
import subprocess


def next_line(proc: subprocess.Popen) -> str:
    """The child's next line of stdout (with its newline; "" at end of file)."""
    return line_from(proc.stdout)


def line_from(pipe) -> str:
    """The next line of ``pipe`` (a child's stdout or stderr), read a byte at a time: nothing stays in a
    buffer where ``select()`` on the pipe, or ``communicate()``, would not see it."""
    got = bytearray()
    while not got.endswith(b"\n"):
        byte = os.read(pipe.fileno(), 1)
        if not byte:
            break
        got += byte
    return got.decode()
