"""Small test helpers shared by several test modules."""

from __future__ import annotations

import os

from bucketstore.testing.clock import FakeClock

__all__ = ["FakeClock", "example_count"]


def example_count(default: int) -> int:
    """Hypothesis example budget; BUCKETSTORE_EXAMPLES scales it for long runs."""
    return int(os.environ.get("BUCKETSTORE_EXAMPLES", default))
