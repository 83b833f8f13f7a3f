"""The deterministic simulation of the lock, and an exhaustive check of its protocol (see __main__ and docs/reliability.md)."""
