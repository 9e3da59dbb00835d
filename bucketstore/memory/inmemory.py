"""``InMemoryTracker``: the classic delayed-delivery tracker, a heap of triples.

Pulsar's original tracker (and seed 004) keeps every delayed index as a
``(deliver_at, ledger_id, entry_id)`` triple in one priority queue. Nothing is
on disk. It is the baseline the bucket tracker is tested and benchmarked
against: same methods, same answers, no persistence.
"""

from __future__ import annotations

import heapq
import sys
import threading
from typing import Any

from ..config import TrackerConfig, config_or_default
from ..cutoff import Clock, Cutoff, as_columns, check_max, check_position, check_timestamp
from ..waiting import CancelToken, DueWaiter
from .horizon import DeliveryHorizon
from .volatile_base import VolatileTracker

__all__ = ["InMemoryTracker"]


class InMemoryTracker(VolatileTracker):
    """A delayed index held as a heap of ``(deliver_at, ledger_id, entry_id)`` tuples.

    Membership is a dict from position to its current delivery time; heap rows
    whose time no longer matches are stale and skipped when popped, so an
    expired re-add or a delivery is O(1) and the heap never needs a search.
    Thread-safe.
    """

    def __init__(self, config: TrackerConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config = config_or_default(config)
        self._cutoff = Cutoff(config, clock)
        self._cutoff.advance()  # as a store tracker does on recovery: the cutoff starts at creation
        self._heap: list[tuple[int, int, int]] = []
        self._tracked: dict[tuple[int, int], int] = {}
        self._lock = threading.RLock()
        self._due = DueWaiter(threading.Condition(self._lock), clock)
        self._closed = False
        self._mark_delete: tuple[int, int] | None = None
        self._horizon = DeliveryHorizon()

    def add_message(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Track an index; False if it is already due (dispatch it now), True otherwise."""
        check_position(ledger_id, entry_id)
        check_timestamp(deliver_at)
        with self._lock:
            self._check_open()
            cutoff = self._cutoff.advance()  # every add reads the clock, acknowledged or not
            if self._acknowledged(ledger_id, entry_id):
                return False  # acknowledged already: nothing to track
            if deliver_at <= cutoff:
                self._tracked.pop((ledger_id, entry_id), None)
                return False
            if (ledger_id, entry_id) in self._tracked:
                return True
            self._horizon.emptied(len(self._tracked))
            self._tracked[(ledger_id, entry_id)] = deliver_at
            heapq.heappush(self._heap, (deliver_at, ledger_id, entry_id))
            self._horizon.added(deliver_at)
            self._due.added(deliver_at)
            return True

    def add_messages(self, indexes: Any) -> int:
        """Track a batch (see :meth:`bucketstore.engine.tracker.tracker.BucketTracker.add_messages`)."""
        ledgers, entries, deliver_at = as_columns(indexes)
        tracked = 0
        for ledger, entry, at in zip(ledgers.tolist(), entries.tolist(), deliver_at.tolist()):
            tracked += self.add_message(ledger, entry, at)
        return tracked

    def _settle(self) -> None:
        heap, tracked = self._heap, self._tracked
        while heap and tracked.get((heap[0][1], heap[0][2])) != heap[0][0]:
            heapq.heappop(heap)

    def get_scheduled_messages(self, max_messages: int) -> list[tuple[int, int]]:
        """Pop up to ``max_messages`` due indexes in index order; return positions sorted."""
        max_messages = check_max(max_messages)
        out = []
        with self._lock:
            self._check_open()
            cutoff = self._cutoff.advance()
            heap, tracked = self._heap, self._tracked
            while len(out) < max_messages and heap:
                ts, ledger, entry = heap[0]
                if tracked.get((ledger, entry)) != ts:
                    heapq.heappop(heap)
                    continue
                if ts > cutoff:
                    break
                heapq.heappop(heap)
                del tracked[(ledger, entry)]
                out.append((ledger, entry))
        out.sort()
        return out

    def wait_scheduled(self, max_messages: int, timeout: float | None = None, *,
                       cancel: CancelToken | None = None) -> list[tuple[int, int]]:
        """Block until positions are due, then return them (see
        :meth:`bucketstore.BucketTracker.wait_scheduled`: woken early by an earlier add,
        ``clear`` and ``close``; ``timeout`` in seconds of the tracker's clock; ``[]`` on
        timeout or cancellation; ``StoreClosedError`` once closed)."""
        return self._due.wait_batch(self, max_messages, timeout, self._cutoff.lead_ms, cancel)

    def has_message_available(self) -> bool:
        with self._lock:
            self._check_open()
            cutoff = self._cutoff.advance()
            self._settle()
            return bool(self._heap) and self._heap[0][0] <= cutoff

    def next_delivery_time(self) -> int | None:
        with self._lock:
            self._check_open()
            self._settle()
            return self._heap[0][0] if self._heap else None

    def last_delivery_time(self) -> int | None:
        """The latest delivery time among tracked indexes, or None when nothing is tracked.

        An upper bound, O(1): the latest ``deliver_at`` tracked since the tracker last
        held nothing, exact while indexes leave only by delivery (see
        :mod:`bucketstore.memory.horizon`)."""
        with self._lock:
            self._check_open()
            return self._horizon.value(len(self._tracked))

    def contains_message(self, ledger_id: int, entry_id: int) -> bool:
        check_position(ledger_id, entry_id)
        with self._lock:
            return (ledger_id, entry_id) in self._tracked

    @property
    def number_of_delayed_messages(self) -> int:
        return len(self._tracked)

    def mark_delete(self, ledger_id: int, entry_id: int) -> None:
        """Acknowledge up to ``(ledger_id, entry_id)``: drop every tracked position at or before it."""
        check_position(ledger_id, entry_id)
        with self._lock:
            self._check_open()
            if not self._move_mark_delete(ledger_id, entry_id):
                return
            for pos in [p for p in self._tracked if p <= (ledger_id, entry_id)]:
                del self._tracked[pos]

    def clear(self) -> None:
        with self._lock:
            self._heap.clear()
            self._tracked.clear()
            self._due.wake_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._heap.clear()
            self._tracked.clear()
            self._due.wake_all()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            n = len(self._heap)
            # A tuple of three ints plus a list slot, and a dict entry keyed by a 2-tuple.
            per_row = sys.getsizeof((0, 0, 0)) + 3 * 32 + 8
            return {
                "immutable_buckets": 0,
                "number_of_delayed_messages": len(self._tracked),
                "loaded_indexes": n,
                "snapshot_size_bytes": 0,
                "memory_bytes": n * per_row + len(self._tracked) * 150,
                **{op: {"succeeded": 0, "failed": 0, "total": 0, "latency_ms": 0.0}
                   for op in ("create", "load", "merge", "delete")},
            }
