"""Small test helpers shared by several test modules."""

from __future__ import annotations

import os


class FakeClock:
    """A settable epoch-milliseconds clock; tests move it, including backwards."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def example_count(default: int) -> int:
    """Hypothesis example budget; BUCKETSTORE_EXAMPLES scales it for long runs."""
    return int(os.environ.get("BUCKETSTORE_EXAMPLES", default))
