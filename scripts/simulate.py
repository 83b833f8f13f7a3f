#!/usr/bin/env python3
"""Run the deterministic simulation of the lock: ``python -m handofflock.testing.sim`` (see its --help).

``--mutate`` runs the mutation run instead (scripts/mutate.py, see ``--mutate --help``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if __name__ == "__main__":
    if "--mutate" in sys.argv[1:]:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from mutate import main as mutate

        sys.exit(mutate(sys.argv[1:]))
    from handofflock.testing.sim.__main__ import main

    sys.exit(main())
