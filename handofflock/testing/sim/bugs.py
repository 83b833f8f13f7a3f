"""The planted bugs the simulation must find: :mod:`handofflock.core.buggify`'s switches, named and explained."""

from __future__ import annotations

from ...core.buggify import BUGS, PROTOCOL_BUGS, planted

__all__ = ["BUGS", "PROTOCOL_BUGS", "planted"]
