"""What a seal and a merge have in common: a job's life on the maintenance worker.

A job is created under its tracker's lock, does its slow part in :meth:`BucketJob.work`
holding no lock, and installs its result in :meth:`BucketJob.install` under the lock
again. Whatever goes wrong, a job ends (``tracker.finish_job``), so nobody waiting for
it (``flush``, ``close``, backpressure) waits forever, and a failure is reported by the
install, never lost. Both write their rows the same way: encoded as a bucket snapshot,
then a ledger file made durable before any catalog commit names it.

A job sees its tracker only through :class:`JobHost`, the few facts and install steps listed
there (``tests/test_architecture.py`` fails if a job module reads a private attribute of it).
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from ...config import TrackerConfig
from ...errors import BucketStoreError
from ...format import bucket_summary
from ...format.bucket_summary import encode_summary
from ...format.fs import FileSystem
from ...format.snapshot import BucketMetadata, build_bucket, write_bucket
from ..buckets.sealed_bucket import SealedBucket
from ..catalog.catalog import Catalog
from ..durability.handoff import HeldRows
from ..durability.journal import CheckpointWrite
from ..queue.index_set import DelayedIndexSet
from ..queue.shared_queue import Run, Slot
from ..threads.side_thread import run_beside

__all__ = ["BucketJob", "JobHost", "JobStore"]


class JobStore(Protocol):
    """What a seal or merge uses of its store: the ledger directory, the file layer, the catalog
    and the ledger ids (:class:`~bucketstore.engine.tracker.store_services.StoreServices` is
    one). A Protocol, so that the jobs stand below the tracker that hands them its store."""

    ledgers_dir: str
    fs: FileSystem
    catalog: Catalog

    def allocate_ledger_id(self) -> int:
        """A ledger id no file of the store has used."""

    def remove_ledger_file(self, path: str) -> None:
        """Unlink a ledger file the catalog no longer names."""


class JobHost(Protocol):
    """What a seal or merge needs of its tracker: the job interface of
    :class:`~bucketstore.engine.tracker.tracker.BucketTracker` (implemented in
    :mod:`~bucketstore.engine.tracker.job_runner`; for the package's jobs, not for applications).

    Every member is used under :attr:`job_lock` but ``store_services``, ``config``,
    ``file_identity`` and ``job_started``, which :meth:`BucketJob.work` uses off the lock,
    ``commit_lock`` and ``closed``, which an install reads before taking the lock, and
    ``delete_source_files``, which :meth:`BucketJob.install` calls once it let the lock go
    (or under it, for a merge given up after its commit: the tracker is closed then).
    """

    name: str
    config: TrackerConfig

    # -- facts ----------------------------------------------------------------------------------
    @property
    def job_lock(self) -> AbstractContextManager[Any]:
        """The tracker's lock: a job plans and installs holding it."""

    @property
    def commit_lock(self) -> AbstractContextManager[Any]:
        """Orders a job's catalog commit, made without :attr:`job_lock`, against cancelling
        jobs (``clear``, ``close``, ``delete_tracker``) and deleting a merge's sources:
        taken after ``job_lock`` when both are held, never by adds."""

    @property
    def store_services(self) -> JobStore:
        """The store's files, catalog and ledger ids."""

    @property
    def file_identity(self) -> dict[str, str]:
        """The header properties that tie a ledger file to this tracker of this store."""

    @property
    def closed(self) -> bool:
        """Whether the tracker is closed (a job installing then abandons its file)."""

    @property
    def live_index(self) -> DelayedIndexSet:
        """What is tracked: a job keeps only these rows (read when it is planned)."""

    @property
    def mark_delete_position(self) -> tuple[int, int] | None:
        """The acknowledged position, or None."""

    @property
    def due_soon(self) -> int:
        """Rows due at or before this time are delivered soon: the last delivery cutoff computed
        plus one segment's time step (``max_time_step_per_segment_ms``)."""

    def unconfirmed_rows(self, start_ledger: int, end_ledger: int) -> HeldRows:
        """The rows of ledgers ``[start, end]`` delivered in a batch not durable yet."""

    # -- install steps --------------------------------------------------------------------------
    def job_started(self) -> None:
        """Count the job as running (its ``work`` began)."""

    def withdraw_job(self, job: BucketJob) -> None:
        """The job installs now: it is no longer among the seals or merges in flight."""

    def install_bucket(self, path: str, ledger_id: int, meta: BucketMetadata) -> SealedBucket:
        """Add the sealed bucket a job wrote (its catalog key committed) to the tracker's buckets."""

    def retire_buckets(self, buckets: list[SealedBucket]) -> None:
        """Take merged sources out (keys already removed): dead, unmapped, their read-ahead dropped."""

    def enqueue(self, item: Run | Slot) -> None:
        """Push a run or a bucket's slot into the shared queue."""

    def drop_dead_runs(self) -> None:
        """Drop the queue's dead runs and slots (frozen runs, merged sources)."""

    def bucket_consumed(self, bucket: SealedBucket) -> None:
        """A new bucket holds nothing live: delete it as the delivery that emptied it would."""

    def delete_buckets(self, buckets: list[SealedBucket]) -> None:
        """Delete buckets: their catalog keys, then their files."""

    def checkpoint_after_seal(self) -> CheckpointWrite | None:
        """In journal mode (not replaying), let the journal go of the rows a seal made durable: the
        state is taken now; in the background, the checkpoint returned is written by
        :meth:`write_checkpoint` once the install let the lock go (None: nothing to write)."""

    def write_checkpoint(self, begun: CheckpointWrite) -> BaseException | None:
        """Write a begun journal checkpoint (called without the lock); its failure, returned."""

    def checkpoint_written(self, error: BaseException | None) -> None:
        """After :meth:`write_checkpoint`, under the lock: report its failure, if any."""

    def finish_job(self, job: BucketJob, outcome: str) -> None:
        """Record the job's end (``"done"``, ``"failed"``, ``"cancelled"``) and wake its waiters."""

    def delete_source_files(self, paths: list[str]) -> None:
        """Remove merged sources' files (their keys are gone; called without the lock)."""

    def merge_while_too_many(self) -> None:
        """Plan the next merge if the tracker still has too many buckets."""

    def page_out_idle(self) -> None:
        """Page idle sealed buckets out of the tracker-wide index if it has grown enough
        (see :mod:`~bucketstore.engine.buckets.index_pager`): what an install left idle may leave it."""


class BucketJob:
    """A seal or merge of ledgers ``[start, end]``; subclasses give ``_work`` and ``_install``."""

    #: The ``stats()`` operation the job counts as (``"create"`` or ``"merge"``).
    kind = ""

    def __init__(self, tracker: JobHost, start: int, end: int) -> None:
        self.tracker = tracker
        self.start, self.end = start, end
        self.cancelled = False
        self.running = self.finished = False
        self.number = 0  # the tracker's submission number
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.path: str | None = None
        self.ledger_id = -1
        self.meta: BucketMetadata | None = None
        #: Bytes of rows the job holds while in flight, charged to the store's backlog budget.
        self.backlog_bytes = 0
        #: The first rows written (copies), for the summary's prefix.
        self.head: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        #: The key this job committed before taking the lock, while it is durable and not
        #: installed yet (``clear`` removes it in its own transaction, then calls :meth:`uncommit`).
        self.committed_key: str | None = None
        #: Files the install made orphans (a merge's sources): unlinked once it let the lock go,
        #: and only then does the job end (see :meth:`_after_lock`).
        self.orphans: list[str] = []
        #: The journal checkpoint a seal's install began: written once it let the lock go, and
        #: only then does the job end.
        self.checkpoint: CheckpointWrite | None = None
        self._commit_ran = False

    def covers(self, ledger_id: int) -> bool:
        return self.start <= ledger_id <= self.end

    # -- off the lock ---------------------------------------------------------------------------
    def work(self) -> None:
        started = time.perf_counter()
        self.running = True
        self.tracker.job_started()
        try:
            self._work()
        except Exception as exc:  # reported by install(), never lost
            self.error = exc
        finally:
            self.seconds += time.perf_counter() - started

    def _work(self) -> None:
        raise NotImplementedError

    def _write(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> None:
        """Encode sorted rows as ledger ``self.ledger_id`` and write it durably, unless cancelled."""
        tracker = self.tracker
        store, cfg = tracker.store_services, tracker.config
        # A big bucket's segments are encoded in pieces by this thread and one beside it.
        self.meta, payloads = build_bucket(self.start, self.end, ts, ledgers, entries,
                                           time_step_ms=cfg.max_time_step_per_segment_ms,
                                           max_indexes_per_segment=cfg.max_indexes_per_segment,
                                           run_beside=run_beside)
        if self.cancelled:
            return
        # The prefix size is read here, as encode_summary reads it: a copy taken at import would
        # keep too few rows once the size is raised (the test knob), and every seal would fail.
        k = bucket_summary.PREFIX_ROWS
        self.head = tuple(np.array(c[:k + 1], dtype=np.uint64) for c in (ts, ledgers, entries))
        # write_bucket: temp file, fsync, rename, fsync(dir). Durable before the catalog names it.
        self.path = write_bucket(store.ledgers_dir, self.ledger_id, self.meta, payloads,
                                 tracker.file_identity, fs=store.fs)

    # -- installing: a part before the lock, then the lock -------------------------------------
    def commit(self) -> None:
        """The install's step before the tracker's lock (the job's catalog commit), once: a
        stepped worker may run it on its own, then deliveries, then :meth:`install` (which
        runs it if not done yet), to order tracker calls between the commit and the rest."""
        if self._commit_ran:
            return
        self._commit_ran = True
        started = time.perf_counter()
        try:
            self._before_lock()
        except Exception as exc:  # a bug: reported by the install under the lock, which abandons the job
            self.error = exc
        self.seconds += time.perf_counter() - started

    def install(self) -> None:
        tracker = self.tracker
        self.commit()
        with tracker.job_lock:
            started = time.perf_counter()
            try:
                self._install(tracker)
            except Exception as exc:  # a bug: still end the job, so nobody waits for it forever
                if not self.finished:
                    self.error = exc
                    tracker.finish_job(self, "failed")
                raise
            finally:
                self.seconds += time.perf_counter() - started
        if self.orphans or self.checkpoint is not None:
            self._after_lock(tracker)

    def _after_lock(self, tracker: JobHost) -> None:
        """Unlink the files the install made orphans (a merge's sources) and write the journal
        checkpoint it began (a seal's) holding no lock, then end the job under the lock: whoever
        waits for the job (``flush``) finds them done.

        Unlinking four files and fsyncing their directory under the lock took a merge's install
        from about 2 ms to 20, and another thread's single add waited for all of it. Their keys
        are gone already: a crash before the unlinks leaves orphans, which the next open removes.
        A checkpoint writes the memory-only rows (up to a bucket's worth) and fsyncs twice; the
        journal's appends go to a tail file after it meanwhile (see ``journal``).
        """
        orphans, self.orphans = self.orphans, []
        begun, self.checkpoint = self.checkpoint, None
        started = time.perf_counter()
        error = None
        try:
            if orphans:
                tracker.delete_source_files(orphans)  # (an OSError leaves orphans, swallowed there)
            if begun is not None:
                error = tracker.write_checkpoint(begun)
        except Exception:  # a bug: the job is installed all the same, so it still ends
            self._end_installed(tracker, started, begun is not None, None)
            raise
        # (Not in a ``finally``: a crash, a BaseException, runs nothing more, as a dead process.)
        self._end_installed(tracker, started, begun is not None, error)

    def _end_installed(self, tracker: JobHost, started: float, checkpointed: bool = False,
                       error: BaseException | None = None) -> None:
        with tracker.job_lock:
            self.seconds += time.perf_counter() - started
            if checkpointed:
                tracker.checkpoint_written(error)
            tracker.finish_job(self, "done")
            tracker.merge_while_too_many()
            tracker.page_out_idle()

    def _before_lock(self) -> None:
        """The install's step that needs no tracker lock (the job's catalog commit); none by default."""

    def uncommit(self) -> None:
        """``clear`` removed what this job committed (under ``commit_lock``, the job cancelled):
        its install now removes its file like any cancelled job's."""
        self.committed_key = None

    def _install(self, tracker: JobHost) -> None:
        raise NotImplementedError

    def _commit(self, put: dict[str, int], remove: list[str] | None = None) -> None:
        """The job's one catalog transaction (the file is durable already); a failure is
        kept in ``error`` for the install to act on."""
        try:
            # The summary rides in the key's transaction: opening the tracker later reads it
            # instead of the file's entry 0.
            summaries = {self.meta.key: encode_summary(self.meta, self.ledger_id, os.path.getsize(self.path),
                                                         self.head)} \
                if self.meta is not None and self.path is not None and self.meta.key in put else None
            self.tracker.store_services.catalog.commit(self.tracker.name, put=put, remove=remove or (),
                                               next_ledger_id=self.ledger_id + 1, summaries=summaries)
        except (OSError, BucketStoreError) as exc:
            self.error = exc

    def _abandon(self, outcome: str) -> None:
        """End the job without installing anything: its file, if written, is removed."""
        if self.path is not None:
            self.tracker.store_services.remove_ledger_file(self.path)
        self.tracker.finish_job(self, outcome)
