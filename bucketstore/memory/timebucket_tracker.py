"""``TimeBucketTracker``: an in-memory delayed-delivery tracker on a TimeBucketIndex.

It answers the tracker API of the bucket tracker and of ``InMemoryTracker``
(add, due messages, membership, acknowledgement, stats) while holding the
indexes in a :class:`~bucketstore.memory.timebucket.TimeBucketIndex` instead of a
heap of triples: a fraction of a byte to a few bytes per index rather than
about 180. Nothing is on disk. With ``precision_bits > 0`` messages may be
delivered up to ``2**precision_bits - 1`` ms before their time, never after;
with ``deliver_at_time_strict`` a bucket is delivered only once its last
millisecond is due: never early, up to ``2**precision_bits - 1`` ms late.
"""

from __future__ import annotations

import threading
from typing import Any

from ..config import TrackerConfig, config_or_default
from ..cutoff import Clock, Cutoff, as_columns, check_max, check_position, check_timestamp
from ..waiting import CancelToken, DueWaiter
from .timebucket import TimeBucketIndex
from .volatile_base import VolatileTracker

__all__ = ["TimeBucketTracker"]


class TimeBucketTracker(VolatileTracker):
    """A thread-safe delayed-delivery tracker whose indexes live in a ``TimeBucketIndex``.

    **Cutoff.** Each call that looks at due messages computes
    ``now + tick_time_ms`` (``now`` when ``deliver_at_time_strict``) and keeps
    the maximum ever seen, so the cutoff never moves backwards when the clock
    does. An index is due when its bucket starts at or before the cutoff.

    **Adding.** :meth:`add_message` refuses (returns ``False``) an index that
    is already due: ``deliver_at <= cutoff``. The caller then dispatches the
    message itself, so if that position was tracked it is untracked, lest it
    be delivered twice. Adding a tracked position with a later time returns
    ``True`` and keeps the first time.

    :param config: a :class:`~bucketstore.TrackerConfig`; it reads ``tick_time_ms``,
        ``deliver_at_time_strict`` and ``precision_bits`` (default: ``TrackerConfig()``).
    :param clock: a callable returning epoch milliseconds; defaults to the system clock.
    """

    def __init__(self, config: TrackerConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config = config_or_default(config)
        self._cutoff = Cutoff(config, clock)
        self._cutoff.advance()  # the cutoff starts when the tracker is created, as for every tracker
        self._index = TimeBucketIndex(config.precision_bits)
        self._mark_delete: tuple[int, int] | None = None
        self._lock = threading.RLock()  # reentrant: wait_scheduled polls while holding it
        self._due = DueWaiter(threading.Condition(self._lock), clock, slack_ms=(1 << config.precision_bits) - 1)
        self._closed = False

    # -- internals (call with the lock held) -----------------------------------------------------
    def _advance(self) -> int:
        cutoff = self._cutoff.advance()
        if self.config.deliver_at_time_strict and self.config.precision_bits:
            # Strict: a time bucket is due when all of it is, so nothing in it comes early.
            cutoff -= (1 << self.config.precision_bits) - 1
        return cutoff

    @property
    def _lead_ms(self) -> int:
        """How long before its bucket start an index falls due (see :meth:`_advance`)."""
        lead = self._cutoff.lead_ms
        if self.config.deliver_at_time_strict and self.config.precision_bits:
            lead -= (1 << self.config.precision_bits) - 1
        return lead

    # -- the tracker API -------------------------------------------------------------------------
    def add_message(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Track the index ``(deliver_at, ledger_id, entry_id)``.

        Runtime complexity: amortised O(1); O(t) when an already-due index
        untracks its position (see ``TimeBucketIndex.remove``).

        :return: ``False`` if it is already due (``deliver_at <= cutoff``) or
            ``deliver_at`` is negative; ``True`` if it is now tracked
            (including when it already was).
        :raises TypeError, ValueError: for positions that are not unsigned 64-bit ints.
        """
        check_position(ledger_id, entry_id)  # the same rules, and words, as every tracker's
        check_timestamp(deliver_at)
        with self._lock:
            self._check_open()
            cutoff = self._cutoff.advance()  # every add reads the clock, acknowledged or not
            if self._acknowledged(ledger_id, entry_id):
                return False  # acknowledged already: nothing to track
            if deliver_at < 0 or deliver_at <= cutoff:
                self._index.remove(ledger_id, entry_id)
                return False
            self._index.add(deliver_at, ledger_id, entry_id)
            self._due.added(deliver_at)
            return True

    def add_messages(self, indexes: Any) -> int:
        """Track a batch of ``(ledger_id, entry_id, deliver_at)``; return how many are tracked.

        Same outcome as calling :meth:`add_message` row by row.
        """
        ledgers, entries, deliver_at = as_columns(indexes)
        return sum(self.add_message(l, e, t)
                   for l, e, t in zip(ledgers.tolist(), entries.tolist(), deliver_at.tolist()))

    def get_scheduled_messages(self, max_messages: int) -> list[tuple[int, int]]:
        """Remove and return up to ``max_messages`` due positions, sorted by ``(ledger, entry)``.

        The earliest due indexes (in index order) are taken first.
        Runtime complexity: O(m log(m)) for ``m`` positions returned.
        """
        max_messages = check_max(max_messages)
        with self._lock:
            self._check_open()
            cutoff = self._advance()
            due = self._index.pop_due(max(cutoff, 0), max_messages)
        due.sort()
        return due

    def wait_scheduled(self, max_messages: int, timeout: float | None = None, *,
                       cancel: CancelToken | None = None) -> list[tuple[int, int]]:
        """Block until positions are due, then return them (see
        :meth:`bucketstore.BucketTracker.wait_scheduled`: woken early by an earlier add,
        ``clear`` and ``close``; ``timeout`` in seconds of the tracker's clock; ``[]`` on
        timeout or cancellation; ``StoreClosedError`` once closed)."""
        return self._due.wait_batch(self, max_messages, timeout, self._lead_ms, cancel)

    def has_message_available(self) -> bool:
        """Whether :meth:`get_scheduled_messages` would return something now. O(1)."""
        with self._lock:
            self._check_open()
            cutoff = self._advance()  # read the clock on every call, as every tracker does
            start = self._index.next_timestamp()
            return start is not None and start <= cutoff

    def next_delivery_time(self) -> int | None:
        """When the earliest tracked index becomes deliverable, or ``None`` if none is tracked.

        This is the start of its time bucket, at most ``2**precision_bits - 1``
        ms before its ``deliver_at`` (equal to it when ``precision_bits`` is 0).
        """
        with self._lock:
            self._check_open()
            return self._index.next_timestamp()

    def last_delivery_time(self) -> int | None:
        """When the latest tracked index becomes deliverable, or ``None`` if none is tracked.

        Exact and O(1): the start of the latest time bucket, as :meth:`next_delivery_time`
        is of the earliest (at most ``2**precision_bits - 1`` ms before that index's
        ``deliver_at``)."""
        with self._lock:
            self._check_open()
            return self._index.last_timestamp()

    def contains_message(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the position is tracked (not yet delivered or acknowledged). O(1)."""
        with self._lock:
            return self._index.contains(ledger_id, entry_id)

    @property
    def number_of_delayed_messages(self) -> int:
        """How many indexes are tracked. O(1)."""
        return len(self._index)

    def mark_delete(self, ledger_id: int, entry_id: int) -> None:
        """Acknowledge up to ``(ledger_id, entry_id)``: untrack every position at or before it."""
        with self._lock:
            self._check_open()
            if not self._move_mark_delete(ledger_id, entry_id):
                return  # acknowledgement never moves back
            self._index.remove_through(ledger_id, entry_id)

    def clear(self) -> None:
        """Untrack everything."""
        with self._lock:
            self._index.clear()
            self._due.wake_all()

    def stats(self) -> dict[str, Any]:
        """Counters in the shape of the bucket tracker's (no buckets, nothing on disk)."""
        with self._lock:
            count = len(self._index)
            return {
                "immutable_buckets": 0,
                "number_of_delayed_messages": count,
                "loaded_indexes": count,
                "snapshot_size_bytes": 0,
                "memory_bytes": self._index.memory_bytes(),
                "time_buckets": self._index.bucket_count,
                "precision_bits": self._index.precision_bits,
                **{op: {"succeeded": 0, "failed": 0, "total": 0, "latency_ms": 0.0}
                   for op in ("create", "load", "merge", "delete")},
            }

    def close(self) -> None:
        """Release the indexes; later calls raise ``StoreClosedError``. Idempotent."""
        with self._lock:
            self._closed = True
            self._index.clear()
            self._due.wake_all()

