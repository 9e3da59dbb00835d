"""Blocking until a tracker has due positions: ``wait_scheduled`` for every tracker type.

A broker wants each message at its time, not a poll loop. Pulsar re-arms one timer
per tracker whenever an earlier index arrives; here a caller blocks in
:meth:`DueWaiter.wait` on the tracker's own condition variable (which releases the
tracker's lock while it sleeps) until the earliest tracked index falls due, and is
woken early by

* an add of an index earlier than the one it sleeps towards (the tracker calls
  :meth:`DueWaiter.added`),
* ``close``, ``clear`` and ``Store.delete_tracker`` (the tracker notifies the condition),
* the clock: the real one by the computed timeout, a fake one when it is advanced
  (:class:`Sleeper`: a clock object with a ``sleep_until`` method is its own sleeper),
* a :class:`CancelToken` (the asyncio wrapper cancels the thread it started).

Exactness comes from the tracker, not from the sleep: every wake re-asks the
tracker's own ``get_scheduled_messages`` under its lock, so a wake that comes early
(a spurious wake, a wall clock that lags the monotonic one) finds nothing due and
sleeps again, and two waiters never get the same position.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .cutoff import Clock, check_max, system_clock

__all__ = ["Sleeper", "RealSleeper", "sleeper_for", "CancelToken", "DueWaiter", "timeout_ms"]

Batch = list[tuple[int, int]]


@runtime_checkable
class Sleeper(Protocol):
    """How a waiter sleeps until a time of the tracker's clock.

    ``sleep_until(cond, when_ms)`` is called with ``cond`` held; it must release it while
    sleeping (``cond.wait``), and return when ``cond`` is notified, when the clock reaches
    ``when_ms`` (None: no time limit), or spuriously. A fake clock implements it so that
    advancing the clock wakes the sleepers (:class:`bucketstore.testing.FakeClock`).
    """

    def sleep_until(self, cond: threading.Condition, when_ms: int | None) -> None: ...


class RealSleeper:
    """Sleeps ``when_ms - clock()`` real milliseconds on the condition (any clock that moves at
    real speed: the system clock, ``time.time() * 1000``, a monotonic one)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def sleep_until(self, cond: threading.Condition, when_ms: int | None) -> None:
        if when_ms is None:
            cond.wait()
            return
        remaining = (when_ms - self._clock()) / 1000.0
        if remaining > 0:
            cond.wait(remaining)


def sleeper_for(clock: Clock | None) -> Sleeper:
    """The sleeper that matches a tracker's clock: the clock itself if it can sleep (a fake
    clock), else real sleeping measured on that clock."""
    if clock is not None and isinstance(clock, Sleeper):
        return clock
    return RealSleeper(clock or system_clock)


def timeout_ms(timeout: float | None) -> int | None:
    """A ``timeout`` in seconds as clock milliseconds, rounded up (a wait never ends early)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
    if not timeout >= 0:  # also refuses NaN
        raise ValueError(f"timeout must be >= 0, not {timeout}")
    return math.ceil(timeout * 1000)


class CancelToken:
    """Ends a :meth:`DueWaiter.wait` from another thread: the wait returns ``[]`` at its next
    wake unless it has already taken a batch (a batch taken is always returned, never dropped).
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._cancelled = False
        self._cond: threading.Condition | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Ask the wait to end; blocks only while the tracker's lock is held by a call in progress."""
        with self._mutex:
            self._cancelled = True
            cond = self._cond
        if cond is not None:
            with cond:
                cond.notify_all()

    def _bind(self, cond: threading.Condition) -> None:
        with self._mutex:
            self._cond = cond


class Pollable(Protocol):
    """What waiting needs from a tracker."""

    def get_scheduled_messages(self, max_messages: int) -> Batch: ...

    def next_delivery_time(self) -> int | None: ...


class DueWaiter:
    """The waiting side of one tracker (its lock guards this object's state).

    :param cond: the tracker's condition variable, on its (reentrant) lock.
    :param clock: the tracker's clock; its :func:`sleeper_for` is how waiters sleep.
    :param slack_ms: how much earlier than its ``deliver_at`` an add may be tracked (the
        TimeBucket precision): an add wakes waiters if ``deliver_at - slack_ms`` is before
        what they wait for.
    """

    def __init__(self, cond: threading.Condition, clock: Clock | None, slack_ms: int = 0) -> None:
        self.cond = cond
        self._clock: Clock = clock or system_clock
        self._sleeper = sleeper_for(clock)
        self._slack = slack_ms
        #: The index time each sleeping waiter sleeps towards (math.inf: nothing tracked).
        self._targets: list[float] = []

    def added(self, deliver_at: int) -> None:
        """An index was added (call under the lock): wake the waiters it comes before."""
        if self._targets and deliver_at - self._slack < max(self._targets):
            self.cond.notify_all()

    def wake_all(self) -> None:
        """Something changed for every waiter (clear, close): call under the lock."""
        if self._targets:
            self.cond.notify_all()

    def wait_batch(self, tracker: Pollable, max_messages: object, timeout: float | None, lead_ms: int,
                   cancel: CancelToken | None = None) -> Batch:
        """A tracker's ``wait_scheduled``: check the arguments, then :meth:`wait` on its
        ``get_scheduled_messages(max_messages)`` (``max_messages`` 0 only looks, as the poll does).

        :param timeout: seconds of the tracker's clock, or None for no limit.
        """
        count = check_max(max_messages)
        limit = timeout_ms(timeout)
        if count == 0:
            return tracker.get_scheduled_messages(0)
        return self.wait(lambda: tracker.get_scheduled_messages(count), tracker.next_delivery_time, lead_ms,
                         limit, cancel)

    def wait(self, poll: Callable[[], Batch], next_time: Callable[[], int | None], lead_ms: int,
             timeout: int | None, cancel: CancelToken | None = None) -> Batch:
        """Block until ``poll()`` returns a non-empty batch, the timeout passes or ``cancel`` fires.

        :param poll: the tracker's ``get_scheduled_messages(max)`` (its errors propagate:
            ``StoreClosedError`` once the tracker closes).
        :param next_time: the earliest tracked index time, or None.
        :param lead_ms: how long before its index time an index is due (the tick, when not strict).
        :param timeout: clock milliseconds to wait at most (None: no limit).
        :return: the batch, or ``[]`` on timeout or cancellation.
        """
        with self.cond:
            if cancel is not None:
                cancel._bind(self.cond)
            deadline = None if timeout is None else self._clock() + timeout
            while True:
                if cancel is not None and cancel.cancelled:
                    return []
                batch = poll()
                if batch:
                    return batch
                if deadline is not None and self._clock() >= deadline:
                    return []
                nxt = next_time()
                when = None if nxt is None else nxt - lead_ms
                if when is not None and when <= self._clock():
                    # The tracker says due but gave nothing (it should not happen): sleep a
                    # millisecond rather than spin.
                    when = self._clock() + 1
                if deadline is not None:
                    when = deadline if when is None else min(when, deadline)
                target: float = math.inf if nxt is None else nxt
                self._targets.append(target)
                try:
                    self._sleeper.sleep_until(self.cond, when)
                finally:
                    self._targets.remove(target)
