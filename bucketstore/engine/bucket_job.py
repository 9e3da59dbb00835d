"""What a seal and a merge have in common: a job's life on the maintenance worker.

A job is created under its tracker's lock, does its slow part in :meth:`BucketJob.work`
holding no lock, and installs its result in :meth:`BucketJob.install` under the lock
again. Whatever goes wrong, a job ends (``tracker._finish_job``), so nobody waiting for
it (``flush``, ``close``, backpressure) waits forever, and a failure is reported by the
install, never lost. Both write their rows the same way: encoded as a bucket snapshot,
then a ledger file made durable before any catalog commit names it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ..errors import BucketStoreError
from ..format.snapshot import BucketMetadata, build_bucket, write_bucket
from .bucket_summary import PREFIX_ROWS, encode_summary

#: The owning :class:`~bucketstore.engine.tracker.BucketTracker` (not imported: it imports the jobs).
Tracker = Any

__all__ = ["BucketJob"]


class BucketJob:
    """A seal or merge of ledgers ``[start, end]``; subclasses give ``_work`` and ``_install``."""

    #: The ``stats()`` operation the job counts as (``"create"`` or ``"merge"``).
    kind = ""

    def __init__(self, tracker: Tracker, start: int, end: int) -> None:
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

    def covers(self, ledger_id: int) -> bool:
        return self.start <= ledger_id <= self.end

    # -- off the lock ---------------------------------------------------------------------------
    def work(self) -> None:
        started = time.perf_counter()
        self.running = True
        self.tracker._maint.running += 1
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
        store, cfg = tracker._store, tracker.config
        self.meta, payloads = build_bucket(self.start, self.end, ts, ledgers, entries,
                                           time_step_ms=cfg.max_time_step_per_segment_ms,
                                           max_indexes_per_segment=cfg.max_indexes_per_segment)
        if self.cancelled:
            return
        self.head = tuple(np.array(c[:PREFIX_ROWS + 1], dtype=np.uint64) for c in (ts, ledgers, entries))
        # write_bucket: temp file, fsync, rename, fsync(dir). Durable before the catalog names it.
        self.path = write_bucket(store.ledgers_dir, self.ledger_id, self.meta, payloads,
                                 tracker._file_identity, fs=store.fs)

    # -- under the lock -------------------------------------------------------------------------
    def install(self) -> None:
        tracker = self.tracker
        with tracker._lock:
            started = time.perf_counter()
            try:
                self._install(tracker)
            except Exception as exc:  # a bug: still end the job, so nobody waits for it forever
                if not self.finished:
                    self.error = exc
                    tracker._finish_job(self, "failed")
                raise
            finally:
                self.seconds += time.perf_counter() - started

    def _install(self, tracker: Tracker) -> None:
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
            self.tracker._store.catalog.commit(self.tracker.name, put=put, remove=remove or (),
                                               next_ledger_id=self.ledger_id + 1, summaries=summaries)
        except (OSError, BucketStoreError) as exc:
            self.error = exc

    def _abandon(self, outcome: str) -> None:
        """End the job without installing anything: its file, if written, is removed."""
        if self.path is not None:
            self.tracker._store.remove_ledger_file(self.path)
        self.tracker._finish_job(self, outcome)
