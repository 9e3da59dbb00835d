"""Backpressure by memory: the store's budget for rows not yet in a sealed bucket.

A fast producer makes a backlog: rows in the trackers' mutable buckets and rows frozen
for a seal or read for a merge that the maintenance worker has not installed yet. The
budget counts those bytes (24 per row: three uint64 columns) and makes the caller that
would grow the backlog past it wait, *before* it takes its tracker's lock:

* a batch of more than :data:`SMALL_BATCH_ROWS` rows waits while the backlog plus the
  batch would exceed ``budget``;
* a single add or a small batch passes until the backlog exceeds ``ceiling`` (twice the
  budget): it costs the backlog almost nothing, and it must not wait behind a seal that
  another thread's batches made. Memory stays bounded: past the ceiling, everyone waits.

Only seals and merges in flight shrink the backlog while a caller waits (it is the caller
that fills a mutable bucket), so a caller waits only while some are in flight: a
backlog of mutable rows alone never blocks (the batch's own roll will seal them), and a
batch larger than the whole budget waits until the worker is idle, then passes.

Jobs charge their rows when they are submitted and release them when they finish
(installed, failed or cancelled). A tracker reports its mutable bucket's bytes after
each batch, at each seal and when it clears or closes (a stale figure only errs towards
waiting while jobs are in flight, never towards a wait without end).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["DEFAULT_BUDGET_BYTES", "ROW_BYTES", "SMALL_BATCH_ROWS", "BacklogBudget"]

#: Bytes of one index row in memory: timestamp, ledger and entry as uint64.
ROW_BYTES = 24
#: Batches of at most this many rows pass until the ceiling, as single adds do.
SMALL_BATCH_ROWS = 64
#: The default budget: 256 MiB of rows, about 11 M indexes (eleven 1 M-index seals, or a
#: 4 M-index merge beside several seals), small beside a broker's heap.
DEFAULT_BUDGET_BYTES = 256 << 20


class BacklogBudget:
    """One store's backlog of unsealed rows, in bytes, against a budget and a ceiling."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < ROW_BYTES:
            raise ValueError(f"max_backlog_bytes must be an int >= {ROW_BYTES}")
        self.budget = budget_bytes
        self.ceiling = 2 * budget_bytes
        self._cond = threading.Condition()
        self._jobs = 0           # bytes charged by seals and merges in flight
        self._in_flight = 0      # how many of them
        self._mutable: dict[int, int] = {}  # id(tracker) -> its mutable bucket's bytes
        self._mutable_total = 0
        self._closed = False
        #: Callers waiting right now (tests step on it; ``stats()`` shows it).
        self.waiting = 0
        #: Calls that waited, and their seconds, over the store's life.
        self.waits = 0
        self.wait_seconds = 0.0

    @property
    def used(self) -> int:
        """Bytes of the backlog: mutable buckets and seals and merges in flight."""
        return self._jobs + self._mutable_total

    # -- accounting -----------------------------------------------------------------------------
    def note_mutable(self, owner: object, nbytes: int) -> None:
        """Record a tracker's mutable bucket size (0 forgets it: cleared or closed)."""
        key = id(owner)
        with self._cond:
            old = self._mutable.pop(key, 0)
            if nbytes:
                self._mutable[key] = nbytes
            self._mutable_total += nbytes - old
            if nbytes < old:
                self._cond.notify_all()

    def charge(self, nbytes: int) -> None:
        """A seal or merge holding ``nbytes`` of rows was submitted."""
        with self._cond:
            self._jobs += nbytes
            self._in_flight += 1

    def release(self, nbytes: int) -> None:
        """A charged job finished: its rows are in a sealed bucket (or were dropped)."""
        with self._cond:
            self._jobs -= nbytes
            self._in_flight -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """The store is closing: nobody waits any more (their calls then find it closed)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- admission ------------------------------------------------------------------------------
    def _must_wait(self, rows: int) -> bool:
        if self._closed or not self._in_flight:
            return False  # nothing in flight can shrink the backlog: waiting would not end
        if rows <= SMALL_BATCH_ROWS:
            return self.used > self.ceiling
        return self.used + rows * ROW_BYTES > self.budget

    def admit(self, rows: int, help_worker: Callable[[], bool]) -> float:
        """Wait, if the caller's ``rows`` must, until the backlog has room; return the seconds
        waited (0.0 almost always, without taking a lock).

        The caller holds no tracker lock. ``help_worker`` is the maintenance worker's
        ``run_while_waiting``: a worker that runs jobs only when asked (the crash tests'
        stepped worker) runs the next step on this thread and returns True.
        """
        if not self._must_wait(rows):  # unlocked reads: a race only errs by one job's install
            return 0.0
        started = time.perf_counter()
        with self._cond:
            self.waiting += 1
        try:
            while True:
                with self._cond:
                    if not self._must_wait(rows):
                        break
                if help_worker():
                    continue
                with self._cond:
                    if self._must_wait(rows):
                        self._cond.wait()
        finally:
            waited = time.perf_counter() - started
            with self._cond:
                self.waiting -= 1
                self.waits += 1
                self.wait_seconds += waited
        return waited

    def as_dict(self) -> dict[str, object]:
        return {"budget_bytes": self.budget, "ceiling_bytes": self.ceiling, "backlog_bytes": self.used,
                "jobs_in_flight": self._in_flight, "waiting": self.waiting, "waits": self.waits, "wait_seconds": round(self.wait_seconds, 6)}
