"""Starting and finishing the tracker's seals and merges (the jobs: seal_pipeline, merge_pipeline).

A mixin of :class:`~bucketstore.engine.tracker.tracker.BucketTracker`: it freezes the mutable bucket
into a seal, plans merges while there are too many buckets, runs each job (in the
background or now), and records its end; the backpressure by job count lives here too.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import AbstractContextManager
from typing import Any

from ...errors import BucketStoreError
from ...format.snapshot import BucketMetadata
from ..buckets.sealed_bucket import SealedBucket
from ..durability.handoff import HeldRows
from ..durability.journal import CheckpointWrite
from ..maintenance.bucket_job import BucketJob, JobStore
from ..maintenance.merge import choose_merge_window
from ..maintenance.merge_pipeline import MergeJob
from ..maintenance.seal_pipeline import SealJob
from ..queue.index_set import DelayedIndexSet
from ..queue.shared_queue import Run, Slot

__all__ = ["JobRunning"]

log = logging.getLogger("bucketstore")


class JobRunning:
    """The tracker's side of its seal and merge jobs, and the job interface
    (:class:`~bucketstore.engine.maintenance.bucket_job.JobHost`) they install through."""

    # -- sealing and merging (see seal_pipeline, merge_pipeline, maintenance) -------------------
    def _start_seal(self, cutoff: int) -> None:
        """Freeze the mutable bucket and seal it: in the background, or now (synchronous store,
        journal replay). Its indexes stay deliverable from the frozen runs meanwhile."""
        start, end = self._mutable.start_ledger, self._mutable.end_ledger
        run = self._mutable.flush_buffer()  # buffered rows become a run in the queue first
        if run is not None:
            self._queue.push(run)
        runs = self._mutable.freeze(self._index)
        if self._bits:  # the TimeBucket variant held its rows outside the queue
            for run in runs:
                self._queue.push(run)
        if not runs:
            return
        job = SealJob(self, start, end, runs, cutoff)
        self._store.budget.note_mutable(self, 0)  # its rows are the job's charge now
        self._sealing.append(job)
        self._sealing_end = max(self._sealing_end, end)
        self._run_job(job)

    def merge_while_too_many(self) -> None:
        limit = self.config.max_num_buckets
        while limit > 0 and len(self._buckets) > limit and not self._merging and not self._closed:
            window = choose_merge_window(self._buckets.values())
            if window is None:
                return
            try:
                for b in window:
                    self._open_bucket(b)  # the merge keeps what the index says is live
            except (OSError, BucketStoreError) as exc:
                self._maint.failed += 1
                self._maint.last_error = f"opening a bucket to merge: {type(exc).__name__}: {exc}"
                log.error("tracker %r: %s", self.name, self._maint.last_error)
                return  # not retried in a loop; the delivery that reaches the bucket reports it
            job = MergeJob(self, window)
            self._merging.append(job)
            self._run_job(job)
            if job.error is not None or self._background:
                return  # a failed merge is not retried in a loop; a background one installs later

    @property
    def _background(self) -> bool:
        return self._store.background and not self._replaying

    def _run_job(self, job: SealJob | MergeJob) -> None:
        self._submitted += 1
        self._maint.queued += 1
        job.number = self._submitted
        self._store.budget.charge(job.backlog_bytes)
        if self._background:
            self._store.maintenance.submit(job)
        else:
            job.work()
            job.install()

    def finish_job(self, job: BucketJob, outcome: str) -> None:
        """Record a job's end (under the lock) and wake whoever waits for it."""
        job.finished = True
        self._store.budget.release(job.backlog_bytes)
        m = self._maint
        m.queued -= 1
        if job.running:
            m.running -= 1
            job.running = False
        m.seconds += job.seconds
        ok = outcome == "done"
        if outcome == "cancelled":
            m.cancelled += 1
        elif ok:
            m.done += 1
        else:
            m.failed += 1
            error = job.error
            m.last_error = f"{job!r}: {type(error).__name__}: {error}"
            if self._background:
                log.error("tracker %r: background %s failed, keeping its indexes in memory: %s",
                          self.name, job.kind, m.last_error)
                self._record_failure(error)
            else:
                log.warning("tracker %r: %s failed, keeping its indexes in memory: %s",
                            self.name, job.kind, m.last_error)
        if outcome != "cancelled":
            self._ops.record(job.kind, job.seconds, ok)
        if not self._sealing:
            self._sealing_end = -1  # every frozen range is a sealed bucket (or memory-only) now
        self._finished = max(self._finished, job.number)
        self._cond.notify_all()

    #: Seal checkpoints left out since the last one written (see :meth:`checkpoint_after_seal`).
    _checkpoints_skipped = 0

    def checkpoint_after_seal(self) -> CheckpointWrite | None:
        if self._journal is None or self._replaying:
            return None
        try:
            if not self._background:  # (on the caller's thread, holding the lock anyway)
                self._checkpoint()
                return None
            if self._sealing and not self._checkpoints_skipped:
                # Another seal is in flight: its frozen rows are memory-only, so this checkpoint
                # would write them (up to a bucket's worth) on top of the mutable bucket's, and
                # the next install's checkpoint lets the journal go of both. Leaving one out keeps
                # the log whole (its files stay until a checkpoint replaces them); every other
                # one at most, so that seals that always overlap still checkpoint.
                self._checkpoints_skipped += 1
                return None
            self._checkpoints_skipped = 0
            return self._checkpoint(begin=True)
        except (OSError, BucketStoreError) as exc:
            self._checkpoint_failed(exc)
            return None

    def write_checkpoint(self, begun: CheckpointWrite) -> BaseException | None:
        try:
            self._journal.write_checkpoint(begun)
        except (OSError, BucketStoreError) as exc:
            return exc
        return None

    def checkpoint_written(self, error: BaseException | None) -> None:
        if error is not None:
            self._checkpoint_failed(error)

    def _checkpoint_failed(self, exc: BaseException) -> None:
        self._maint.failed += 1
        self._maint.last_error = f"journal checkpoint: {type(exc).__name__}: {exc}"
        log.error("tracker %r: %s", self.name, self._maint.last_error)
        self._record_failure(exc)

    def delete_source_files(self, paths: list[str]) -> None:
        self._store.remove_ledger_files(paths)

    def page_out_idle(self) -> None:
        self._pager.maybe_sweep(self)

    def _note_backlog(self, waited: float) -> None:
        """After an add: report the mutable bucket's bytes to the store's budget, and count
        the time the add waited for it (the ``backpressure`` operation)."""
        self._store.budget.note_mutable(self, self._mutable.memory_bytes())
        if waited:
            self._ops.record("backpressure", waited, True)

    def _wait_for_room(self) -> None:
        """Backpressure by job count, for batches only (a single add never waits here): while
        this tracker's seals and merges pending reach the store's limit, wait (releasing
        the lock) for the worker. The memory budget is the store's ``BacklogBudget``."""
        limit = self._store.max_pending_maintenance
        while self._background and self._submitted - self._finished >= limit and not self._closed:
            if not self._store.maintenance.run_while_waiting():
                self._cond.wait()
        # Only closed: a job that failed meanwhile is raised by the next call, not half-way
        # through this batch (its earlier ledgers are tracked already).
        self._check_alive()

    def _wait_for_jobs(self, number: int, timeout: float | None = None) -> bool:
        """Wait (releasing the lock) until every job up to ``number`` has finished."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._finished < number:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            if not self._store.maintenance.run_while_waiting():
                self._cond.wait(remaining)
        return True

    def _record_load(self, seconds: float, ok: bool) -> None:
        self._ops.record("load", seconds, ok)

    # -- the job interface (JobHost): what a job reads and installs through ---------------------
    @property
    def job_lock(self) -> AbstractContextManager[Any]:
        return self._lock

    @property
    def commit_lock(self) -> AbstractContextManager[Any]:
        return self._job_commits

    def _committed_job_keys(self) -> list[str]:
        """Keys seals and merges committed without the lock and have not installed yet (under
        ``commit_lock``)."""
        return [job.committed_key for job in (*self._sealing, *self._merging) if job.committed_key is not None]

    @property
    def store_services(self) -> JobStore:
        return self._store

    @property
    def file_identity(self) -> dict[str, str]:
        """The header properties that tie a ledger file to this tracker of this store."""
        return {"tracker": self.name, "store_id": self._store.store_id}

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def live_index(self) -> DelayedIndexSet:
        return self._index

    @property
    def mark_delete_position(self) -> tuple[int, int] | None:
        return self._mark_delete

    @property
    def due_soon(self) -> int:
        return self._cutoff.value + self.config.max_time_step_per_segment_ms

    def unconfirmed_rows(self, start_ledger: int, end_ledger: int) -> HeldRows:
        return self._handoff.held_rows(start_ledger, end_ledger)

    def job_started(self) -> None:
        with self._lock:  # two maintenance threads may start jobs of this tracker at once
            self._maint.running += 1

    def withdraw_job(self, job: BucketJob) -> None:
        (self._sealing if isinstance(job, SealJob) else self._merging).remove(job)

    def install_bucket(self, path: str, ledger_id: int, meta: BucketMetadata) -> SealedBucket:
        bucket = SealedBucket(path, ledger_id, meta, os.path.getsize(path), on_load=self._record_load,
                              fs=self._store.fs)
        self._buckets.add(bucket)
        return bucket

    def retire_buckets(self, buckets: list[SealedBucket]) -> None:
        for b in buckets:
            b.dead = True  # their runs and slots in the queue die with them
            self._buckets.remove(b)
            self._read_ahead.forget(b)

    def enqueue(self, item: Run | Slot) -> None:
        self._queue.push(item)

    def drop_dead_runs(self) -> None:
        self._queue.drop_dead()

    def bucket_consumed(self, bucket: SealedBucket) -> None:
        self._exhausted.append(bucket)
        self._delete_exhausted()

    def delete_buckets(self, buckets: list[SealedBucket]) -> None:
        self._delete_buckets(buckets)  # (a read-only tracker overrides _delete_buckets)
