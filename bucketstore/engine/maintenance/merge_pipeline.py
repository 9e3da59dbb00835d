"""The merge pipeline: plan under the lock, read/merge/write off it, install under it.

::

    plan (lock)       pick the window, mark its buckets ``merging``, snapshot the
                      index for their ledger range (and the delivered rows whose
                      confirmation is not durable yet: they stay in the file)
    work (no lock)    read every segment of every source, keep the rows live in
                      the snapshot, sort, encode, write + fsync the merged ledger
                      (a big merge reads, sorts and encodes pieces of its rows
                      on two threads)
    commit (no lock)  one catalog commit adds the merged key and removes the
                      sources' keys, under the tracker's commit lock only (adds,
                      deliveries and reads never take it)
    install (lock)    the sources die (their runs and slots leave the queue), the
                      merged bucket takes their place; then, the lock let go,
                      their files are unlinked

Reconciling what happened during the merge: a row delivered, trimmed or
untracked after the snapshot is in the new file, but the index (and the ghost
kept for every delivered position of a covered ledger) keeps it dead, as it did
in the source; a source deleted meanwhile (``mark_delete``, exhausted,
``clear``) cancels the merge, whose file is then removed. Nothing can be missing:
rows only ever leave a sealed bucket, and new indexes of covered ledgers go to
the queue directly, never into a bucket.

The commit is off the tracker's lock for the seal's reason (an LMDB transaction
with an fsync: 0.8 to 9 ms measured on a loaded machine, which another thread's
add waited for). Between it and the install the merged key is durable and the
sources' keys are gone while the sources still serve deliveries from memory and
their files. What must be ordered with it, by ``commit_lock``:

* a source deleted (read to its end, passed by a mark-delete) before the commit
  is dead, and the merge commits nothing (its file is removed, as before); after
  the commit, the install goes on as if the merge had installed first and the
  deletion came after it: a source read to its end needs nothing more (its rows
  are dead in the index and in the merged file, as for any delivered row; the
  deletion removed its key again, a no-op, and its file, an orphan since the
  commit), and a merged bucket the mark-delete passed wholly is deleted at the
  install (one it cuts through stays, trimmed in the index, as always); so is
  one whose every source was deleted meanwhile (read to its end, or passed):
  nothing in it is live, and only a later delivery call would read it to its
  end (a clean close before one would keep its key and file). So a
  deletion racing the commit needs no lock: either the commit saw the source
  dead, or the install treats the deletion as coming after it;
* ``clear`` removes the merged key in its own transaction (``committed_key``) and
  deletes the sources as usual; the install then removes the merged file;
* ``close`` giving up and ``delete_tracker`` keep the merged file (the key names
  it, as after a crash just after the commit); the install unlinks the sources'
  files, orphans since the commit.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from ...format.row_sort import sort_row_parts
from ...format.shared_work import piece_bounds, share
from ..buckets.sealed_bucket import SealedBucket
from ..queue.liveness import index_snapshot
from ..queue.shared_queue import Slot
from ..threads.side_thread import run_beside
from .backlog_budget import ROW_BYTES
from .bucket_job import BucketJob, JobHost

__all__ = ["MergeJob"]

_U64 = np.dtype("<u8")
#: Rows from which a merge reads and filters its sources' segments on two threads (as
#: ``format.row_sort.SPLIT_ROWS``).
SPLIT_ROWS = 2_000_000
#: Rows of the segments read at once by either thread, about (whole segments, at most 16 pieces).
PIECE_ROWS = 250_000


class MergeJob(BucketJob):
    """One merge of adjacent sealed buckets into one covering their whole range."""

    kind = "merge"

    def __init__(self, tracker: JobHost, window: list[SealedBucket]) -> None:
        super().__init__(tracker, window[0].start_ledger, window[-1].end_ledger)
        self.window = window
        for b in window:
            b.merging = True
        # The merge reads every row of its sources into memory.
        self.backlog_bytes = ROW_BYTES * sum(int(b.counts.sum()) for b in window)
        self._live = index_snapshot(tracker.live_index, self.start, self.end)
        # Rows delivered in a batch whose confirmation is not durable stay in the merged
        # file: the sources are their only durable copy, and a crash must bring them back.
        self._held = tracker.unconfirmed_rows(self.start, self.end)
        #: Whether this merge's catalog commit is done (its sources' keys gone) and not undone
        #: by ``clear`` (see the module docstring); ``committed_key`` is the merged key, if any.
        self.committed = False

    def __repr__(self) -> str:
        return f"MergeJob({self.tracker.name!r}, [{self.start}, {self.end}], {len(self.window)} buckets)"

    # -- off the lock ---------------------------------------------------------------------------
    def _work(self) -> None:
        segments = [(bucket, number) for bucket in self.window for number in range(1, bucket.segment_count + 1)]
        # A big merge reads, decodes and filters its segments a piece at a time on this thread
        # and one beside it (the reads, zstd and most of numpy's work release the GIL); the
        # parts keep their order either way.
        rows = np.cumsum([0] + [int(bucket.counts[number - 1]) for bucket, number in segments])
        if len(segments) > 1 and rows[-1] >= SPLIT_ROWS:
            firsts = piece_bounds(rows[:-1], int(rows[-1]), PIECE_ROWS)
            pieces = share([functools.partial(self._live_parts, segments[a:b]) for a, b in zip(firsts, firsts[1:])],
                           run_beside)
        else:
            pieces = [self._live_parts(segments)]
        if any(p is None for p in pieces):
            return  # cancelled, or a source deleted meanwhile: install abandons the merge
        parts = [part for piece in pieces for part in piece]  # type: ignore[union-attr]
        self._live = self._held = None  # type: ignore[assignment]
        self.ledger_id = self.tracker.store_services.allocate_ledger_id()
        if not parts:
            return  # nothing live: install only removes the sources
        # (No concatenated copy of the parts; each is sorted, a bucket's segments one run. A big
        # merge sorts ranges of timestamps on two threads.) No row repeats:
        # the sources cover disjoint ledgers and each holds a position once (build_bucket
        # refuses a repeat all the same).
        self._write(*sort_row_parts(parts, sorted_parts=True, run_beside=run_beside))

    def _live_parts(self, segments: list[tuple[SealedBucket, int]]) -> list[tuple[np.ndarray, ...]] | None:
        """The live rows of these segments of the sources, as parts (None: cancelled meanwhile)."""
        parts = []
        for bucket, group in itertools.groupby(segments, key=lambda s: s[0]):
            if self.cancelled or bucket.dead:
                return None
            # Every segment, loaded ones included: they may hold undelivered rows (Pulsar #26251).
            # A bucket's segments of this piece are read with one open of its file.
            for run in bucket.read_segments([number for _, number in group]):
                keep = self._live.present_mask(run.ledgers, run.entries, run.ts)
                if self._held:
                    keep |= self._held.mask(run.ts, run.ledgers, run.entries)
                if keep.all():  # usually: no three gathers (a 4 M-row merge's would copy 96 MB)
                    parts.append((run.ts, run.ledgers, run.entries))
                elif keep.any():
                    parts.append((run.ts[keep], run.ledgers[keep], run.entries[keep]))
        return parts

    # -- the install: its commit before the lock, the rest under it -----------------------------
    def _before_lock(self) -> None:
        if self.error is not None:
            return
        tracker = self.tracker
        with tracker.commit_lock:  # a cancel comes wholly before this or wholly after
            if self.cancelled or tracker.closed or any(b.dead for b in self.window):
                return  # the install abandons the file
            put = {self.meta.key: self.ledger_id} if self.meta is not None and self.path is not None else {}
            # One transaction: the merged key in, the sources' keys out. A crash before it
            # leaves an orphan file; after it, the sources' files are orphans.
            self._commit(put, [b.key for b in self.window])
            if self.error is None:
                self.committed = True
                self.committed_key = next(iter(put), None)

    def uncommit(self) -> None:
        self.committed = False
        super().uncommit()

    def _install(self, tracker: JobHost) -> None:
        tracker.withdraw_job(self)
        for b in self.window:
            b.merging = False
        if not self.committed:
            # A source deleted before the commit (acknowledged, exhausted, cleared): the merged
            # file would bring its rows back. Drop it; the next roll plans again. Or the commit
            # failed (or clear() removed its key): the sources stay, untouched.
            failed = self.error is not None and not (self.cancelled or tracker.closed or
                                                     any(b.dead for b in self.window))
            self._abandon("failed" if failed else "cancelled")
            return
        if self.cancelled or tracker.closed:
            # close() gave up on it, or delete_tracker(), after the commit: the merged key names
            # the file, which stays (as after a crash there); the sources' files are orphans.
            tracker.delete_source_files([b.path for b in self.window])
            tracker.finish_job(self, "cancelled")
            return
        # Every source deleted since the commit (read to its end, or passed by a mark-delete):
        # no row of the merged file is live. (Read before retiring them, which kills them too.)
        consumed = all(b.dead for b in self.window)
        tracker.retire_buckets(self.window)  # their runs and slots in the queue die with them
        merged = None
        if self.meta is not None and self.path is not None:
            merged = tracker.install_bucket(self.path, self.ledger_id, self.meta)
            tracker.enqueue(Slot(merged))
        tracker.drop_dead_runs()  # the sources' loaded segments
        self.committed_key = None  # installed
        if merged is not None and consumed:
            # Delete it now, as the delivery that emptied its last source would have, had the
            # merge installed first (journal mode first journals the delivered, unconfirmed
            # rows). Otherwise its key and file stay until a later delivery call reads past its
            # rows, all dead, and a clean close before one keeps them: a reopen would find them.
            tracker.bucket_consumed(merged)
        md = tracker.mark_delete_position
        if merged is not None and not merged.dead and md is not None and merged.end_ledger < md[0]:
            tracker.delete_buckets([merged])  # acknowledged between the commit and now
        # install() unlinks them once it let the lock go, then ends the job.
        self.orphans = [b.path for b in self.window]
