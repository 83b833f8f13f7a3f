#!/usr/bin/env python3
"""Run the deterministic simulation of the lock: ``python -m handofflock.testing.sim`` (see its --help)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from handofflock.testing.sim.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
