"""``TimeBucketIndex``: a compact delayed index, time-bucketed with roaring bitmaps.

The TimeBucket algorithm (seed 000, Pulsar PR 23611) stores a delayed index
``(timestamp, ledger_id, entry_id)`` not as a triple but as one bit::

    trimmed timestamp (ts >> precision_bits)  ->  ledger id  ->  roaring bitmap of entry ids

Messages published together share a bucket and a ledger, so the timestamp and
the ledger id are stored once per bucket, and the entry ids are consecutive,
which roaring stores in 2 bytes each (array container), one bit each (bitset
container) or a few bytes per run (run container). Trimming the low
``precision_bits`` of the timestamp makes buckets wider: fewer, denser
bitmaps, at the price of delivering up to ``2**precision_bits - 1`` ms early.

Two choices go beyond the seed:

* **Incremental run optimization.** Each bitmap is ``run_optimize()``-d every
  :data:`OPTIMIZE_EVERY` additions. Consecutive entry ids then live in a run
  container that later additions extend in place, so a bucket of consecutive
  entries costs a few bytes instead of 2 bytes per entry. For random entry ids
  ``run_optimize`` keeps the array/bitset containers, at an amortised O(1)
  cost per addition.
* **A compact reverse lookup.** ``add`` must know whether a position is already
  present in *any* bucket, and ``remove`` must find its bucket. Per ledger the
  index keeps a bitmap of the entries present (answering membership in O(1))
  and a ``BitMap64`` of the trimmed timestamps of the buckets holding that
  ledger (so ``remove`` probes only those buckets). Both are roaring bitmaps,
  run-optimized like the others: for the seed's workloads they cost a few
  hundred bytes per ledger, not bytes per message.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Union

import numpy as np

from pyroaring import BitMap, BitMap64
from sortedcontainers import SortedDict

__all__ = ["TimeBucketIndex", "OPTIMIZE_EVERY", "check_uint64"]

EntryBitmap = Union[BitMap, BitMap64]

#: A bitmap is run-optimized each time its cardinality reaches a multiple of this.
#: 1024 keeps the cost below a microsecond per addition while bounding the
#: un-optimized tail of a run-friendly bitmap to 2 KiB.
OPTIMIZE_EVERY = 1024
_OPTIMIZE_MASK = OPTIMIZE_EVERY - 1

_U32_LIMIT = 1 << 32
_U64_LIMIT = 1 << 64

# Estimated resident bytes of Python-side objects, measured here as RSS deltas
# of 200,000 objects (pyroaring 1.2, CPython 3.11): a BitMap holding one value,
# a BitMap64 holding one value, a one-item dict and a SortedDict key (its int,
# its slot in the key list and in the dict). CRoaring keeps ~16 bytes of
# bookkeeping per container on top of the container payload.
_BITMAP_OVERHEAD = 200
_BITMAP64_OVERHEAD = 440
_DICT_OVERHEAD = 230
_KEY_OVERHEAD = 100
_CONTAINER_OVERHEAD = 16


def check_uint64(name: str, value: object) -> int:
    """Return ``value`` if it is an unsigned 64-bit ``int``.

    :raises TypeError: if ``value`` is not an ``int`` (``bool`` is refused).
    :raises ValueError: if it is negative or does not fit in 64 bits.
    """
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        value = int(value)
    if value < 0 or value >= _U64_LIMIT:
        raise ValueError(f"{name} must be an unsigned 64-bit int, got {value}")
    return value


def _new_bitmap(value: int) -> EntryBitmap:
    # 32-bit bitmaps are smaller and are the format Pulsar persists; a 64-bit
    # one is used only once a value needs it.
    return BitMap() if value < _U32_LIMIT else BitMap64()


def _subtract(target: EntryBitmap, values: EntryBitmap) -> None:
    # pyroaring refuses set operations between BitMap and BitMap64.
    if type(target) is not type(values):
        values = BitMap64(values)
    target.difference_update(values)


def _has(bitmap: EntryBitmap, value: int) -> bool:
    # A 32-bit bitmap raises OverflowError on a wider value instead of answering False.
    return (value < _U32_LIMIT or type(bitmap) is BitMap64) and value in bitmap


def _optimize(bitmap: EntryBitmap | BitMap64) -> None:
    bitmap.run_optimize()
    bitmap.shrink_to_fit()


def _bitmap_bytes(bitmap: EntryBitmap | BitMap64) -> int:
    stats = bitmap.get_statistics()
    overhead = _BITMAP64_OVERHEAD if isinstance(bitmap, BitMap64) else _BITMAP_OVERHEAD
    return (overhead + _CONTAINER_OVERHEAD * stats["n_containers"]
            + stats["n_bytes_array_containers"] + stats["n_bytes_run_containers"]
            + stats["n_bytes_bitset_containers"])


class _Ledger:
    """Reverse lookup for one ledger: the entries present and the buckets holding them."""

    __slots__ = ("present", "times")

    def __init__(self, entry_id: int) -> None:
        self.present: EntryBitmap = _new_bitmap(entry_id)
        self.times = BitMap64()


class TimeBucketIndex:
    """A set of delayed indexes ``(timestamp, ledger_id, entry_id)``, bucketed by time.

    Every position ``(ledger_id, entry_id)`` is held at most once. Indexes are
    kept in buckets of ``2**precision_bits`` ms: bucket ``k`` holds timestamps
    ``k << precision_bits .. ((k + 1) << precision_bits) - 1``.

    **Due rule.** :meth:`pop_due` releases bucket ``k`` when
    ``k << precision_bits <= cutoff``, that is when its *earliest* possible
    timestamp is due. So an index is never late (an index with
    ``timestamp <= cutoff`` is always released) and at most
    ``2**precision_bits - 1`` ms early (the last millisecond of a bucket is
    released with its first). ``precision_bits=0`` is exact.

    Entry ids below ``2**32`` live in ``BitMap``; a bitmap that receives a
    larger id becomes a ``BitMap64``. Ledger ids, entry ids and timestamps are
    unsigned 64-bit ints.

    Not thread-safe: wrap it in a lock (as
    :class:`~bucketstore.memory.timebucket_tracker.TimeBucketTracker` does).

    >>> index = TimeBucketIndex(precision_bits=10)
    >>> index.add(5000, ledger_id=7, entry_id=0)
    True
    >>> index.add(5100, 7, 1), len(index), index.next_timestamp()
    (True, 2, 4096)
    >>> index.pop_due(4096)
    [(7, 0), (7, 1)]

    :param precision_bits: low timestamp bits to trim, 0..63.
    """

    def __init__(self, precision_bits: int = 0) -> None:
        if isinstance(precision_bits, bool) or not isinstance(precision_bits, int):
            raise TypeError("precision_bits must be an int")
        if not 0 <= precision_bits <= 63:
            raise ValueError(f"precision_bits must be in 0..63, got {precision_bits}")
        self._bits = precision_bits
        self._buckets: SortedDict = SortedDict()  # trimmed ts -> {ledger id -> bitmap of entries}
        self._ledgers: dict[int, _Ledger] = {}
        # Kept as a counter: summing the bitmaps on every call made Pulsar revert
        # its first version of this structure (apache/pulsar#24429).
        self._count = 0

    @property
    def precision_bits(self) -> int:
        """The number of low timestamp bits trimmed; buckets are ``2**precision_bits`` ms wide."""
        return self._bits

    @property
    def bucket_count(self) -> int:
        """The number of non-empty time buckets."""
        return len(self._buckets)

    def __len__(self) -> int:
        """The number of indexes held. Runtime complexity: O(1)."""
        return self._count

    def add(self, timestamp: int, ledger_id: int, entry_id: int) -> bool:
        """Add the index ``(timestamp, ledger_id, entry_id)``.

        A position is held once: if ``(ledger_id, entry_id)`` is already
        present (at any timestamp) nothing changes and ``False`` is returned.

        Runtime complexity: amortised O(1) for an existing bucket, O(log(b))
        to create one among ``b`` buckets.

        :return: ``True`` if the index was added, ``False`` if already present.
        :raises TypeError, ValueError: if an argument is not an unsigned 64-bit int.
        """
        timestamp = check_uint64("timestamp", timestamp)
        ledger_id = check_uint64("ledger_id", ledger_id)
        entry_id = check_uint64("entry_id", entry_id)
        wide = entry_id >= _U32_LIMIT
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._ledgers[ledger_id] = _Ledger(entry_id)
        elif _has(ledger.present, entry_id):
            return False
        elif wide and type(ledger.present) is BitMap:
            ledger.present = BitMap64(ledger.present)
        key = timestamp >> self._bits
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = {}
        bitmap = bucket.get(ledger_id)
        if bitmap is None:
            bitmap = bucket[ledger_id] = _new_bitmap(entry_id)
            ledger.times.add(key)
            if not len(ledger.times) & _OPTIMIZE_MASK:
                _optimize(ledger.times)
        elif wide and type(bitmap) is BitMap:
            bitmap = bucket[ledger_id] = BitMap64(bitmap)
        bitmap.add(entry_id)
        if not len(bitmap) & _OPTIMIZE_MASK:
            _optimize(bitmap)
        present = ledger.present
        present.add(entry_id)
        if not len(present) & _OPTIMIZE_MASK:
            _optimize(present)
        self._count += 1
        return True

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether position ``(ledger_id, entry_id)`` is held. Runtime complexity: O(1)."""
        ledger_id = check_uint64("ledger_id", ledger_id)
        entry_id = check_uint64("entry_id", entry_id)
        ledger = self._ledgers.get(ledger_id)
        return ledger is not None and _has(ledger.present, entry_id)

    def remove(self, ledger_id: int, entry_id: int) -> bool:
        """Remove position ``(ledger_id, entry_id)`` whatever its timestamp.

        Runtime complexity: O(1) when absent; otherwise O(t), ``t`` being the
        number of buckets holding entries of this ledger (the bucket of the
        entry is found by probing them). ``t`` is small when a ledger's
        messages share a few delivery times, and grows with the spread of
        delays within one ledger.

        :return: ``True`` if the position was present.
        """
        ledger_id = check_uint64("ledger_id", ledger_id)
        entry_id = check_uint64("entry_id", entry_id)
        ledger = self._ledgers.get(ledger_id)
        if ledger is None or not _has(ledger.present, entry_id):
            return False
        for key in ledger.times:
            bucket = self._buckets[key]
            bitmap = bucket[ledger_id]
            if _has(bitmap, entry_id):
                bitmap.discard(entry_id)
                if not bitmap:
                    self._drop_bitmap(key, bucket, ledger_id, ledger)
                break
        ledger.present.discard(entry_id)
        if not ledger.present:
            del self._ledgers[ledger_id]
        self._count -= 1
        return True

    def remove_through(self, ledger_id: int, entry_id: int) -> int:
        """Remove every position at or before ``(ledger_id, entry_id)`` in position order.

        That is all entries of ledgers below ``ledger_id`` and entries
        ``0..entry_id`` of ``ledger_id`` (what an acknowledgement up to that
        position makes obsolete).

        Runtime complexity: O(l + t), ``l`` ledgers held and ``t`` the
        bitmaps of the ledgers affected.

        :return: the number of indexes removed.
        """
        ledger_id = check_uint64("ledger_id", ledger_id)
        entry_id = check_uint64("entry_id", entry_id)
        removed = 0
        for lid in [lid for lid in self._ledgers if lid <= ledger_id]:
            ledger = self._ledgers[lid]
            if lid < ledger_id or entry_id == _U64_LIMIT - 1:
                for key in list(ledger.times):
                    self._drop_bitmap(key, self._buckets[key], lid, ledger)
                removed += len(ledger.present)
                del self._ledgers[lid]
                continue
            # remove_range takes an exclusive end that must fit the bitmap's width.
            before = len(ledger.present)
            for key in list(ledger.times):
                bucket = self._buckets[key]
                bitmap = bucket[lid]
                bitmap.remove_range(0, min(entry_id + 1, _U32_LIMIT) if type(bitmap) is BitMap else entry_id + 1)
                if not bitmap:
                    self._drop_bitmap(key, bucket, lid, ledger)
            present = ledger.present
            present.remove_range(0, min(entry_id + 1, _U32_LIMIT) if type(present) is BitMap else entry_id + 1)
            removed += before - len(present)
            if not present:
                del self._ledgers[lid]
        self._count -= removed
        return removed

    def _drop_bitmap(self, key: int, bucket: dict[int, EntryBitmap], ledger_id: int,
                     ledger: _Ledger) -> None:
        del bucket[ledger_id]
        ledger.times.discard(key)
        if not bucket:
            del self._buckets[key]

    def next_timestamp(self) -> int | None:
        """The start of the earliest bucket (``k << precision_bits``), or ``None`` if empty.

        It is the smallest cutoff at which :meth:`pop_due` returns something,
        and it is at most the smallest timestamp held (earlier by less than
        ``2**precision_bits`` ms). Runtime complexity: O(1).
        """
        if not self._buckets:
            return None
        return self._buckets.peekitem(0)[0] << self._bits

    def last_timestamp(self) -> int | None:
        """The start of the latest bucket (``k << precision_bits``), or ``None`` if empty:
        the counterpart of :meth:`next_timestamp`, exact. Runtime complexity: O(1)."""
        if not self._buckets:
            return None
        return self._buckets.peekitem(-1)[0] << self._bits

    def pop_due(self, cutoff: int, max_items: int | None = None) -> list[tuple[int, int]]:
        """Remove and return the positions of the due indexes, at most ``max_items``.

        Bucket ``k`` is due when ``k << precision_bits <= cutoff`` (see the
        class docstring). Positions come in ``(trimmed timestamp, ledger_id,
        entry_id)`` order; when ``max_items`` stops inside a bucket, the
        remaining positions of that bucket stay for the next call.

        Runtime complexity: O(m + b·log(l)) for ``m`` positions returned from
        ``b`` buckets of ``l`` ledgers each.

        :param cutoff: a timestamp (unsigned 64-bit int).
        :param max_items: a non-negative int, or ``None`` for no limit.
        """
        cutoff = check_uint64("cutoff", cutoff)
        if max_items is not None:
            if isinstance(max_items, bool) or not isinstance(max_items, int):
                raise TypeError("max_items must be an int or None")
            if max_items < 0:
                raise ValueError(f"max_items must be >= 0, got {max_items}")
        out: list[tuple[int, int]] = []
        for _, ledger_id, taken in self._drain(cutoff, -1 if max_items is None else max_items):
            out.extend([(ledger_id, entry) for entry in taken])
        return out

    def _drain(self, cutoff: int, room: int) -> Iterator[tuple[int, int, EntryBitmap]]:
        """Remove due entries, at most ``room`` (-1: all), yielding ``(bucket key, ledger, entries)``
        in (trimmed timestamp, ledger, entry) order."""
        last_due = cutoff >> self._bits
        buckets, ledgers = self._buckets, self._ledgers
        while buckets and room:
            key, bucket = buckets.peekitem(0)
            if key > last_due:
                break
            for ledger_id in sorted(bucket):
                if not room:
                    break
                bitmap = bucket[ledger_id]
                ledger = ledgers[ledger_id]
                if room < 0 or len(bitmap) <= room:
                    taken = bitmap
                    del bucket[ledger_id]
                    ledger.times.discard(key)
                else:
                    # The smallest `room` entries form a prefix: cut it off as a range.
                    prefix = list(islice(bitmap, room))
                    bitmap.remove_range(prefix[0], prefix[-1] + 1)
                    taken = type(bitmap)(prefix)
                _subtract(ledger.present, taken)
                if not ledger.present:
                    del ledgers[ledger_id]
                self._count -= len(taken)
                if room > 0:
                    room -= len(taken)
                yield key, ledger_id, taken
            if not bucket:
                del buckets[key]

    def pop_due_columns(self, cutoff: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Remove every due index and return it as three uint64 columns (trimmed timestamp,
        ledger, entry), sorted in that order: the batch form the bucket tracker feeds its
        shared queue with. Timestamps are the buckets' starts (``key << precision_bits``)."""
        cutoff = check_uint64("cutoff", cutoff)
        return self._to_columns(list(self._drain(cutoff, -1)))

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every index as three uint64 columns (trimmed timestamp, ledger, entry), sorted,
        without removing anything (a journal checkpoint reads them)."""
        return self._to_columns([(key, ledger_id, bitmap) for key, bucket in self._buckets.items()
                                 for ledger_id, bitmap in sorted(bucket.items())])

    def _to_columns(self, parts: Iterable[tuple[int, int, EntryBitmap]]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts_t, parts_l, parts_e = [], [], []
        for key, ledger_id, bitmap in parts:
            entries = (np.frombuffer(bitmap.to_array(), dtype=np.uint32).astype(np.uint64)
                       if isinstance(bitmap, BitMap) else np.array(list(bitmap), dtype=np.uint64))
            parts_e.append(entries)
            parts_l.append(np.full(len(entries), ledger_id, dtype=np.uint64))
            parts_t.append(np.full(len(entries), key << self._bits, dtype=np.uint64))
        if not parts_e:
            empty = np.zeros(0, dtype=np.uint64)
            return empty, empty, empty
        return np.concatenate(parts_t), np.concatenate(parts_l), np.concatenate(parts_e)

    def clear(self) -> None:
        """Remove every index. Runtime complexity: O(b + l)."""
        self._buckets.clear()
        self._ledgers.clear()
        self._count = 0

    def memory_bytes(self) -> int:
        """An estimate of the resident bytes this index holds.

        The sum, over every bitmap (forward and reverse), of its container
        payload bytes from ``get_statistics()`` plus a per-container and a
        per-object overhead, plus a fixed cost per bucket (its dict and its key)
        and per ledger record. The constants were measured as RSS deltas with
        pyroaring 1.2 on CPython 3.11; the estimate does not see allocator
        fragmentation. Runtime complexity: O(number of bitmaps).
        """
        total = 0
        for bucket in self._buckets.values():
            total += _DICT_OVERHEAD + _KEY_OVERHEAD + 8 * len(bucket)
            for bitmap in bucket.values():
                total += _bitmap_bytes(bitmap)
        for ledger in self._ledgers.values():
            total += _KEY_OVERHEAD + _bitmap_bytes(ledger.present) + _bitmap_bytes(ledger.times)
        return total

    def _check(self) -> None:
        """Assert every structural invariant (for tests; O(size))."""
        count = 0
        seen: dict[int, BitMap64] = {}
        times: dict[int, BitMap64] = {}
        for key, bucket in self._buckets.items():
            assert bucket, f"empty bucket {key}"
            for ledger_id, bitmap in bucket.items():
                assert bitmap, f"empty bitmap in bucket {key}, ledger {ledger_id}"
                assert type(bitmap) in (BitMap, BitMap64)
                ledger = self._ledgers[ledger_id]
                if type(bitmap) is BitMap64:
                    assert type(ledger.present) is BitMap64, "wide bitmap under a narrow present set"
                union = seen.setdefault(ledger_id, BitMap64())
                wide = BitMap64(bitmap)
                assert union.isdisjoint(wide), f"ledger {ledger_id} has an entry in two buckets"
                union |= wide
                times.setdefault(ledger_id, BitMap64()).add(key)
                count += len(bitmap)
        assert count == self._count, f"counter {self._count} != {count} indexes held"
        assert seen.keys() == self._ledgers.keys(), "ledger records disagree with the buckets"
        for ledger_id, ledger in self._ledgers.items():
            assert BitMap64(ledger.present) == seen[ledger_id], f"present set of ledger {ledger_id} is stale"
            assert ledger.times == times[ledger_id], f"bucket list of ledger {ledger_id} is stale"
