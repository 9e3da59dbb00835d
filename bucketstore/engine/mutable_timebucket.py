"""The last mutable bucket as a TimeBucket index (``TrackerConfig.precision_bits > 0``).

Seed 000's structure — trimmed timestamp -> ledger -> roaring bitmap of entry
ids — holds a fixed-delay stream in a fraction of a byte per index where the
run-based :class:`~bucketstore.engine.mutable_bucket.MutableBucket` needs 24. The
price is precision: the tracker trims every timestamp to a multiple of
``2**precision_bits`` ms, so an index is delivered up to that much early,
never late.

Unlike the run-based bucket, whose runs sit in the shared queue, this one keeps
its indexes to itself until they fall due: every poll moves the due ones into
the queue as one sorted run, and the tracker asks it for its next timestamp.
"""

from __future__ import annotations

import numpy as np

from .index_set import DelayedIndexSet
from .shared_queue import Run
from ..memory.timebucket import TimeBucketIndex

__all__ = ["TimeBucketMutable"]

_NEVER = (1 << 64) - 1


class TimeBucketMutable:
    """The mutable bucket over ledgers ``[start_ledger, end_ledger]``, as a TimeBucketIndex."""

    def __init__(self, precision_bits: int) -> None:
        self.start_ledger = -1
        self.end_ledger = -1
        self._index = TimeBucketIndex(precision_bits)

    def _widen(self, first: int, last: int) -> None:
        if self.start_ledger == -1:
            self.start_ledger = first
        self.end_ledger = max(self.end_ledger, last)

    def add(self, ts: int, ledger_id: int, entry_id: int) -> None:
        self._index.add(ts, ledger_id, entry_id)
        if ledger_id > self.end_ledger:
            self._widen(ledger_id, ledger_id)

    def add_run(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> None:
        """Add a batch; nothing goes to the queue until it falls due (see :meth:`flush`)."""
        add = self._index.add
        for t, ledger, entry in zip(ts.tolist(), ledgers.tolist(), entries.tolist()):
            add(t, ledger, entry)
        self._widen(int(ledgers.min()), int(ledgers.max()))

    def flush(self, cutoff: int) -> list[Run]:
        """Move the indexes due at ``cutoff`` into one sorted run for the shared queue."""
        if cutoff < 0 or not len(self._index):
            return []
        ts, ledgers, entries = self._index.pop_due_columns(cutoff)
        return [Run(ts, ledgers, entries)] if len(ts) else []

    def next_timestamp(self) -> int | None:
        return self._index.next_timestamp()

    def discard(self, ledger_id: int, entry_id: int) -> None:
        """Forget a position untracked by an expired re-add (keeps next_timestamp exact)."""
        self._index.remove(ledger_id, entry_id)

    def drop_through(self, ledger_id: int, entry_id: int) -> None:
        """Forget every position at or before ``(ledger_id, entry_id)`` (acknowledged)."""
        self._index.remove_through(ledger_id, entry_id)

    def is_empty(self) -> bool:
        return not len(self._index)

    def pending_count(self, cutoff: int) -> int:
        return len(self._index)

    def rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every index held (not yet in the queue), without removing any."""
        return self._index.columns()

    def take_for_seal(self, cutoff: int, index: DelayedIndexSet
                      ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], Run | None]:
        """Empty the bucket: not-yet-due live rows for the snapshot, due ones as a run."""
        ts, ledgers, entries = self._index.pop_due_columns(_NEVER)
        self.start_ledger = self.end_ledger = -1
        keep = index.present_mask(ledgers, entries, ts)
        ts, ledgers, entries = ts[keep], ledgers[keep], entries[keep]
        due = int(np.searchsorted(ts, np.uint64(max(cutoff, 0)), side="right")) if cutoff >= 0 else 0
        due_run = Run(ts[:due], ledgers[:due], entries[:due]) if due else None
        return (ts[due:], ledgers[due:], entries[due:]), due_run

    def memory_bytes(self) -> int:
        return self._index.memory_bytes()

    def clear(self) -> None:
        self._index.clear()
        self.start_ledger = self.end_ledger = -1
