"""The seal pipeline: freeze the mutable bucket, write its ledger off the lock, install it.

::

    freeze (lock)     the mutable bucket's runs stay in the shared queue, frozen
                      (deliverable, counted, contains_message-visible); a fresh
                      mutable bucket takes new ledgers
    work (no lock)    sort, drop dead rows, encode, write + fsync + rename +
                      fsync(dir) the ledger file
    commit (no lock)  one catalog commit adds the key, under the tracker's commit
                      lock only (adds never take it)
    install (lock)    the sealed bucket replaces the frozen runs in the queue;
                      journal mode takes the checkpoint's state
    checkpoint        journal mode writes it (no lock: appends go to a tail file
      (no lock)       after it), then the job ends

Durability order: the file is durable before the catalog names it (a crash
between leaves an orphan file, removed on open), and in journal mode the
journal keeps the frozen rows until the checkpoint that follows the commit
(a crash before it replays them: nothing is lost). A failure in either step
removes the file and leaves the frozen runs in the queue: the indexes stay in
memory (Pulsar's downgrade).

The commit is off the tracker's lock because it is an LMDB transaction with an
fsync (0.5 to 16 ms measured on a loaded machine), the longest wait a single add
could meet. Between it and the install the key is durable while the bucket is
not in memory yet; the frozen runs still hold its rows, so nothing is missing.
What could go wrong there is a job cancelled meanwhile, and ``commit_lock`` orders
the two: a cancel (``clear``, ``close`` giving up, ``delete_tracker``) takes it, so
either the seal sees the cancel and commits nothing, or it committed first and
``clear`` removes the key in its own transaction (``committed_key``), while
``close`` and ``delete_tracker`` leave it as a crash just after the commit would
(the next open installs it; ``delete_tracker`` drops it with the tracker's keys).
Installs still run one at a time in submission order (the commit is inside the
install's turn), so catalog commits of jobs keep that order. Deletions and
mark-delete trims are unaffected: they only touch installed buckets, and the
install deletes a bucket acknowledged or consumed meanwhile, as before.
"""

from __future__ import annotations

import numpy as np

from ...format.row_sort import sort_row_parts
from ...format.snapshot import drop_repeats
from ..queue.liveness import FrozenMutableLiveness
from ..queue.shared_queue import Run, Slot
from ..threads.side_thread import run_beside
from .backlog_budget import ROW_BYTES
from .bucket_job import BucketJob, JobHost

__all__ = ["SealJob"]

_U64 = np.dtype("<u8")


class SealJob(BucketJob):
    """One seal of a frozen mutable bucket over ledgers ``[start, end]``."""

    kind = "create"

    def __init__(self, tracker: JobHost, start: int, end: int, runs: list[Run], cutoff: int) -> None:
        super().__init__(tracker, start, end)
        #: The frozen runs: in the shared queue until install replaces them.
        self.runs = runs
        # Views of their unread rows now; the arrays are never written in place.
        self._views = [r.rest() for r in runs]
        self.backlog_bytes = ROW_BYTES * sum(len(v[0]) for v in self._views)
        self._cutoff = cutoff
        self._liveness = FrozenMutableLiveness(tracker.live_index, start, end, tracker.mark_delete_position)
        self._sealed: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._due: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __repr__(self) -> str:
        return f"SealJob({self.tracker.name!r}, [{self.start}, {self.end}])"

    def _work(self) -> None:
        if self.cancelled:
            return
        parts = []
        for ts, ledgers, entries in self._views:
            keep = self._liveness.mask(ts, ledgers, entries)
            # Usually all are live: skip three gathers.
            parts.append((ts, ledgers, entries) if keep.all() else (ts[keep], ledgers[keep], entries[keep]))
        self._views = []
        # The runs (each sorted) are sorted together without concatenating them first, a big
        # seal's ranges of timestamps on two threads. A position re-added with the time of one
        # of its stale rows leaves two equal rows.
        ts, ledgers, entries = drop_repeats(*sort_row_parts(parts, sorted_parts=True, run_beside=run_beside))
        # Rows already due at the freeze belong to no snapshot (as in Pulsar): they stay in the queue.
        due = int(np.searchsorted(ts, np.uint64(self._cutoff), side="right")) if self._cutoff >= 0 else 0
        self._due = (ts[:due], ledgers[:due], entries[:due])
        ts, ledgers, entries = ts[due:], ledgers[due:], entries[due:]
        if not len(ts):
            return
        self.ledger_id = self.tracker.store_services.allocate_ledger_id()
        self._write(ts, ledgers, entries)
        if self.path is None:
            return  # cancelled meanwhile
        self._sealed = (ts, ledgers, entries)

    # -- the install: its commit before the lock, the rest under it -----------------------------
    def _before_lock(self) -> None:
        if self.error is not None or self.meta is None or self._sealed is None or self.path is None:
            return
        tracker = self.tracker
        with tracker.commit_lock:  # a cancel comes wholly before this or wholly after
            if self.cancelled or tracker.closed:
                return  # the install abandons the file
            self._commit({self.meta.key: self.ledger_id})  # makes the bucket part of the tracker
            if self.error is None:
                self.committed_key = self.meta.key

    def _install(self, tracker: JobHost) -> None:
        tracker.withdraw_job(self)
        if self.cancelled or tracker.closed:  # clear(), close() or delete_tracker() meanwhile
            if self.committed_key is not None:
                # close() gave up on it, or delete_tracker(), after its commit: the key names the
                # file durably, which stays as after a crash there (see the module docstring).
                tracker.finish_job(self, "cancelled")
            else:
                self._abandon("cancelled")
            return
        if self.error is not None:
            self._abandon("failed")  # the frozen runs stay in the queue: the indexes are kept in memory
            return
        # Every frozen row was popped (delivered, or skipped as dead) while the file was written:
        # the new bucket holds nothing live.
        consumed = all(not run.remaining for run in self.runs)
        for run in self.runs:
            run.kill()
        if self._due is not None and len(self._due[0]):
            tracker.enqueue(Run(*self._due))
        bucket = None
        if self.meta is not None and self._sealed is not None and self.path is not None:
            bucket = tracker.install_bucket(self.path, self.ledger_id, self.meta)
            n1 = self.meta.segments[0].count
            ts, ledgers, entries = self._sealed
            if not n1 or int(ts[0]) <= tracker.due_soon:
                # Segment 1 is due soon and in memory already: hand it to the queue without
                # reading it back. Rows delivered since the freeze are in it; the index keeps
                # them dead.
                bucket.current = 1
                tracker.enqueue(Run(ts[:n1].copy(), ledgers[:n1].copy(), entries[:n1].copy(), owner=bucket))
            else:
                # Due later: it waits on disk, as a reopened store's does, read when the queue
                # reaches it. Kept, every sealed bucket's first segment stayed in memory until
                # due (24 bytes a row: 2.4 B/index for a dense store built live).
                tracker.enqueue(Slot(bucket))
        self._sealed = self._due = None
        self.committed_key = None  # installed
        tracker.drop_dead_runs()  # the frozen runs
        if bucket is not None and consumed:
            # Delete it now, as the delivery that emptied it would have deleted it had it been
            # installed then (journal mode first journals its delivered, unconfirmed rows):
            # otherwise its file stays until the next delivery call, and a clean close keeps it.
            tracker.bucket_consumed(bucket)
        md = tracker.mark_delete_position
        if bucket is not None and not bucket.dead and md is not None and bucket.end_ledger < md[0]:
            tracker.delete_buckets([bucket])  # acknowledged while it was being written
        # Only now, with the bucket durable and in the catalog, may the journal let
        # go of its rows (a checkpoint before the commit could lose them in a crash). The
        # state is taken here, with the install, and written once the lock is let go.
        self.checkpoint = tracker.checkpoint_after_seal()
        if self.checkpoint is not None:
            return  # install() writes it without the lock, then ends the job
        tracker.finish_job(self, "done")
        tracker.merge_while_too_many()
        tracker.page_out_idle()
