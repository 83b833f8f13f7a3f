"""Placeholder demo: exercises the storage layer on the embedded local backend.

Replaced by the two-trainer handoff demo once the lock exists.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .errors import PreconditionFailed
from .storage import open_url


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="handofflock-demo-") as tmp:
        store, key = open_url(Path(tmp, "demo.json").as_uri())
        gen = store.write(key, b'{"ownerId": "A"}', if_generation_match=0)
        print(f"A created {key} at generation {gen}")
        try:
            store.write(key, b'{"ownerId": "B"}', if_generation_match=0)
        except PreconditionFailed as exc:
            print(f"B's create was refused: {exc}")
        data, gen = store.read(key)
        print(f"read back {data!r} at generation {gen}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
