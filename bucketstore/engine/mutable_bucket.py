"""The last mutable bucket: where new indexes of the newest ledgers collect until sealed.

Indexes are appended to a cheap buffer and turned into sorted runs whenever the
tracker needs to look at the queue; those runs sit in the shared queue like any
other, so a mutable index that falls due is delivered without first being
"moved" (Pulsar copies due entries from the mutable heap into the shared heap
on every poll). Sealing takes every still-tracked row out of the runs, leaves
the already-due ones in the queue (they belong to no snapshot, as in Pulsar)
and hands the rest to the seal.
"""

from __future__ import annotations

import numpy as np

from .index_set import DelayedIndexSet
from .shared_queue import Run, RunBuffer, sorted_run
from ..format.snapshot import drop_repeats

__all__ = ["MutableBucket"]

_MAX_RUNS = 16


class MutableBucket:
    """The mutable bucket over ledgers ``[start_ledger, end_ledger]`` (both -1 when empty)."""

    def __init__(self) -> None:
        self.start_ledger = -1
        self.end_ledger = -1
        self._buffer = RunBuffer()
        self._runs: list[Run] = []

    def _widen(self, first: int, last: int) -> None:
        if self.start_ledger == -1:
            self.start_ledger = first
        self.end_ledger = max(self.end_ledger, last)

    def add(self, ts: int, ledger_id: int, entry_id: int) -> None:
        buf = self._buffer
        buf.ts.append(ts)
        buf.ledgers.append(ledger_id)
        buf.entries.append(entry_id)
        if ledger_id > self.end_ledger:
            self._widen(ledger_id, ledger_id)

    def add_run(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> Run:
        """Add a batch as one sorted run; the caller pushes it into the shared queue."""
        run = sorted_run(ts, ledgers, entries)
        self._runs.append(run)
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
        buffered = sum(1 for t in self._buffer.ts if t > cutoff)
        return buffered + sum(r.remaining - r.due_count(cutoff) for r in self._runs if not r.dead)

    def take_for_seal(self, cutoff: int, index: DelayedIndexSet
                      ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], Run | None]:
        """Empty the bucket for a seal.

        Returns the still-tracked rows that are not yet due, sorted (for the
        snapshot), and a run of the still-tracked rows that are due (they stay in
        the shared queue). The bucket's runs are marked dead and its range reset.
        """
        run = self._buffer.flush()
        if run is not None:
            self._runs.append(run)
        self._runs = [r for r in self._runs if r.remaining and not r.dead]
        merged = self._merge_runs()  # one sort of everything (flush() might sort twice)
        self.start_ledger = self.end_ledger = -1
        empty = np.zeros(0, dtype=np.uint64)
        if merged is None:
            return (empty, empty, empty), None
        ts, ledgers, entries = merged.rest()
        merged.kill()  # its rows go to the snapshot and the due run below
        self._runs = []
        keep = index.present_mask(ledgers, entries, ts)
        # A position re-added with the time of one of its stale rows leaves two equal rows.
        if not keep.all():  # usually all are: skip three gathers
            ts, ledgers, entries = ts[keep], ledgers[keep], entries[keep]
        ts, ledgers, entries = drop_repeats(ts, ledgers, entries)
        due = int(np.searchsorted(ts, np.uint64(cutoff), side="right"))
        if not due:
            return (ts, ledgers, entries), None
        due_run = Run(ts[:due].copy(), ledgers[:due].copy(), entries[:due].copy()) if due else None
        return (ts[due:].copy(), ledgers[due:].copy(), entries[due:].copy()), due_run

    def clear(self) -> None:
        for r in self._runs:
            r.kill()
        self._runs = []
        self._buffer = RunBuffer()
        self.start_ledger = self.end_ledger = -1
