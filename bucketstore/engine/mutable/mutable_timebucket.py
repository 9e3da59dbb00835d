"""The last mutable bucket as a TimeBucket index (``TrackerConfig.precision_bits > 0``).

Seed 000's structure — trimmed timestamp -> ledger -> roaring bitmap of entry
ids — holds a fixed-delay stream in a fraction of a byte per index where the
run-based :class:`~bucketstore.engine.mutable.mutable_bucket.MutableBucket` needs 24. The
price is precision: the tracker trims every timestamp to a multiple of
``2**precision_bits`` ms, so an index is delivered up to that much early,
never late.

Unlike the run-based bucket, whose runs sit in the shared queue, this one keeps
its indexes to itself until they fall due: every poll moves the due ones into
the queue as one sorted run, and the tracker asks it for its next timestamp.

A few indexes keep their exact, untrimmed time: those whose trimmed key would
sort at or before the delivery frontier (see ``BucketTracker._trim_time``). They
are due within one step, so they are few; a side table holds them, and they
leave (flush, freeze) with the grid rows, in index order.
"""

from __future__ import annotations

import numpy as np

from ...memory.timebucket import TimeBucketIndex
from ..queue.index_set import DelayedIndexSet
from ..queue.shared_queue import Run, sorted_run

__all__ = ["TimeBucketMutable"]

_NEVER = (1 << 64) - 1
_EMPTY = (np.zeros(0, dtype=np.uint64),) * 3
#: A side-table row's cost: a dict slot, a key tuple and three ints (CPython 3.11, estimated).
_EXACT_ROW_BYTES = 200


class TimeBucketMutable:
    """The mutable bucket over ledgers ``[start_ledger, end_ledger]``, as a TimeBucketIndex."""

    def __init__(self, precision_bits: int) -> None:
        self.start_ledger = -1
        self.end_ledger = -1
        self._index = TimeBucketIndex(precision_bits)
        self._grid_mask = (1 << precision_bits) - 1
        #: (ledger, entry) -> exact timestamp, for the rows off the precision grid.
        self._exact: dict[tuple[int, int], int] = {}

    def _widen(self, first: int, last: int) -> None:
        if self.start_ledger == -1:
            self.start_ledger = first
        self.end_ledger = max(self.end_ledger, last)

    def add(self, ts: int, ledger_id: int, entry_id: int) -> None:
        if ts & self._grid_mask:
            self._exact[(ledger_id, entry_id)] = ts
        else:
            self._index.add(ts, ledger_id, entry_id)
        if ledger_id > self.end_ledger:
            self._widen(ledger_id, ledger_id)

    def add_run(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> None:
        """Add a batch; nothing goes to the queue until it falls due (see :meth:`flush`)."""
        add, mask = self._index.add, self._grid_mask
        for t, ledger, entry in zip(ts.tolist(), ledgers.tolist(), entries.tolist()):
            if t & mask:
                self._exact[(ledger, entry)] = t
            else:
                add(t, ledger, entry)
        self._widen(int(ledgers.min()), int(ledgers.max()))

    def flush(self, cutoff: int) -> list[Run]:
        """Move the indexes due at ``cutoff`` into one sorted run for the shared queue."""
        if cutoff < 0 or self.is_empty():
            return []
        ts, ledgers, entries = self._pop_due(cutoff)
        return [Run(ts, ledgers, entries)] if len(ts) else []

    def _pop_due(self, cutoff: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Remove the rows due at ``cutoff`` (grid and exact), sorted in index order."""
        ts, ledgers, entries = self._index.pop_due_columns(cutoff) if len(self._index) else _EMPTY
        if not self._exact:
            return ts, ledgers, entries
        due = [(t, pos) for pos, t in self._exact.items() if t <= cutoff]
        if not due:
            return ts, ledgers, entries
        for _, pos in due:
            del self._exact[pos]
        run = sorted_run(np.concatenate((ts, np.array([t for t, _ in due], dtype=np.uint64))),
                         np.concatenate((ledgers, np.array([p[0] for _, p in due], dtype=np.uint64))),
                         np.concatenate((entries, np.array([p[1] for _, p in due], dtype=np.uint64))))
        return run.ts, run.ledgers, run.entries

    def flush_buffer(self) -> None:
        """No append buffer here (see :meth:`MutableBucket.flush_buffer`)."""
        return None

    def next_timestamp(self) -> int | None:
        grid = self._index.next_timestamp()
        if not self._exact:
            return grid
        exact = min(self._exact.values())
        return exact if grid is None else min(grid, exact)

    def discard(self, ledger_id: int, entry_id: int) -> None:
        """Forget a position untracked by an expired re-add (keeps next_timestamp exact)."""
        self._index.remove(ledger_id, entry_id)
        self._exact.pop((ledger_id, entry_id), None)

    def drop_through(self, ledger_id: int, entry_id: int) -> None:
        """Forget every position at or before ``(ledger_id, entry_id)`` (acknowledged)."""
        self._index.remove_through(ledger_id, entry_id)
        if self._exact:
            self._exact = {pos: t for pos, t in self._exact.items() if pos > (ledger_id, entry_id)}

    def is_empty(self) -> bool:
        return not len(self._index) and not self._exact

    def pending_count(self, cutoff: int) -> int:
        return len(self._index) + len(self._exact)

    def rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every index held (not yet in the queue), without removing any."""
        ts, ledgers, entries = self._index.columns()
        if not self._exact:
            return ts, ledgers, entries
        exact = self._exact
        return (np.concatenate((ts, np.array(list(exact.values()), dtype=np.uint64))),
                np.concatenate((ledgers, np.array([p[0] for p in exact], dtype=np.uint64))),
                np.concatenate((entries, np.array([p[1] for p in exact], dtype=np.uint64))))

    def freeze(self, index: DelayedIndexSet) -> list[Run]:
        """Empty the bucket for a seal: its live rows as one sorted run, which the tracker
        pushes into the shared queue (deliverable while the seal writes them)."""
        ts, ledgers, entries = self._pop_due(_NEVER)
        self.start_ledger = self.end_ledger = -1
        keep = index.present_mask(ledgers, entries, ts)
        return [Run(ts[keep], ledgers[keep], entries[keep])] if keep.any() else []

    def memory_bytes(self) -> int:
        return self._index.memory_bytes() + _EXACT_ROW_BYTES * len(self._exact)

    def clear(self) -> None:
        self._index.clear()
        self._exact.clear()
        self.start_ledger = self.end_ledger = -1
