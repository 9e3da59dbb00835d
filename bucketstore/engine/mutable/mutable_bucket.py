"""The last mutable bucket: where new indexes of the newest ledgers collect until sealed.

Indexes are appended to a cheap buffer and turned into sorted runs whenever the
tracker needs to look at the queue; those runs sit in the shared queue like any
other, so a mutable index that falls due is delivered without first being
"moved" (Pulsar copies due entries from the mutable heap into the shared heap
on every poll). Sealing freezes the runs: they stay in the queue while the
seal writes them (see ``seal_pipeline``), and the bucket starts empty.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..queue.index_set import DelayedIndexSet
from ..queue.shared_queue import Run, RunBuffer, sorted_run

__all__ = ["MutableBucket", "PendingCounter"]

_MAX_RUNS = 16


class PendingCounter:
    """How many rows added since the last reset are not yet due: the seal gate, kept
    as a running count so a ledger roll costs O(log n), not a scan of every row.

    Rows only ever leave the count by falling due (the cutoff never moves back;
    deliveries and untracks take only due rows or leave the row in place, as the
    scan did), so each row is counted in once and out at most once. Single rows
    sit in a min-heap of timestamps; a sorted batch is one heap entry, a cursor
    into its timestamps that advances with one ``searchsorted`` per step.
    """

    __slots__ = ("count", "_singles", "_batches", "_seq")

    def __init__(self) -> None:
        self.count = 0
        self._singles: list[int] = []
        self._batches: list[tuple[int, int, int, np.ndarray]] = []  # (head ts, seq, pos, sorted ts)
        self._seq = 0

    def add_one(self, ts: int) -> None:
        heapq.heappush(self._singles, ts)
        self.count += 1

    def add_sorted(self, ts: np.ndarray) -> None:
        """Count a batch whose timestamps are sorted ascending (the array is kept, not copied)."""
        if len(ts):
            self._seq += 1
            heapq.heappush(self._batches, (int(ts[0]), self._seq, 0, ts))
            self.count += len(ts)

    def pending(self, cutoff: int) -> int:
        """Rows with a timestamp after ``cutoff`` (amortised O(log n) per row ever added)."""
        if cutoff < 0:
            return self.count
        singles = self._singles
        while singles and singles[0] <= cutoff:
            heapq.heappop(singles)
            self.count -= 1
        batches = self._batches
        while batches and batches[0][0] <= cutoff:
            _, seq, pos, ts = heapq.heappop(batches)
            nxt = int(np.searchsorted(ts, np.uint64(cutoff), side="right"))
            self.count -= nxt - pos
            if nxt < len(ts):
                heapq.heappush(batches, (int(ts[nxt]), seq, nxt, ts))
        return self.count

    def reset(self) -> None:
        self.count = 0
        self._singles = []
        self._batches = []


class MutableBucket:
    """The mutable bucket over ledgers ``[start_ledger, end_ledger]`` (both -1 when empty)."""

    def __init__(self) -> None:
        self.start_ledger = -1
        self.end_ledger = -1
        self._buffer = RunBuffer()
        self._runs: list[Run] = []
        self._pending = PendingCounter()

    def _widen(self, first: int, last: int) -> None:
        if self.start_ledger == -1:
            self.start_ledger = first
        self.end_ledger = max(self.end_ledger, last)

    def add(self, ts: int, ledger_id: int, entry_id: int) -> None:
        buf = self._buffer
        buf.ts.append(ts)
        buf.ledgers.append(ledger_id)
        buf.entries.append(entry_id)
        self._pending.add_one(ts)
        if ledger_id > self.end_ledger:
            self._widen(ledger_id, ledger_id)

    def add_run(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> Run:
        """Add a batch as one sorted run; the caller pushes it into the shared queue."""
        run = sorted_run(ts, ledgers, entries)
        self._runs.append(run)
        self._pending.add_sorted(run.ts)
        self._widen(int(ledgers.min()), int(ledgers.max()))
        return run

    def flush(self, cutoff: int = -1) -> list[Run]:
        """Turn buffered adds into a run; compact when runs pile up. Returns runs to push.

        (The cutoff matters only to the TimeBucket variant, which holds back what is not due.)
        """
        out = []
        run = self._buffer.flush()
        if run is not None:
            self._runs.append(run)
            out.append(run)
        self._runs = [r for r in self._runs if r.remaining and not r.dead]
        if len(self._runs) > _MAX_RUNS:
            # Many small runs cost heap work on every poll: merge them into one.
            merged = self._merge_runs()
            if merged is not None:
                out = [merged]
        return out

    def flush_buffer(self) -> Run | None:
        """Turn buffered adds into a run (to push), without compacting the runs: a seal is
        about to freeze them, and compacting a big bucket here would sort it under the lock."""
        run = self._buffer.flush()
        if run is not None:
            self._runs.append(run)
        return run

    def _merge_runs(self) -> Run | None:
        parts = [r.rest() for r in self._runs]
        for r in self._runs:
            r.kill()
        self._runs = []
        if not parts:
            return None
        if len(parts) == 1:
            merged = Run(*parts[0])  # a run's rest is sorted already
        else:
            merged = sorted_run(*(np.concatenate(cols) for cols in zip(*parts)))
        self._runs = [merged]
        return merged

    def next_timestamp(self) -> int | None:
        return None  # every index is in the shared queue already

    def discard(self, ledger_id: int, entry_id: int) -> None:
        """Nothing to do: a run row of an untracked position is skipped when met."""

    def drop_through(self, ledger_id: int, entry_id: int) -> None:
        """Nothing to do: run rows of acknowledged positions are skipped when met."""

    def rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows held outside the shared queue: none (the runs are in it)."""
        empty = np.zeros(0, dtype=np.uint64)
        return empty, empty, empty

    def memory_bytes(self) -> int:
        return 24 * (len(self._buffer) + sum(r.remaining for r in self._runs if not r.dead))

    def is_empty(self) -> bool:
        return not len(self._buffer) and not any(r.remaining for r in self._runs if not r.dead)

    def pending_count(self, cutoff: int) -> int:
        """Rows not yet due: Pulsar's ``size()`` of the mutable bucket, which gates a seal."""
        return self._pending.pending(cutoff)

    def freeze(self, index: DelayedIndexSet) -> list[Run]:
        """Hand every run to a seal and start empty. The runs stay in the shared queue
        (deliverable) until the seal installs its bucket; the buffer must be flushed
        into the queue first (the tracker's ``_sync_queue``)."""
        assert not len(self._buffer), "flush the buffer into the queue before freezing"
        runs = [r for r in self._runs if r.remaining and not r.dead]
        self._runs = []
        self._pending.reset()
        self.start_ledger = self.end_ledger = -1
        return runs

    def clear(self) -> None:
        for r in self._runs:
            r.kill()
        self._runs = []
        self._buffer = RunBuffer()
        self._pending.reset()
        self.start_ledger = self.end_ledger = -1
