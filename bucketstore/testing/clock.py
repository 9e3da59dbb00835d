"""A settable clock for deterministic tests."""

from __future__ import annotations

import threading

__all__ = ["FakeClock"]


class FakeClock:
    """A settable epoch-milliseconds clock: pass it where a tracker takes ``clock``.

    Calling it returns :attr:`now`; tests move it with :meth:`advance` or by setting
    :attr:`now`, backwards included (a tracker must cope with a clock that steps back).

    It is also the trackers' *sleeper* (:class:`bucketstore.waiting.Sleeper`): a thread
    blocked in ``tracker.wait_scheduled`` on a tracker with this clock sleeps until the
    clock is moved (or the tracker wakes it), never by real time, so waiting is as
    deterministic as the rest of a test.

    >>> clock = FakeClock(1_000)
    >>> clock.advance(250)
    >>> clock()
    1250

    :param now: the starting time in epoch milliseconds.
    """

    def __init__(self, now: int = 0) -> None:
        self._now = now
        self._changes = threading.Condition(threading.Lock())
        #: (condition, the clock value its sleeper saw) of each thread asleep on this clock.
        self._sleeping: list[tuple[threading.Condition, int]] = []

    def __call__(self) -> int:
        """Return the current time in epoch milliseconds."""
        return self._now

    @property
    def now(self) -> int:
        """The current time in epoch milliseconds; setting it wakes the sleepers."""
        return self._now

    @now.setter
    def now(self, value: int) -> None:
        with self._changes:
            self._now = value
            sleeping = list(dict.fromkeys(cond for cond, _ in self._sleeping))
        for cond in sleeping:
            # Taking the condition's lock orders this after a sleeper's last look at the
            # clock: it is either asleep (and woken now) or will read the new time.
            with cond:
                cond.notify_all()

    def advance(self, ms: int) -> None:
        """Move the clock by ``ms`` milliseconds (negative: backwards).

        :param ms: how far to move it.
        """
        self.now = self._now + ms

    def sleep_until(self, cond: threading.Condition, when_ms: int | None) -> None:
        """Sleep on ``cond`` (held by the caller) until notified or the clock is moved;
        return at once if the clock is already at ``when_ms``."""
        with self._changes:
            seen = self._now
            if when_ms is not None and seen >= when_ms:
                return
            entry = (cond, seen)
            self._sleeping.append(entry)
            self._changes.notify_all()
        try:
            cond.wait()
        finally:
            with self._changes:
                self._sleeping.remove(entry)
                self._changes.notify_all()

    def wait_for_sleepers(self, count: int, timeout: float = 60.0) -> None:
        """Block until ``count`` threads sleep on this clock having seen its current time.

        A test's proof that waiters have looked at the clock after its last move and
        found nothing due (they went back to sleep), without guessing a real delay.

        :raises TimeoutError: not so many after ``timeout`` real seconds (a hung test
            fails instead of hanging).
        """
        with self._changes:
            if not self._changes.wait_for(lambda: sum(seen == self._now for _, seen in self._sleeping) >= count,
                                          timeout):
                raise TimeoutError(f"{count} sleeper(s) at {self._now} ms expected, "
                                   f"{sum(seen == self._now for _, seen in self._sleeping)} found")
