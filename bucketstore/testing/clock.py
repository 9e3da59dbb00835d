"""A settable clock for deterministic tests."""

from __future__ import annotations


class FakeClock:
    """A settable epoch-milliseconds clock; tests move it, including backwards."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms
