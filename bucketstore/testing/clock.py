"""A settable clock for deterministic tests."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A settable epoch-milliseconds clock: pass it where a tracker takes ``clock``.

    Calling it returns :attr:`now`; tests move it with :meth:`advance` or by setting
    :attr:`now`, backwards included (a tracker must cope with a clock that steps back).

    >>> clock = FakeClock(1_000)
    >>> clock.advance(250)
    >>> clock()
    1250

    :param now: the starting time in epoch milliseconds.
    """

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        """Return the current time in epoch milliseconds."""
        return self.now

    def advance(self, ms: int) -> None:
        """Move the clock by ``ms`` milliseconds (negative: backwards).

        :param ms: how far to move it.
        """
        self.now += ms
