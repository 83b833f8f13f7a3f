"""The deterministic simulation of the lock, and an exhaustive check of its protocol.

Run it as ``python -m handofflock.testing.sim`` (see :mod:`.__main__`); docs/reliability.md says what it explores.
"""
