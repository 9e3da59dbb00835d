"""Starting and finishing the tracker's seals and merges (the jobs: seal_pipeline, merge_pipeline).

A mixin of :class:`~bucketstore.engine.tracker.BucketTracker`: it freezes the mutable bucket
into a seal, plans merges while there are too many buckets, runs each job (in the
background or now), and records its end; the backpressure by job count lives here too.
"""

from __future__ import annotations

import logging
import time

from ..errors import BucketStoreError
from .merge import choose_merge_window
from .merge_pipeline import MergeJob
from .seal_pipeline import SealJob

__all__ = ["JobRunning"]

log = logging.getLogger("bucketstore")


class JobRunning:
    """The tracker's side of its seal and merge jobs."""

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

    def _merge_while_too_many(self) -> None:
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

    def _finish_job(self, job: SealJob | MergeJob, outcome: str) -> None:
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

    def _checkpoint_or_fail(self) -> None:
        try:
            self._checkpoint()
        except (OSError, BucketStoreError) as exc:
            self._maint.failed += 1
            self._maint.last_error = f"journal checkpoint: {type(exc).__name__}: {exc}"
            log.error("tracker %r: %s", self.name, self._maint.last_error)
            self._record_failure(exc)

    def _delete_source_files(self, paths: list[str]) -> None:
        for path in paths:
            self._store.remove_ledger_file(path)

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
        self._check_open()

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
