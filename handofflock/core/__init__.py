"""The core: the lock record, the pure protocol decisions, clocks, timing rules and errors.

Nothing here does I/O or imports anything above it (storage, the lock, the edges).
"""
