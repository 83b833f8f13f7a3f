"""The benchmark, run as ``python scripts/bench``: see __main__.py and docs/benchmarks.md."""
