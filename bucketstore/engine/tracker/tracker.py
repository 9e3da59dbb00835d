"""The bucket tracker: one subscription's delayed index, PIP-195 style.

Data flow::

    add_message -> mutable bucket (runs) --seal--> ledger file + catalog key
                -> (old/covered ledgers) direct runs          |
                                                              v
    get_scheduled_messages <- shared queue <- segment slots of sealed buckets

Every public method takes the tracker's lock; they are safe to call from any
thread. The tracker-wide :class:`~bucketstore.engine.queue.index_set.DelayedIndexSet` is the
one source of truth for what is tracked: ``number_of_delayed_messages`` is its
cardinality, and a queue row is delivered only if removing it from the index
succeeds.

The class is one, its methods live by job: adding (:mod:`.adding`), delivering and
acknowledging (:mod:`.delivery`), starting and finishing seals and merges
(:mod:`.job_runner`), opening sealed buckets lazily (:mod:`..buckets.lazy_open`) and recovery
(:mod:`.recovery`) are its bases; the state they share, the lifecycle and the journal's
durability stay here.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from typing import Any

import numpy as np

from ...config import TrackerConfig
from ...cutoff import Clock, Cutoff
from ...errors import BucketStoreError, MaintenanceError, StoreClosedError
from ...memory.horizon import DeliveryHorizon
from ...waiting import DueWaiter
from ..buckets.index_pager import IndexPager
from ..buckets.lazy_open import LazyOpening
from ..buckets.read_ahead import LOW_FRACTION, ReadAhead
from ..buckets.sealed_bucket import BucketMap, SealedBucket
from ..buckets.sealed_membership import SpilledMembership
from ..durability.handoff import DeliveryHandoff
from ..durability.journal import CheckpointWrite, Journal, concat_rows, journal_directory
from ..maintenance.maintenance import MaintenanceCounters, close_on_exit
from ..maintenance.merge_pipeline import MergeJob
from ..maintenance.seal_pipeline import SealJob
from ..mutable.mutable_bucket import MutableBucket
from ..mutable.mutable_timebucket import TimeBucketMutable
from ..queue.index_set import DelayedIndexSet
from ..queue.shared_queue import Run, RunBuffer, SharedQueue
from .adding import Adding
from .delivery import Delivery
from .job_runner import JobRunning
from .op_stats import OpStats
from .recovery import Recovery
from .store_services import StoreServices

__all__ = ["BucketTracker"]

log = logging.getLogger("bucketstore")


class BucketTracker(Adding, Delivery, JobRunning, LazyOpening, Recovery):
    """One subscription's delayed index, backed by sealed bucket snapshots.

    Obtain one with :meth:`bucketstore.Store.tracker`; the store owns its files and hands the
    tracker only its :class:`~bucketstore.engine.tracker.store_services.StoreServices`. The members of
    :class:`~bucketstore.engine.maintenance.bucket_job.JobHost` (``install_bucket``, ``finish_job``, ...)
    are the interface of the package's seal and merge jobs, not for applications.
    """

    def __init__(self, store: StoreServices, name: str, config: TrackerConfig, clock: Clock | None) -> None:
        self._store = store
        self.name = name
        self.config = config
        self._lock = threading.RLock()
        # Waits for background work (flush, close, a full backlog) release the lock.
        self._cond = threading.Condition(self._lock)
        #: Orders a seal's catalog commit (made without _lock) against cancelling jobs.
        self._job_commits = threading.RLock()
        self._sealing: list[SealJob] = []   # frozen mutable buckets being written, oldest first
        self._merging: list[MergeJob] = []
        self._sealing_end = -1              # the newest frozen range's end, -1 when none
        self._maint = MaintenanceCounters()
        self._failure: BaseException | None = None  # the first background failure not yet raised
        self._unraised = 0  # how many failures _failure stands for
        self._submitted = 0
        self._finished = 0
        self._cutoff = Cutoff(config, clock)
        #: Threads blocked in wait_scheduled sleep on self._cond; adds, clear and close wake them.
        self._due = DueWaiter(self._cond, clock, slack_ms=(1 << config.precision_bits) - 1)
        self._index = DelayedIndexSet()
        # Delivered positions become ghosts (when the index applies its pending removals) where
        # a bucket's file still holds their rows (a merge reads them): should a position come
        # back with another time, its old row must stay dead.
        self._index.ghost_filter = self._file_holds
        #: Segment read-ahead (off when the store has no reader: segments are read when needed).
        self._read_ahead = ReadAhead(store.segment_reader)
        self._queue = SharedQueue(self._bucket_exhausted, load=self._load_segment, on_low=self._read_ahead.low,
                                  low_fraction=LOW_FRACTION, on_opening=self._open_ahead_of)
        #: Sealed buckets known from their catalog summary only (entry 0 unread), or paged out
        #: of the index (see index_pager), and the indexes they hold: counted, not in the index
        #: (see _open_bucket).
        self._unopened = 0
        self._unopened_rows = 0
        #: The journal's durable frontier at recovery: what opening a bucket later applies.
        self._recovered_frontier: tuple[int, int, int] | None = None
        #: What contains_message knows of unopened buckets without opening them.
        self._membership = SpilledMembership(None if self._read_only else store.ledgers_dir)
        #: Pages idle sealed buckets' bitmaps out of the index to that spill (they count as
        #: unopened meanwhile: the paths that open a bucket page it back in).
        self._pager = IndexPager(config.max_resident_ledgers)
        # precision_bits > 0: timestamps are trimmed to multiples of 2**bits ms and the
        # mutable bucket is a TimeBucket index (seed 000); deliveries may then come up to
        # 2**bits - 1 ms early (late instead, never early, when deliver_at_time_strict).
        self._bits = config.precision_bits
        self._mutable = TimeBucketMutable(self._bits) if self._bits else MutableBucket()
        self._direct = RunBuffer()
        self._buckets = BucketMap()
        self._ops = OpStats()
        self._horizon = DeliveryHorizon()  # how far ahead the in-memory indexes reach
        self._mark_delete: tuple[int, int] | None = None
        self._closed = False
        #: The delivery frontiers and the batches delivered but not durably confirmed.
        self._handoff = DeliveryHandoff(store.delivery, None)
        #: Buckets read to their end during a call, deleted when the call's batch is recorded.
        self._exhausted: list[SealedBucket] = []
        #: Buckets holding rows skipped at open (``held_rows``) with nothing left to deliver:
        #: deleted by :meth:`replay_done`, or by a mark-delete past them.
        self._held_drained: list[SealedBucket] = []
        self._journal: Journal | None = None
        self._replaying = False
        self._last_sync = time.monotonic()
        if store.durability == "journal":
            self._journal = self._open_journal()
        self.recovery_seconds = 0.0
        #: What recovery did: ``deleted_due`` counts the buckets it deleted (mark-delete passed
        #: them, or in journal mode the confirmed delivery frontier), ``enclosed_removed`` a crashed
        #: merge's leftovers, ``dropped`` repair's drops, ``held_for_replay_buckets`` and
        #: ``held_for_replay_indexes`` what sealed mode skipped and keeps until :meth:`replay_done`.
        self.recovery_report: dict[str, Any] = {}
        self._recover()

    #: A read-only tracker (:mod:`~bucketstore.engine.store.read_only`) recovers without writing.
    _read_only = False

    # -- helpers --------------------------------------------------------------------------------
    def _open_journal(self) -> Journal:
        store = self._store
        return Journal(journal_directory(store.path, self.name), store.fs, tracker=self.name,
                       store_id=store.store_id, pool=store.journal_fds)

    def _check_open(self) -> None:
        """The gate of every call that changes the tracker, and of those waiting for its work.

        Background failures (a seal, merge or journal checkpoint that failed on the
        maintenance thread) reach the application here, and only here: each is raised
        once, as :class:`MaintenanceError`, by the next of ``add_message``,
        ``add_messages``, ``get_scheduled_messages``, ``wait_scheduled``,
        ``confirm_delivered``, ``mark_delete``, ``clear``, ``flush``,
        ``wait_for_maintenance`` or ``close``; the call that raises it has changed
        nothing, so retrying it goes on. Once, not until a reopen: the failed job's
        indexes stay in memory and the tracker keeps working (a later seal may well
        succeed), so a transient ENOSPC must not become an outage; ``stats()`` keeps
        the count and the last error for monitoring. Reads (``stats``, counts,
        ``contains_message``, ``next_delivery_time``, ``has_message_available``,
        metrics) never raise it: a metrics thread must not take the writer's error.
        """
        self._check_alive()
        self._raise_failure()

    def _check_alive(self) -> None:
        """The gate of reads: a closed tracker knows nothing; background failures are not theirs."""
        if self._closed:
            raise StoreClosedError(f"tracker {self.name!r} is closed")

    def _record_failure(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._unraised += 1

    def _raise_failure(self) -> None:
        failure, count = self._failure, self._unraised
        if failure is not None:
            self._failure, self._unraised = None, 0
            more = f" (and {count - 1} later failure(s): see stats()['maintenance'])" if count > 1 else ""
            raise MaintenanceError(f"tracker {self.name!r}: background maintenance failed: "
                                   f"{type(failure).__name__}: {failure}{more}") from failure

    def _covering(self, ledger_id: int) -> SealedBucket | None:
        return self._buckets.covering(ledger_id)

    def _file_holds(self, ledger_id: int) -> bool:
        """Whether a sealed (or sealing) bucket's file may hold rows of the ledger."""
        return self._covering(ledger_id) is not None or any(job.covers(ledger_id) for job in self._sealing)

    def _sync_queue(self) -> None:
        """Turn buffered adds into runs in the shared queue."""
        for run in self._mutable.flush(self._cutoff.value):
            self._queue.push(run)
        run = self._direct.flush()
        if run is not None:
            self._queue.push(run)

    @property
    def _state(self) -> dict[str, Any]:
        return {"mark_delete": list(self._mark_delete) if self._mark_delete else None,
                "config": {k: getattr(self.config, k) for k in self.config.__dataclass_fields__},
                "durability": self._store.durability}

    # -- deleting buckets -----------------------------------------------------------------------
    def _bucket_exhausted(self, bucket: SealedBucket) -> None:
        # Deleted at the end of the call (_delete_exhausted), once its batch is recorded.
        self._exhausted.append(bucket)

    def _delete_exhausted(self) -> None:
        """Delete the buckets read to their end during this call.

        A bucket's file is the only durable copy of its rows. Rows of it that were
        delivered in a batch not durably confirmed are journaled first (and made
        durable before the catalog commit), so a crash brings them back. At-most-once
        journals none: its pending frontier is made durable first instead, so a failed
        write raises with the file still there for the rows the call puts back.
        """
        buckets = [b for b in self._exhausted if not b.dead]
        self._exhausted = []
        if any(b.held_rows for b in buckets):
            # Their skipped rows exist nowhere else until the embedder's replay is done.
            self._held_drained.extend(b for b in buckets if b.held_rows)
            buckets = [b for b in buckets if not b.held_rows]
        if not buckets:
            return
        journal = self._journal
        if journal is not None:
            if self._handoff.holding:
                for b in buckets:
                    ledgers, entries, ts = self._handoff.carry_rows(b.start_ledger, b.end_ledger, confirmed_too=True)
                    if len(ledgers):
                        journal.add_rows(ledgers, entries, ts)
            self._commit()
        self._delete_buckets(buckets)

    def _delete_buckets(self, buckets: list[SealedBucket]) -> None:
        """Remove buckets: their catalog keys in one transaction, then their files.

        Key first, file second: a crash in between leaves an orphan file, which
        the next open removes; the other order could leave a key naming a
        missing file, which recovery must treat as damage.
        """
        if not buckets:
            return
        started = time.perf_counter()
        for b in buckets:
            b.dead = True
            self._buckets.remove(b)
            self._read_ahead.forget(b)
            if not b.opened:
                self._forget_unopened(b)
        try:
            self._store.catalog.commit(self.name, remove=[b.key for b in buckets])
        except BucketStoreError as exc:
            self._ops.record("delete", time.perf_counter() - started, False)
            log.warning("tracker %r: removing %d bucket keys failed: %s", self.name, len(buckets), exc)
            return
        for b in buckets:
            self._store.remove_ledger_file(b.path)
        self._ops.record("delete", time.perf_counter() - started, True)


    # -- durability and lifecycle ---------------------------------------------------------------
    def wait_for_maintenance(self, timeout: float | None = None) -> bool:
        """Wait until no seal or merge is pending (installed, failed or cancelled; merges
        that finished seals start are waited for too), without :meth:`flush`'s other
        effects: nothing is confirmed and the journal is not committed.

        :param timeout: seconds to wait at most (None: as long as it takes).
        :return: True if the work finished, False if the timeout ran out first.
        :raises MaintenanceError: a seal or merge failed (its indexes stay in memory).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._check_open()
            while self._finished < self._submitted:
                remaining = None if deadline is None else deadline - time.monotonic()
                if not self._wait_for_jobs(self._submitted, remaining):
                    return False
            self._check_open()
            return True

    def flush(self) -> None:
        """Make everything added, untracked and delivered so far durable.

        Waits until every seal and merge started before the call is durable and in
        the catalog (or has failed: then :class:`MaintenanceError` is raised). In
        ``journal`` mode it then confirms the batches returned so far (see
        :meth:`confirm_delivered`) and commits (writes and fsyncs) the journal's
        pending group. In ``sealed`` mode an index is durable once its bucket is
        sealed, which happens as ledgers roll; ``flush`` does not seal the mutable
        bucket.
        """
        with self._lock:
            self._check_open()
            started = time.perf_counter()
            self._wait_for_jobs(self._submitted)
            self._check_open()
            if self._journal is not None:
                self._confirm()
                self._commit()
            self._ops.record("flush", time.perf_counter() - started, True)

    def _commit_pending(self) -> None:
        """Commit the journal's pending group now, if any (a checkpoint's first step: the adds
        waiting for their group commit are acknowledged, so the copy must hold them).
        Nothing else of :meth:`flush`: no wait for seals, no confirmation."""
        with self._lock:
            if self._closed or self._journal is None or not self._journal.has_pending:
                return
            self._commit()

    def _sync(self) -> None:
        """Group commit: make the journal durable now, or once ``sync_interval_ms`` has passed
        (``confirm_sync_ms`` when only confirmations are pending: see ``handoff``)."""
        if self._sync_due():
            self._commit()

    def _sync_due(self) -> bool:
        interval = self._store.sync_interval_ms
        if not self._journal.urgent:
            interval = max(interval, self._store.confirm_sync_ms)
        return interval == 0 or (time.monotonic() - self._last_sync) * 1000 >= interval

    def _commit(self) -> None:
        """Commit the journal now; batches its durable frontier now covers are never redelivered."""
        self._journal.commit()
        self._last_sync = time.monotonic()
        self._handoff.release(self._journal.durable_frontier)

    def _memory_only_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every live index held only in memory (mutable bucket, direct runs): what a journal
        checkpoint must carry."""
        return concat_rows(self._memory_only_parts())

    def _memory_only_parts(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """:meth:`_memory_only_rows` as (ledgers, entries, ts) parts, taken without copying or
        sorting what needs neither: a run whose unread rows are all live is kept as views of
        its columns (never written in place: a run that changes gets new arrays), so a seal's
        install takes the state in about a millisecond under the lock, and the checkpoint
        concatenates it without the lock. The runs are not compacted here (the mutable
        bucket's ``flush`` would sort up to a bucket's worth of rows)."""
        run = self._mutable.flush_buffer()
        if run is not None:
            self._queue.push(run)
        run = self._direct.flush()
        if run is not None:
            self._queue.push(run)
        parts = []
        for item in self._queue.items():
            if isinstance(item, Run) and item.owner is None and not item.dead and item.remaining:
                ts, ledgers, entries = item.rest()
                keep = self._index.present_mask(ledgers, entries, ts)
                parts.append((ledgers, entries, ts) if keep.all() else (ledgers[keep], entries[keep], ts[keep]))
        ts, ledgers, entries = self._mutable.rows()
        if len(ts):
            keep = self._index.present_mask(ledgers, entries, ts)
            parts.append((ledgers[keep], entries[keep], ts[keep]))  # (copies: the TimeBucket's own columns)
        return parts

    def _checkpoint(self, begin: bool = False) -> CheckpointWrite | None:
        """Checkpoint the journal now; with ``begin``, only take the state and return it to be
        written without the lock (``Journal.begin_checkpoint``: a seal's install)."""
        self._index.settle()  # the ghosts are read directly below
        parts = self._memory_only_parts()
        # A position untracked by an expired re-add keeps its row, and its bit, in a sealed
        # bucket: the checkpoint replaces the file that held its untrack record, so it must
        # carry the untrack on, or recovery tracks the position again from the bitmap. So
        # must a delivered position whose batch is not confirmed (its old row may lie after
        # the durable frontier; the replay then tracks it again from the carried rows), and
        # a position tracked again at a new time held only in memory (the replay then
        # tracks it from the memory rows, at that time, not from its old row in the bucket);
        # never one whose live row is in a sealed bucket: the untrack would cancel that row.
        handoff = self._handoff
        in_memory: set[tuple[int, int]] | None = None
        untracked = []
        for ledger, ghosts in self._index._ghosts.items():
            bucket = self._covering(ledger)
            # A seal in flight may have written the position's old row to its file already, and
            # commit it after this checkpoint: its ledger's untracks are carried on as well.
            if bucket is None and not self._file_holds(ledger):
                continue
            # A paged-out bucket's positions are in the spill, not the index.
            tracked = self._index.contains if bucket is None or bucket.paged is None else \
                partial(self._membership.contains, bucket.ledger_id)
            for entry in ghosts:
                if not tracked(ledger, entry):
                    untracked.append((ledger, entry))
                    continue
                if in_memory is None:
                    in_memory = set()
                    for ledgers, entries, _ in parts:
                        in_memory.update(zip(ledgers.tolist(), entries.tolist()))
                if (ledger, entry) in in_memory:
                    untracked.append((ledger, entry))
        # The confirmed frontier, never the delivered one: what the embedder has not
        # confirmed is carried as rows to deliver again.
        begun = None
        if begin:
            begun = self._journal.begin_checkpoint(parts, handoff.confirmed, untracked, handoff.carry_rows())
        else:
            self._journal.checkpoint(*concat_rows(parts), handoff.confirmed, untracked, handoff.carry_rows())
        self._last_sync = time.monotonic()
        handoff.release(self._journal.durable_frontier)
        return begun

    def clear(self) -> None:
        """Forget every index and delete every bucket (files and keys), durably."""
        with self._lock:
            self._check_open()
            buckets = self._buckets.values()
            with self._job_commits:  # a job committing off the lock: before this, or cancelled
                # Keys seals and merges committed but did not install yet go too.
                keys = [b.key for b in buckets] + self._committed_job_keys()
                if keys:
                    # The keys go first, and a failed commit raises before anything changed: a
                    # clear that dropped only its memory would see its buckets come back at the
                    # next open (a retry clears them). _delete_buckets then finds them gone.
                    self._store.catalog.commit(self.name, remove=keys)
                self._cancel_jobs(keys_removed=True)
            self._delete_buckets(buckets)
            self._buckets.clear()
            self._queue.clear()
            self._mutable.clear()
            self._store.budget.note_mutable(self, 0)
            self._direct = RunBuffer()
            self._index.clear()
            self._horizon.emptied()
            self._handoff.forget()  # nothing is tracked any more, delivered or not
            self._exhausted = []
            self._held_drained = []
            if self._journal is not None:
                self._checkpoint()
            self._due.wake_all()

    def _cancel_jobs(self, keys_removed: bool = False) -> None:
        """Background work in flight is abandoned: each job, when the worker reaches its
        install, removes its file and changes nothing (the catch is under the lock). A seal
        that committed its key already keeps its file, unless ``keys_removed`` (``clear``)."""
        with self._job_commits:
            for job in (*self._sealing, *self._merging):
                job.cancelled = True
            if keys_removed:
                for job in (*self._sealing, *self._merging):
                    job.uncommit()
        self._sealing_end = -1

    def close(self, timeout: float | None = None) -> bool:
        """Release the tracker, first waiting for its seals and merges to finish.

        Nothing is deleted; sealed buckets are recovered on the next open.

        :param timeout: seconds to wait for background work (None: as long as it
            takes). If it runs out, the work still pending is abandoned, which is
            exactly a crash at this point: nothing acknowledged is lost (``journal``
            mode keeps the rows in the journal until a seal's install; ``sealed``
            mode never promised unsealed indexes), and files written but not in
            the catalog yet are orphans, removed on the next open (a seal whose
            catalog commit is done keeps its file: the next open installs it).

        Closing does not confirm deliveries (a ``finally: close()`` also runs when the
        last batch failed): in journal mode with ``delivery="at-least-once"`` a batch
        not confirmed by :meth:`confirm_delivered`, :meth:`flush` or a later
        :meth:`get_scheduled_messages` is delivered again after the next open.
        :return: True if every pending seal and merge finished; False if the close
            gave up on some (also logged).
        :raises MaintenanceError: once the tracker is closed, a background failure no call
            has raised yet (the last seals' included: in ``sealed`` mode their indexes,
            kept in memory, are gone with the close).
        """
        with self._lock:
            if self._closed:
                return True
            drained = self._wait_for_jobs(self._submitted, timeout)
            if not drained:
                log.warning("tracker %r: closed with %d seal/merge jobs unfinished after %.3f s: "
                            "treated as a crash (nothing acknowledged is lost; their files become orphans)",
                            self.name, self._submitted - self._finished, timeout)
                self._cancel_jobs()
            self._closed = True
            self._cond.notify_all()
            if self._journal is not None:
                try:
                    self._journal.commit()  # a clean close loses nothing that was added
                finally:
                    self._journal.close()
            for b in self._buckets.values():
                self._read_ahead.forget(b)
            self._queue.clear()
            self._mutable.clear()
            self._store.budget.note_mutable(self, 0)
            self._index.clear()
            self._held_drained = []
            self._unopened = self._unopened_rows = 0
            self._membership.close()
        self._store.tracker_closed(self)
        with self._lock:
            self._raise_failure()
        return drained

    def __enter__(self) -> "BucketTracker":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        close_on_exit(self.close, block_raised=exc_type is not None)

    def stats(self) -> dict[str, Any]:
        """Counters: buckets, indexes, loaded indexes, bytes on disk and in memory, op counts/latencies.

        ``maintenance_failure`` is the background failure not yet raised to a writer (see
        :meth:`_check_open`), as text, or None, and ``pending_maintenance_failures`` how many
        failures it stands for; ``maintenance_failures`` counts every failure so far. Never
        raises a background failure itself.
        """
        with self._lock:
            self._check_alive()
            loaded = self._queue.loaded_indexes() + len(self._direct)
            ahead = ReadAhead.held_rows(self._buckets.values())  # read, not yet in the queue
            stats: dict[str, Any] = {
                "tracker": self.name,
                "immutable_buckets": len(self._buckets),
                "number_of_delayed_messages": self._count(),
                "unopened_buckets": self._unopened - sum(b.paged is not None for b in self._buckets.values()),
                "loaded_indexes": loaded,
                "snapshot_size_bytes": sum(b.size for b in self._buckets.values()),
                "memory_bytes": ((loaded + ahead) * 24 + self._mutable.memory_bytes() + self._index.memory_bytes()
                                 + self._membership.resident_bytes() + 200 * len(self._buckets)),
                "mutable_bucket_range": [self._mutable.start_ledger, self._mutable.end_ledger],
                "queue_entries": len(self._queue),
                "cutoff": self._cutoff.value,
                "mark_delete": list(self._mark_delete) if self._mark_delete else None,
                "recovery_seconds": round(self.recovery_seconds, 6),
                "maintenance_failure": (None if self._failure is None else
                                        f"{type(self._failure).__name__}: {self._failure}"),
                "maintenance_failures": self._maint.failed,
                "pending_maintenance_failures": self._unraised,
                "held_for_replay_buckets": sum(1 for b in self._buckets.values() if b.held_rows),
                "held_for_replay_indexes": sum(b.held_rows for b in self._buckets.values()),
            }
            stats.update(self._ops.as_dict())
            stats["maintenance"] = {**self._maint.as_dict(), "background": self._store.background,
                                    "sealing": len(self._sealing), "merging": len(self._merging)}
            stats["read_ahead"] = {**self._read_ahead.counters.as_dict(), "held_indexes": ahead}
            waits = self._ops.ops["backpressure"]
            stats["backpressure"] = {"waits": waits.succeeded, "wait_seconds": round(waits.observed_seconds, 6),
                                     "store": self._store.budget.as_dict()}
            m = self._membership
            stats["membership"] = {"spilled_buckets": len(m), "resident_bytes": m.resident_bytes(),
                                   "spill_bytes": m.spill_bytes(), "spills": m.spills, "questions": m.questions,
                                   "evictions": m.evictions, "failures": m.failures, "opened_dense": m.dense,
                                   "paged_buckets": sum(b.paged is not None for b in self._buckets.values()),
                                   **self._pager.as_dict()}
            return stats

    def operation_metrics(self) -> dict[str, Any]:
        """Per operation (add, deliver, flush, and PIP-195's create = seal, load, merge, delete)
        its calls and latency histogram (see :meth:`~bucketstore.engine.tracker.op_stats.OpStats.histograms`),
        and the positions delivered so far: what :mod:`bucketstore.metrics` exports."""
        with self._lock:
            self._check_alive()
            return {"operations": self._ops.histograms(), "delivered": self._ops.delivered}

    def buckets(self) -> list[SealedBucket]:
        """The sealed buckets, in ledger order (for inspection)."""
        with self._lock:
            return self._buckets.values()

    def _check(self) -> None:
        """Assert internal invariants (tests call this after every step). Under the lock: a
        background install changes what is checked, and the index's settle, which the check
        runs, must not run on two threads at once (both would apply the same removals)."""
        with self._lock:
            self._check_invariants()

    def _check_invariants(self) -> None:
        self._index._check()
        prev_end = -1
        for b in self._buckets.values():
            assert b.start_ledger <= b.end_ledger
            assert b.start_ledger > prev_end, "sealed bucket ranges overlap"
            prev_end = b.end_ledger
            assert not b.dead
        assert self._buckets.newest_end == prev_end, "newest bucket end is stale"
        unopened = [b for b in self._buckets.values() if not b.opened]
        assert self._unopened == len(unopened), (self._unopened, len(unopened))
        assert self._unopened_rows == sum(b.pending_indexes if b.paged is None else b.paged
                                          for b in unopened), "unopened count is stale"
        self._pager.check(self)
