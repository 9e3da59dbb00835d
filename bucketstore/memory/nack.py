"""``NackTracker``: negative-acknowledgement redelivery times, time-bucketed (PIP-393).

A consumer that fails to process a message nacks it; the message must be
redelivered at a later time. PIP-393 replaced a hash map of message id ->
time (about 50-120 bytes per message) by the TimeBucket structure: redelivery
times trimmed by ``precision_bits`` (default 8, buckets of 256 ms), then the
ledger id, then a roaring bitmap of entry ids.

Keying by ``(ledger, entry)`` alone makes the messages of one batch share one
time: nacking message 1 of an entry for 10 s and then message 2 of the same
entry for 20 s redelivered both after 20 s (the interference PIP-393
describes). Here every message id ``(ledger, entry, batch_index, partition)``
has its own time. The batch index is folded into the bitmap value and the
partition selects the index::

    partition, entry_id >> 32  ->  TimeBucketIndex
        ledger id, ((batch_index + 1) << 32) | (entry_id & 0xFFFFFFFF)

so the entries of unbatched messages (``batch_index == -1``) stay dense
32-bit values, and each batch index forms its own dense 32-bit range of a
``BitMap64``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from .timebucket import TimeBucketIndex, check_uint64

__all__ = ["NackTracker", "MessageId"]

_LOW32 = (1 << 32) - 1
_INT32_MAX = (1 << 31) - 1
# A dict slot plus its key tuple, per (partition, entry_high) index.
_INDEX_OVERHEAD = 200


class MessageId(NamedTuple):
    """A message's identity: its position and, for a batch, its index; its partition.

    ``batch_index`` and ``partition`` are ``-1`` when not applicable.
    """

    ledger_id: int
    entry_id: int
    batch_index: int = -1
    partition: int = -1


def _check_small(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not -1 <= value <= _INT32_MAX:
        raise ValueError(f"{name} must be in -1..{_INT32_MAX}, got {value}")
    return value


def _system_clock() -> int:
    return int(time.time() * 1000)


class NackTracker:
    """Redelivery times of negatively acknowledged messages, in bounded memory.

    Each message id has one redelivery time; adding it again replaces the
    time. :meth:`pop_due` returns the messages whose time bucket has started
    by now: a message comes back at most ``2**precision_bits - 1`` ms before
    its redelivery time, never after.

    Thread-safe: one lock guards the structure.

    >>> clock = lambda: 1_000
    >>> nacks = NackTracker(precision_bits=0, clock=clock)
    >>> nacks.add(5, 7, 1_000, batch_index=0)
    True
    >>> nacks.add(5, 7, 9_000, batch_index=1)
    True
    >>> nacks.pop_due()
    [MessageId(ledger_id=5, entry_id=7, batch_index=0, partition=-1)]
    >>> len(nacks)
    1

    :param precision_bits: low bits of the redelivery time to trim, 0..63.
    :param clock: a callable returning epoch milliseconds; defaults to the system clock.
    """

    def __init__(self, precision_bits: int = 8, clock: Callable[[], int] | None = None) -> None:
        TimeBucketIndex(precision_bits)  # validates precision_bits before anything is built
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a callable returning epoch milliseconds")
        self._bits = precision_bits
        self._clock = clock or _system_clock
        self._indexes: dict[tuple[int, int], TimeBucketIndex] = {}
        self._count = 0
        self._lock = threading.Lock()

    @property
    def precision_bits(self) -> int:
        """The low bits trimmed from redelivery times."""
        return self._bits

    def __len__(self) -> int:
        """How many message ids are waiting for redelivery. O(1)."""
        return self._count

    @staticmethod
    def _locate(ledger_id: int, entry_id: int, batch_index: int,
                partition: int) -> tuple[tuple[int, int], int, int]:
        ledger_id = check_uint64("ledger_id", ledger_id)
        entry_id = check_uint64("entry_id", entry_id)
        batch_index = _check_small("batch_index", batch_index)
        partition = _check_small("partition", partition)
        value = ((batch_index + 1) << 32) | (entry_id & _LOW32)
        return (partition, entry_id >> 32), ledger_id, value

    def add(self, ledger_id: int, entry_id: int, redeliver_at: int,
            batch_index: int = -1, partition: int = -1) -> bool:
        """Schedule a message for redelivery at ``redeliver_at`` (epoch ms).

        If the message id is already scheduled, its time is replaced; other
        messages of the same entry keep theirs.

        Runtime complexity: amortised O(1) for a new id; O(t) to replace one,
        ``t`` being the number of time buckets holding its ledger.

        :return: ``True`` if the id was new, ``False`` if its time was replaced.
        :raises TypeError, ValueError: for ids or times out of range.
        """
        where, ledger_id, value = self._locate(ledger_id, entry_id, batch_index, partition)
        redeliver_at = check_uint64("redeliver_at", redeliver_at)
        with self._lock:
            index = self._indexes.get(where)
            if index is None:
                index = self._indexes[where] = TimeBucketIndex(self._bits)
            replaced = index.remove(ledger_id, value)
            index.add(redeliver_at, ledger_id, value)
            if not replaced:
                self._count += 1
            return not replaced

    def remove(self, ledger_id: int, entry_id: int, batch_index: int = -1, partition: int = -1) -> bool:
        """Forget a message id (it was acknowledged). Returns whether it was scheduled."""
        where, ledger_id, value = self._locate(ledger_id, entry_id, batch_index, partition)
        with self._lock:
            index = self._indexes.get(where)
            if index is None or not index.remove(ledger_id, value):
                return False
            if not index:
                del self._indexes[where]
            self._count -= 1
            return True

    def next_redelivery_time(self) -> int | None:
        """The earliest time :meth:`pop_due` will return something, or ``None`` when empty.

        A timer set to this instant replaces PIP-393's periodic scan.
        """
        with self._lock:
            starts = [index.next_timestamp() for index in self._indexes.values()]
        return min((s for s in starts if s is not None), default=None)

    def pop_due(self, max_items: int | None = None) -> list[MessageId]:
        """Remove and return the message ids due now (by ``clock``), at most ``max_items``.

        Earlier time buckets come first; within a bucket the order is by
        partition, ledger, then entry and batch index as stored.

        Runtime complexity: O(m + b·p) for ``m`` ids from ``b`` buckets over ``p`` partitions.
        """
        if max_items is not None:
            if isinstance(max_items, bool) or not isinstance(max_items, int):
                raise TypeError("max_items must be an int or None")
            if max_items < 0:
                raise ValueError(f"max_items must be >= 0, got {max_items}")
        now = self._clock()
        out: list[MessageId] = []
        with self._lock:
            while max_items is None or len(out) < max_items:
                # The index whose earliest bucket starts first; popping with its
                # start as the cutoff takes exactly that bucket, which keeps the
                # output in bucket order across partitions.
                best = None
                for where, index in self._indexes.items():
                    start = index.next_timestamp()
                    if start is not None and start <= now and (best is None or (start, where) < best[:2]):
                        best = (start, where, index)
                if best is None:
                    break
                start, (partition, high), index = best
                room = None if max_items is None else max_items - len(out)
                for ledger_id, value in index.pop_due(start, room):
                    batch = (value >> 32) - 1
                    out.append(MessageId(ledger_id, (high << 32) | (value & _LOW32), batch, partition))
                if not index:
                    del self._indexes[(partition, high)]
            self._count -= len(out)
        return out

    def clear(self) -> None:
        """Forget every message id."""
        with self._lock:
            self._indexes.clear()
            self._count = 0

    def memory_bytes(self) -> int:
        """An estimate of the resident bytes held (see ``TimeBucketIndex.memory_bytes``)."""
        with self._lock:
            return sum(_INDEX_OVERHEAD + index.memory_bytes() for index in self._indexes.values())

    def _check(self) -> None:
        """Assert the structural invariants (for tests)."""
        total = 0
        for where, index in self._indexes.items():
            assert index, f"empty index kept for {where}"
            index._check()
            total += len(index)
        assert total == self._count, f"counter {self._count} != {total} ids held"
