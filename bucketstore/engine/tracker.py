"""The bucket tracker: one subscription's delayed index, PIP-195 style.

Data flow::

    add_message -> mutable bucket (runs) --seal--> ledger file + catalog key
                -> (old/covered ledgers) direct runs          |
                                                              v
    get_scheduled_messages <- shared queue <- segment slots of sealed buckets

Every public method takes the tracker's lock; they are safe to call from any
thread. The tracker-wide :class:`~bucketstore.engine.index_set.DelayedIndexSet` is the
one source of truth for what is tracked: ``number_of_delayed_messages`` is its
cardinality, and a queue row is delivered only if removing it from the index
succeeds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from functools import partial
from typing import Any

import numpy as np

from ..config import TrackerConfig
from ..cutoff import Clock, Cutoff, as_columns, check_max, check_position, check_timestamp
from ..errors import BucketStoreError, CatalogError, CorruptLedgerError, MaintenanceError, StoreClosedError
from ..memory.horizon import DeliveryHorizon
from .handoff import DeliveryHandoff
from .index_set import DelayedIndexSet, bitmap_of, sort_positions
from .journal import Journal, journal_directory
from .maintenance import MaintenanceCounters, close_on_exit
from .merge import choose_merge_window
from .merge_pipeline import MergeJob
from ..format.ledger_file import ledger_file_name
from .mutable_bucket import MutableBucket
from .mutable_timebucket import TimeBucketMutable
from .op_stats import OpStats
from .read_ahead import LOW_FRACTION, ReadAhead
from .identity import LedgerIdentityError, check_identity
from .bucket_summary import BucketSummary, decode_summary, encode_summary, summary_mismatch
from .bucket_prefix import first_rows, head_holds, take_head, track_heads, without_delivered_head
from .seal_pipeline import SealJob
from .sealed_bucket import BucketMap, SealedBucket, split_positions
from .sealed_membership import SpilledMembership
from .shared_queue import Run, RunBuffer, SharedQueue, Slot, sorted_run
from ..format.snapshot import BucketFile, BucketMetadata, bucket_key, parse_bucket_key
from .store_services import StoreServices
from ..waiting import CancelToken, DueWaiter

__all__ = ["BucketTracker"]

log = logging.getLogger("bucketstore")
_U64 = np.dtype("<u8")
#: How many of the unopened buckets due soonest have their entry 0 read ahead (off the lock).
OPEN_AHEAD = 8


class BucketTracker:
    """One subscription's delayed index, backed by sealed bucket snapshots.

    Obtain one with :meth:`bucketstore.Store.tracker`; the store owns its files and hands the
    tracker only its :class:`~bucketstore.engine.store_services.StoreServices`.
    """

    def __init__(self, store: StoreServices, name: str, config: TrackerConfig, clock: Clock | None) -> None:
        self._store = store
        self.name = name
        self.config = config
        self._lock = threading.RLock()
        # Waits for background work (flush, close, a full backlog) release the lock.
        self._cond = threading.Condition(self._lock)
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
        #: Sealed buckets known from their catalog summary only (entry 0 unread), and the
        #: indexes they hold: counted, not yet in the index (see _open_bucket).
        self._unopened = 0
        self._unopened_rows = 0
        #: The journal's durable frontier at recovery: what opening a bucket later applies.
        self._recovered_frontier: tuple[int, int, int] | None = None
        #: What contains_message knows of unopened buckets without opening them.
        self._membership = SpilledMembership(None if self._read_only else store.ledgers_dir)
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

    #: A read-only tracker (:mod:`~bucketstore.engine.read_only`) recovers without writing.
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
    def _file_identity(self) -> dict[str, str]:
        """The header properties that tie a ledger file to this tracker of this store."""
        return {"tracker": self.name, "store_id": self._store.store_id}

    @property
    def _state(self) -> dict[str, Any]:
        return {"mark_delete": list(self._mark_delete) if self._mark_delete else None,
                "config": {k: getattr(self.config, k) for k in self.config.__dataclass_fields__}}

    # -- adding ---------------------------------------------------------------------------------
    def add_message(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Track a delayed index.

        :return: False if ``deliver_at`` is already due (at or before the cutoff):
            the caller should dispatch the message now, and any earlier tracking of
            the position is dropped; False too for a position at or before the
            mark-delete position (acknowledged: nothing to track). True if the
            index is tracked (newly, or already) and the caller must skip the
            message for now.
        :raises TypeError, ValueError: ids that are not unsigned 64-bit ints.
        """
        check_position(ledger_id, entry_id)
        check_timestamp(deliver_at)
        # One row never waits for another caller's backlog, only past the budget's ceiling.
        waited = self._store.budget.admit(1, self._store.maintenance.run_while_waiting)
        with self._lock:
            self._check_open()
            timed = self._ops.count_add()
            started = time.perf_counter() if timed else 0.0
            tracked = self._add_one(ledger_id, entry_id, deliver_at, self._cutoff.advance())
            if self._journal is not None:
                self._sync()
            if tracked:
                self._due.added(deliver_at)
            if timed:
                self._ops.observe_add(time.perf_counter() - started)
            if timed or waited:  # the mutable bucket's size, reported 1 add in 16
                self._note_backlog(waited)
            return tracked

    def _add_one(self, ledger_id: int, entry_id: int, deliver_at: int, cutoff: int) -> bool:
        """:meth:`add_message` under the lock, without the journal's group commit."""
        # Expiry before membership: an expired re-add must dispatch now, not be
        # skipped because an undelivered copy is still tracked (Pulsar #26230).
        journal = self._journal
        if self._mark_delete is not None and (ledger_id, entry_id) <= self._mark_delete:
            return False  # acknowledged already: nothing to track
        if self._unopened and ledger_id <= self._buckets.newest_end:
            self._open_covering(ledger_id)  # its membership (and expiry) needs the bucket's positions
        if deliver_at <= cutoff:
            if self._index.expire(ledger_id, entry_id):
                self._mutable.discard(ledger_id, entry_id)
                if journal is not None:
                    journal.untrack(ledger_id, entry_id)
                self._horizon.emptied(self._count())
            return False
        if self._bits:
            trimmed = self._trim_time(deliver_at)
            frontier = self._handoff.frontier
            # A trimmed key at or before the delivery frontier would break the prefix
            # property recovery relies on: such an index keeps its exact time (see _trim_time).
            if frontier is None or (trimmed, ledger_id, entry_id) > frontier:
                deliver_at = trimmed
        # Track first (one lookup for the membership test and the insert); a
        # seal triggered by routing only looks at rows already in the mutable bucket.
        if not self._index.add(ledger_id, entry_id, deliver_at):
            return True
        if deliver_at > self._horizon.latest:
            self._horizon.latest = deliver_at
        mutable = self._mutable
        if ledger_id == mutable.end_ledger and ledger_id > self._buckets.newest_end \
                and ledger_id > self._sealing_end:
            mutable.add(deliver_at, ledger_id, entry_id)  # the ledger being written: no roll, no seal
        else:
            self._route(ledger_id, cutoff)(deliver_at, ledger_id, entry_id)
        if journal is not None:
            # Journaled after routing: a seal that routing triggers checkpoints the
            # journal, and this index must land after that checkpoint.
            if self._handoff.holding and self._handoff.holds(ledger_id, entry_id):
                self._supersede(ledger_id, np.array([entry_id], dtype=_U64))
            journal.add_one(ledger_id, entry_id, deliver_at)
        return True

    def _route(self, ledger_id: int, cutoff: int):
        """Seal if this ledger rolls the mutable bucket over, then pick where the index goes.

        The mutable bucket takes only ledgers newer than every sealed bucket. Pulsar's
        rule ("not covered and >= the mutable end") lets an old ledger that falls in a
        gap between sealed ranges start a fresh mutable bucket when it is empty (after
        a restart, while the embedder replays its log); newer
        ledgers then stretch it over sealed ranges, and the next seal writes a bucket
        that overlaps them, which recovery would then resolve by deleting the one
        enclosed. Such old ledgers go straight to the shared queue instead.
        """
        if ledger_id <= self._buckets.newest_end or ledger_id <= self._sealing_end:
            return self._direct.append  # covered by a sealed (or sealing) bucket, or in a gap before the newest
        mutable = self._mutable
        if ledger_id > mutable.end_ledger and not mutable.is_empty() \
                and mutable.pending_count(cutoff) >= self.config.min_index_count_per_bucket:
            self._start_seal(cutoff)
        if ledger_id >= mutable.end_ledger:
            return mutable.add
        return self._direct.append

    def add_messages(self, indexes: Any) -> int:
        """Track a batch; the same outcome as calling :meth:`add_message` row by row, faster.

        :param indexes: columns — a tuple of three lists or 1-D arrays
            ``(ledger_ids, entry_ids, deliver_at)`` or a mapping of ``"ledger_id"``,
            ``"entry_id"``, ``"deliver_at"`` to columns — or rows — an ``(n, 3)``
            array or a list (any iterable but a tuple of three) of
            ``(ledger_id, entry_id, deliver_at)`` triples (see
            :func:`bucketstore.cutoff.as_columns`; a tuple of three tuples, which
            could be either, raises TypeError).
        :return: how many rows are tracked after the call (rows for which
            :meth:`add_message` would have returned True).
        """
        ledgers, entries, deliver_at = as_columns(indexes)
        if not len(ledgers):
            return 0
        # Backpressure is charged to the batch that grows the backlog, before it takes the lock.
        waited = self._store.budget.admit(len(ledgers), self._store.maintenance.run_while_waiting)
        with self._lock:
            self._check_open()
            started = time.perf_counter()
            cutoff = self._cutoff.advance()
            tracked = 0
            # Rows are taken in order, one run of equal ledger ids at a time: routing
            # and the seal trigger depend only on the ledger, so a run is handled at once.
            cuts = np.flatnonzero(ledgers[1:] != ledgers[:-1]) + 1
            bounds = zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(ledgers)])).tolist())
            for lo, hi in bounds:
                if self._submitted - self._finished >= self._store.max_pending_maintenance:
                    self._wait_for_room()  # between ledger runs: the state is whole here
                if hi - lo == 1:
                    # A one-row ledger (many small ledgers): the scalar path costs a few
                    # microseconds where the vectorised one costs tens.
                    tracked += self._add_one(int(ledgers[lo]), int(entries[lo]), int(deliver_at[lo]), cutoff)
                else:
                    tracked += self._add_ledger_run(int(ledgers[lo]), entries[lo:hi], deliver_at[lo:hi], cutoff)
            if self._journal is not None:
                self._sync()
            if tracked:
                self._due.added(int(deliver_at.min()))
            self._ops.record("add", time.perf_counter() - started, True)
            self._note_backlog(waited)
            return tracked

    def _add_ledger_run(self, ledger_id: int, entries: np.ndarray, deliver_at: np.ndarray, cutoff: int,
                        journal: bool = True, expire: bool = True, trim: bool = True) -> int:
        if self._unopened and ledger_id <= self._buckets.newest_end:
            self._open_covering(ledger_id)
        if not expire:  # journal replay: a due index must be delivered now, not refused
            expired = np.zeros(len(deliver_at), dtype=bool)
        elif np.issubdtype(deliver_at.dtype, np.signedinteger):
            expired = deliver_at <= cutoff
        else:
            expired = deliver_at <= np.uint64(max(cutoff, 0)) if cutoff >= 0 else np.zeros(len(deliver_at), bool)
        if expired.any():
            # Expired rows untrack their position, as add_message does. (Should one
            # batch hold both an expired and a live row of one position, the live
            # row wins whatever their order.)
            for e in np.unique(entries[expired]).tolist():
                if self._index.expire(ledger_id, e):
                    self._mutable.discard(ledger_id, e)
                    if self._journal is not None:
                        self._journal.untrack(ledger_id, e)
        live = ~expired
        md = self._mark_delete
        if md is not None and ledger_id <= md[0]:
            live &= entries > np.uint64(md[1]) if ledger_id == md[0] else False  # acknowledged already
        live_e = entries[live]
        live_t = deliver_at[live].astype(_U64)
        if not len(live_e):
            return 0
        ledgers = np.full(len(live_e), ledger_id, dtype=_U64)
        if self._bits and trim:  # (a replay's times were trimmed when first added)
            live_t = self._trim_times(live_t, ledgers, live_e)
        batch = bitmap_of(live_e)
        if len(batch) == len(live_e) and not self._index.overlaps(ledger_id, batch):
            new = None  # the common case: all distinct, none tracked yet
        else:
            new = ~self._index.present_mask(ledgers, live_e)
            # Within the batch, the first row of a position wins (later ones see it tracked).
            _, first = np.unique(live_e, return_index=True)
            keep = np.zeros(len(live_e), bool)
            keep[first] = True
            new &= keep
            if not new.any():
                return len(live_e)
        ts, ls, es = (live_t, ledgers, live_e) if new is None else (live_t[new], ledgers[new], live_e[new])
        target = self._route(ledger_id, cutoff)
        if target == self._mutable.add:
            run = self._mutable.add_run(ts, ls, es)
            if run is not None:  # the TimeBucket variant keeps rows until they are due
                self._queue.push(run)
        else:
            self._queue.push(sorted_run(ts, ls, es))
        if self._journal is not None and journal:
            if self._handoff.holding:
                held = self._handoff.held_mask(ledger_id, es)
                if held.any():
                    self._supersede(ledger_id, es[held])
            self._journal.add_rows(ls, es, ts)  # after routing, as in add_message
        if new is None:
            self._index.add_new(ledger_id, batch, es, ts)
        else:
            self._index.add_many(ls, es, ts)
        self._horizon.added(int(ts.max()))
        return len(live_e)

    def _supersede(self, ledger_id: int, entries: np.ndarray) -> None:
        """Positions delivered in a batch that is not durably confirmed are tracked again.

        Their new time replaces their redelivery. The untrack journaled before the add
        makes a replay treat the old row (in a sealed bucket or an earlier add record)
        as dead, as for an expired re-add, so only the new time is live after a crash.
        """
        for entry in entries.tolist():
            self._journal.untrack(ledger_id, entry)
        self._handoff.supersede(ledger_id, entries)

    def _trim_time(self, deliver_at: int) -> int:
        """A timestamp on the precision grid: rounded down (delivery up to one step early), or,
        with ``deliver_at_time_strict``, up (never early; up to one step late), as Pulsar does.
        A time within one step of 2**64 cannot round up and rounds down.

        Rounded down, an index not due yet (``deliver_at`` after the cutoff) can land at or
        before the cutoff, and so at or before the delivery frontier: tracked there, it would
        be delivered behind the frontier, and recovery, which takes everything at or before
        the durable frontier as delivered, would drop it. The adds keep the exact time of such
        an index instead (still on time: ``deliver_at`` is after the cutoff, so after the
        frontier's time), so every tracked index sorts after every delivered one. Only an
        index due within one step can need it (its floor is at or before the cutoff).
        """
        floor = deliver_at >> self._bits << self._bits
        if self.config.deliver_at_time_strict and floor != deliver_at and floor + (1 << self._bits) < 1 << 64:
            return floor + (1 << self._bits)
        return floor

    def _trim_times(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> np.ndarray:
        """:meth:`_trim_time` of a uint64 column, keeping the exact time of the rows whose trimmed
        key would sort at or before the delivery frontier (see :meth:`_trim_time`)."""
        bits = np.uint64(self._bits)
        floor = ts >> bits << bits
        if self.config.deliver_at_time_strict:
            step = np.uint64(1 << self._bits)
            up = (floor != ts) & (floor <= np.uint64((1 << 64) - 1) - step)
            floor = np.where(up, floor + step, floor).astype(_U64)
        frontier = self._handoff.frontier
        if frontier is None or int(floor.min()) > frontier[0]:
            return floor  # the common case: the whole run is after the frontier
        return np.where(_after(floor, ledgers, entries, frontier), floor, ts).astype(_U64)

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

    # -- deleting buckets -----------------------------------------------------------------------
    def _bucket_exhausted(self, bucket: SealedBucket) -> None:
        # Deleted at the end of the call (_delete_exhausted), once its batch is recorded.
        self._exhausted.append(bucket)

    def _delete_exhausted(self) -> None:
        """Delete the buckets read to their end during this call.

        A bucket's file is the only durable copy of its rows. Rows of it that were
        delivered in a batch not durably confirmed are journaled first (and made
        durable before the catalog commit), so a crash brings them back.
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
        if journal is not None and self._handoff.holding:
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

    # -- delivering -----------------------------------------------------------------------------
    def get_scheduled_messages(self, max_messages: int) -> list[tuple[int, int]]:
        """Pop up to ``max_messages`` due indexes and return their positions.

        Due indexes leave in index order (timestamp, ledger, entry); the returned
        list is sorted by position ``(ledger_id, entry_id)``. Each position is
        returned at most once. Segments are read from disk as needed before
        returning, so the call never comes back short while due indexes remain.

        In ``journal`` mode the call first confirms the batches returned before
        (see :meth:`confirm_delivered`): with ``delivery="at-least-once"`` (the
        default) the batch it returns is durably delivered only once confirmed, so
        a crash before that delivers it again; with ``delivery="at-most-once"`` it
        is durably delivered before the call returns, so a crash before the caller
        uses it loses it.
        """
        max_messages = check_max(max_messages)
        with self._lock:
            self._check_open()
            started = time.perf_counter()
            journal = self._journal
            self._confirm()  # the embedder is back for more: it has handled the previous batch
            cutoff = self._cutoff.advance()
            if max_messages == 0:
                if journal is not None:
                    self._sync()
                return []
            self._sync_queue()
            ts, ledgers, entries, last_key = self._queue.pop_due(cutoff, max_messages, self._index)
            if last_key is not None:
                batch = (ts, ledgers, entries) if journal is not None and self._handoff.at_least_once else None
                key = self._handoff.delivered(last_key, batch)
                if key is not None and journal is not None:
                    journal.frontier(key)  # at-most-once: durable before the batch is returned
            self._delete_exhausted()
            if journal is not None:
                self._sync()
            self._horizon.emptied(self._count())
            positions = _positions(ledgers, entries)
            self._ops.delivered += len(positions)
            self._ops.record("deliver", time.perf_counter() - started, True)
        return positions

    def wait_scheduled(self, max_messages: int, timeout: float | None = None, *,
                       cancel: CancelToken | None = None) -> list[tuple[int, int]]:
        """Block until positions are due, then return them as :meth:`get_scheduled_messages` does.

        The caller sleeps (without holding the tracker's lock) until the earliest tracked
        index falls due, and is woken early by an add of an earlier index, by
        :meth:`clear`, or by :meth:`close` / ``Store.delete_tracker``. Each wake asks
        :meth:`get_scheduled_messages` again, so a batch is never early, and threads
        waiting on one tracker each get distinct positions. The batch follows the same
        handoff rules: in journal mode with ``delivery="at-least-once"`` the call confirms
        every batch returned before it (by any thread) when it starts, and its own batch
        is confirmed by the next call, :meth:`flush` or :meth:`confirm_delivered`.

        :param timeout: seconds to wait at most, measured on the tracker's clock (with a
            :class:`~bucketstore.testing.FakeClock`: until the clock is moved past it);
            None waits as long as it takes, 0 only looks.
        :param cancel: a :class:`~bucketstore.waiting.CancelToken` that ends the wait from
            another thread (the asyncio wrapper's cancellation).
        :return: the positions, sorted; ``[]`` when the timeout passes or ``cancel`` fires
            first (or ``max_messages`` is 0).
        :raises StoreClosedError: the tracker is closed, before or during the wait.
        """
        return self._due.wait_batch(self, max_messages, timeout, self._cutoff.lead_ms, cancel)

    def confirm_delivered(self) -> None:
        """Confirm every position returned so far: once durable, a crash never brings them back.

        ``durability="journal"`` with ``delivery="at-least-once"`` (the default): a batch
        returned by :meth:`get_scheduled_messages` is durably delivered only once it is
        confirmed — by this call, by the next :meth:`get_scheduled_messages`, or by
        :meth:`flush` — so a crash before that delivers it again. Call this once the batch
        is handed on when dispatching asynchronously, or before :meth:`close` (which does
        not confirm). Durable at the next journal commit: the next add, :meth:`flush`, a clean
        close, or the first call once ``confirm_sync_ms`` has passed (with
        ``confirm_sync_ms=0`` and ``sync_interval_ms=0``, when it returns); until then a crash
        may bring the batches back (see :mod:`~bucketstore.engine.handoff`). In ``sealed``
        mode, and with ``delivery="at-most-once"``, there is nothing to confirm.
        """
        with self._lock:
            self._check_open()
            self._confirm()
            if self._journal is not None:
                self._sync()

    def _confirm(self) -> None:
        key = self._handoff.confirm()
        if key is not None and self._journal is not None:
            # Lazy: a lost confirmation only redelivers, so it may wait for confirm_sync_ms.
            self._journal.frontier(key, lazy=True)

    def has_message_available(self) -> bool:
        """True when at least one tracked index is due."""
        with self._lock:
            self._check_alive()
            cutoff = self._cutoff.advance()
            if not self._count():
                return False
            nxt = self._next_time()
            self._delete_exhausted()
            return nxt is not None and nxt <= cutoff

    def next_delivery_time(self) -> int | None:
        """The earliest delivery time among tracked indexes, or None when nothing is tracked."""
        with self._lock:
            self._check_alive()
            if not self._count():
                return None
            nxt = self._next_time()
            self._delete_exhausted()
            return nxt

    def last_delivery_time(self) -> int | None:
        """The latest delivery time among tracked indexes (how far ahead the backlog
        reaches), or None when nothing is tracked.

        An upper bound, cheap (O(sealed buckets), no file read): the later of the
        latest time added since the tracker last held nothing and the last segment's
        max timestamp of every sealed bucket (from the catalog's summaries for buckets
        not opened yet). Deliveries go in time order, so it is exact while indexes
        leave only by delivery; one removed otherwise (``mark_delete``, a re-add
        already due, a re-add at another time) or a bucket's last rows already
        delivered may keep it later than the latest index actually left. With
        ``precision_bits``, times are the tracked (trimmed) ones, as for
        :meth:`next_delivery_time`.
        """
        with self._lock:
            self._check_alive()
            count = self._count()
            if not count:
                return None
            latest = self._horizon.value(count)
            sealed = self._buckets.latest_timestamp()
            if sealed is not None and (latest is None or sealed > latest):
                latest = sealed
            return latest

    def _next_time(self) -> int | None:
        self._sync_queue()
        queued = self._queue.next_timestamp(self._index)
        held = self._mutable.next_timestamp()
        return held if queued is None else queued if held is None else min(queued, held)

    def contains_message(self, ledger_id: int, entry_id: int) -> bool:
        """True if the position is tracked and not yet delivered."""
        check_position(ledger_id, entry_id)
        with self._lock:
            self._check_alive()
            if self._unopened and ledger_id <= self._buckets.newest_end:
                bucket = self._buckets.covering(ledger_id)
                if bucket is not None and not bucket.opened:
                    return self._unopened_contains(bucket, ledger_id, entry_id)
            return self._index.contains(ledger_id, entry_id)

    @property
    def number_of_delayed_messages(self) -> int:
        """How many positions are tracked and undelivered (O(1)).

        :raises StoreClosedError: the tracker is closed (a closed tracker knows nothing)."""
        self._check_alive()
        return self._count()

    def _count(self) -> int:
        # Buckets not opened yet count from their catalog summaries: nothing has touched them.
        return len(self._index) + self._unopened_rows

    # -- acknowledging --------------------------------------------------------------------------
    def mark_delete(self, ledger_id: int, entry_id: int) -> None:
        """Acknowledge everything up to and including ``(ledger_id, entry_id)``.

        The position is recorded durably. Buckets whose whole ledger range lies
        before ``ledger_id`` are deleted, and tracked indexes of those earlier
        ledgers (and of ``ledger_id`` up to ``entry_id``) are dropped: they are
        never delivered afterwards. A position earlier than the recorded one is
        ignored (acknowledgement never moves back).
        """
        check_position(ledger_id, entry_id)
        with self._lock:
            self._check_open()
            if self._mark_delete is not None and (ledger_id, entry_id) < self._mark_delete:
                return
            if self._unopened and ledger_id <= self._buckets.newest_end:
                self._open_covering(ledger_id)  # the bucket the trim cuts through; may raise: nothing recorded yet
            self._mark_delete = (ledger_id, entry_id)
            self._store.catalog.commit(self.name, state=self._state)
            self._trim(ledger_id, entry_id)
            self._horizon.emptied(self._count())

    def _trim(self, ledger_id: int, entry_id: int) -> None:
        # Only buckets whose *whole* range is before the first live ledger go
        # (never one that overlaps it: Pulsar #26240).
        dead = [b for b in self._buckets.values() if b.end_ledger < ledger_id]
        for b in dead:
            if b.held_rows:
                _log_held_removal(self.name, b, f"mark-delete ({ledger_id}, {entry_id}) passed it")
        self._delete_buckets(dead)
        if self._held_drained:
            self._held_drained = [b for b in self._held_drained if not b.dead]
        if self._unopened:
            self._open_covering(ledger_id)  # the one bucket the trim cuts through
        self._index.drop_ledgers_below(ledger_id)
        self._index.drop_through(ledger_id, entry_id)
        self._mutable.drop_through(ledger_id, entry_id)

    def replay_done(self) -> None:
        """I have replayed my log from the mark-delete position; buckets skipped at open may go.

        ``durability="sealed"`` follows PIP-195 §3.9: recovery skips the segments already
        due at open, because the embedder replays its log from the mark-delete position and
        re-adds their indexes (:meth:`add_message` returns False: dispatch now). Until the
        embedder says so by this call, the buckets holding skipped rows are kept (file and
        catalog key), even once their other segments are delivered: a newcomer who only
        looks, or a broker that restarts again before replaying, loses nothing (the next
        open skips the same segments again). Call it once the replay's re-adds have been
        made; the buckets that hold nothing else are then deleted (and logged), and the
        others once their remaining segments are delivered. A mark-delete past a bucket
        deletes it too. In ``journal`` mode nothing is skipped that was not delivered, so
        nothing is held and the call does nothing.

        ``stats()`` counts what is held: ``held_for_replay_buckets``, ``held_for_replay_indexes``.
        """
        with self._lock:
            self._check_open()
            drained = [b for b in self._held_drained if not b.dead]
            self._held_drained = []
            for b in drained:
                _log_held_removal(self.name, b, "the embedder's replay is done (replay_done)")
            for b in self._buckets.values():
                b.held_rows = 0  # what is still to deliver goes when it is delivered, as usual
            self._delete_buckets(drained)

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
        interval = self._store.sync_interval_ms
        if not self._journal.urgent:
            interval = max(interval, self._store.confirm_sync_ms)
        if interval == 0 or (time.monotonic() - self._last_sync) * 1000 >= interval:
            self._commit()

    def _commit(self) -> None:
        """Commit the journal now; batches its durable frontier now covers are never redelivered."""
        self._journal.commit()
        self._last_sync = time.monotonic()
        self._handoff.release(self._journal.durable_frontier)

    def _memory_only_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every live index held only in memory (mutable bucket, direct runs): what a journal
        checkpoint must carry."""
        self._sync_queue()
        parts = []
        for item in self._queue.items():
            if isinstance(item, Run) and item.owner is None and not item.dead and item.remaining:
                ts, ledgers, entries = item.rest()
                keep = self._index.present_mask(ledgers, entries, ts)
                parts.append((ledgers[keep], entries[keep], ts[keep]))
        ts, ledgers, entries = self._mutable.rows()
        if len(ts):
            keep = self._index.present_mask(ledgers, entries, ts)
            parts.append((ledgers[keep], entries[keep], ts[keep]))
        if not parts:
            empty = np.zeros(0, dtype=_U64)
            return empty, empty, empty
        return tuple(np.concatenate(cols) for cols in zip(*parts))  # type: ignore[return-value]

    def _checkpoint(self) -> None:
        self._index.settle()  # the ghosts are read directly below
        ledgers, entries, ts = self._memory_only_rows()
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
            if self._covering(ledger) is None:
                continue
            for entry in ghosts:
                if not self._index.contains(ledger, entry):
                    untracked.append((ledger, entry))
                    continue
                if in_memory is None:
                    in_memory = set(zip(ledgers.tolist(), entries.tolist()))
                if (ledger, entry) in in_memory:
                    untracked.append((ledger, entry))
        # The confirmed frontier, never the delivered one: what the embedder has not
        # confirmed is carried as rows to deliver again.
        self._journal.checkpoint(ledgers, entries, ts, handoff.confirmed, untracked, handoff.carry_rows())
        self._last_sync = time.monotonic()
        handoff.release(self._journal.durable_frontier)

    def clear(self) -> None:
        """Forget every index and delete every bucket (files and keys), durably."""
        with self._lock:
            self._check_open()
            self._cancel_jobs()
            self._delete_buckets(self._buckets.values())
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

    def _cancel_jobs(self) -> None:
        """Background work in flight is abandoned: each job, when the worker reaches its
        install, removes its file and changes nothing (the catch is under the lock)."""
        for job in (*self._sealing, *self._merging):
            job.cancelled = True
        self._sealing_end = -1

    def close(self, timeout: float | None = None) -> bool:
        """Release the tracker, first waiting for its seals and merges to finish.

        Nothing is deleted; sealed buckets are recovered on the next open.

        :param timeout: seconds to wait for background work (None: as long as it
            takes). If it runs out, the work still pending is abandoned, which is
            exactly a crash at this point: nothing acknowledged is lost (``journal``
            mode keeps the rows in the journal until a seal's install; ``sealed``
            mode never promised unsealed indexes), and files written but not
            installed are orphans, removed on the next open.

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
                "unopened_buckets": self._unopened,
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
                                   "evictions": m.evictions, "failures": m.failures, "opened_dense": m.dense}
            return stats

    def operation_metrics(self) -> dict[str, Any]:
        """Per operation (add, deliver, flush, and PIP-195's create = seal, load, merge, delete)
        its calls and latency histogram (see :meth:`~bucketstore.engine.op_stats.OpStats.histograms`),
        and the positions delivered so far: what :mod:`bucketstore.metrics` exports."""
        with self._lock:
            self._check_alive()
            return {"operations": self._ops.histograms(), "delivered": self._ops.delivered}

    def buckets(self) -> list[SealedBucket]:
        """The sealed buckets, in ledger order (for inspection)."""
        with self._lock:
            return self._buckets.values()

    # -- recovery -------------------------------------------------------------------------------
    def _recover(self) -> None:
        """Rebuild from the catalog and (journal mode) the journal; ledger files are read later.

        ``sealed`` mode follows PIP-195 §3.9: leading segments that are already
        due are skipped, because the embedder replays its log from the
        mark-delete position and re-adds them (add_message returns False and
        they are dispatched). Unlike Pulsar, their buckets are kept (``held_rows``)
        until :meth:`replay_done` or a mark-delete past them: no one has received
        those rows, and a clock stepped forward, a long stop or a newcomer who only
        looks must not delete them. ``journal`` mode skips only what the durable
        delivery frontier says was delivered (and confirmed), and replays the journal.
        What opening deletes (buckets mark-delete passed, journal-mode buckets wholly
        behind the frontier, the sources of a merge that committed, repair's drops) is
        logged with its key, ledger, file, rows and reason.

        Each bucket's catalog summary (segment table and count) is enough to
        decide the skip, to count its indexes and to queue it by its first live
        segment: the bucket stays *unopened* and its entry 0 is read when it is
        first needed (:meth:`_open_bucket`). Opened now are only buckets without
        a summary (written before summaries existed: read and summarised, the
        summaries committed here), the one a mark-delete position cuts through,
        those the journal's frontier falls inside (their delivered rows must be
        untracked to count exactly), and every bucket in ``repair`` mode (which
        must find damage to drop it).
        """
        started = time.perf_counter()
        store = self._store
        state = store.catalog.tracker_state(self.name)
        if state is None:
            store.catalog.commit(self.name, state=self._state)
            state = {}
        md = state.get("mark_delete")
        if isinstance(md, list) and len(md) == 2 and all(isinstance(v, int) for v in md):
            self._mark_delete = (md[0], md[1])
        keys, summaries = store.catalog.keys_and_summaries(self.name)
        ranges, enclosed = _resolve_ranges(keys, self.name)
        stale_keys = list(enclosed)
        cutoff = self._cutoff.advance()
        replayed = self._journal.replay() if self._journal is not None else None
        frontier = replayed.frontier if replayed is not None else None
        self._handoff = DeliveryHandoff(store.delivery, frontier)
        if frontier is not None:
            # The cutoff was at least the frontier's time when that index was delivered.
            # Keeping it there across the restart (whatever the clock says now) keeps every
            # new index after the frontier, which is what makes the frontier sufficient.
            self._cutoff.raise_to(frontier[0])
            cutoff = self._cutoff.value
        self._recovered_frontier = frontier
        dropped: list[str] = []
        doomed: list[SealedBucket] = []
        backfill: dict[str, bytes] = {}
        heads: list[Run] = []
        first_live = self._mark_delete[0] if self._mark_delete else 0
        for (start, end), ledger_id in ranges:
            key = bucket_key(start, end)
            path = os.path.join(store.ledgers_dir, ledger_file_name(ledger_id))
            raw = None if store.repair else summaries.get(key)
            meta = None
            try:
                if raw is None:
                    meta, size = self._read_entry0(path, ledger_id, key, None)
                    raw = backfill[key] = encode_summary(meta, ledger_id, size,
                                                         None if self._read_only else first_rows(path, meta))
                summary = decode_summary(raw, path=store.catalog.path, key=key)
                if summary.ledger_id != ledger_id:
                    raise CatalogError(f"{store.catalog.path}: tracker {self.name!r} key {key} names ledger "
                                       f"{ledger_id}, but its summary describes ledger {summary.ledger_id}",
                                       path=store.catalog.path, key=key)
            except LedgerIdentityError:
                raise  # an intact file of someone else: not damage that repair may drop
            except (CatalogError, CorruptLedgerError) as exc:
                # Only proven damage is dropped; an OSError (EACCES, EMFILE, EIO) says nothing
                # about the file and propagates, leaving the key and the file in place.
                if not store.repair:
                    raise
                dropped.append(f"{key}: {exc}")
                stale_keys.append(key)
                _log_repair_drop(self.name, key, ledger_id, path, exc)
                continue
            n = summary.segments
            # The first segment's max timestamp (in the summary's header) settles the common
            # case, no skip; the table is decoded only when leading segments are due.
            bound = cutoff + 1 if replayed is None else frontier[0] if frontier is not None else 0
            skip = 0
            if n and summary.first_max < bound:
                try:
                    max_ts = summary.table()[1]
                except CatalogError as exc:
                    if not store.repair:
                        raise
                    dropped.append(f"{key}: {exc}")
                    stale_keys.append(key)
                    _log_repair_drop(self.name, key, ledger_id, path, exc)
                    continue
                while skip < n and int(max_ts[skip]) < bound:
                    skip += 1
            bucket = SealedBucket.unopened(path, ledger_id, start, end, summary, first_segment=skip + 1,
                                           on_load=self._record_load)
            fate = _fate_at_open(skip, n, end, first_live, sealed=replayed is None)
            if fate is not None:
                _ = bucket.counts  # the table, before the summary goes
                bucket.summary = None  # deleted unread: never counted among the unopened
                doomed.append(bucket)
                _log_removal_at_open(self.name, key, ledger_id, path, int(bucket.counts.sum()), fate)
                continue
            if skip and replayed is None:
                # Sealed mode: the due segments are skipped, not delivered (PIP-195 §3.9), and
                # the file stays their only copy until the embedder's replay is done.
                bucket.held_rows = int(bucket.counts[:skip].sum())
            self._buckets.add(bucket)
            self._unopened += 1
            self._unopened_rows += bucket.pending_indexes
            if meta is not None or store.repair or (self._mark_delete is not None and start <= first_live <= end) \
                    or (frontier is not None and bucket.next_segment_min_ts() <= frontier[0]):
                try:
                    self._open_bucket(bucket, meta)
                except (OSError, CorruptLedgerError, CatalogError) as exc:
                    if not store.repair or isinstance(exc, (OSError, LedgerIdentityError)):
                        raise
                    dropped.append(f"{key}: {exc}")
                    stale_keys.append(key)
                    _log_repair_drop(self.name, key, ledger_id, path, exc)
                    self._buckets.remove(bucket)
                    self._forget_unopened(bucket)
                    continue
            if bucket.has_next_segment():
                # Its first rows from the summary, if it keeps them: the file waits (bucket_prefix).
                head = None if self._read_only or not bucket.summary else take_head(bucket)
                if head is not None:
                    heads.append(head)
                    self._unopened_rows -= head.remaining  # tracked in the index instead
                self._queue.push(head or Slot(bucket))
            else:
                self._held_drained.append(bucket)  # every segment skipped: nothing to deliver
        track_heads(self._index, heads)
        if (stale_keys or backfill) and not self._read_only:
            # Summaries of keys written before summaries existed, in one transaction with
            # the stale keys' removal; a crash before it only means reading entry 0 again.
            store.catalog.commit(self.name, remove=stale_keys, summaries=backfill)
            for key in enclosed:  # key first, then file: a crash here leaves only orphans
                _log_removal_at_open(self.name, key, keys[key], os.path.join(
                    store.ledgers_dir, ledger_file_name(keys[key])), _summary_count(summaries.get(key)),
                    "enclosed by a wider bucket (a merge committed before the crash removed its sources)")
                store.remove_ledger_file(os.path.join(store.ledgers_dir, ledger_file_name(keys[key])))
        self._delete_buckets(doomed)
        if replayed is not None:
            self._replay(replayed.records, frontier)
        if self._mark_delete:
            self._index.drop_ledgers_below(self._mark_delete[0])
            self._index.drop_through(*self._mark_delete)
        if self._journal is not None:
            self._checkpoint()  # compact: one file holding exactly the recovered memory-only state
        self._open_ahead()
        self.recovery_seconds = time.perf_counter() - started
        held = [b for b in self._buckets.values() if b.held_rows]
        if held:
            log.info("tracker %r: recovery skipped %d due indexes in %d bucket(s) (sealed mode: the embedder's "
                     "replay re-adds them); their files are kept until replay_done() or a mark-delete past them",
                     self.name, sum(b.held_rows for b in held), len(held))
        self.recovery_report = {"buckets": len(self._buckets), "deleted_due": len(doomed),
                                "enclosed_removed": len(enclosed), "dropped": dropped,
                                "unopened": self._unopened, "summaries_backfilled": len(backfill),
                                "held_for_replay_buckets": len(held),
                                "held_for_replay_indexes": sum(b.held_rows for b in held)}

    # -- opening buckets lazily -----------------------------------------------------------------
    def _read_entry0(self, path: str, ledger_id: int, key: str, summary: BucketSummary | None
                     ) -> tuple[BucketMetadata, int]:
        """Read a bucket's entry 0 and check the file is the one the catalog names (and, with a
        summary, the one it summarised). The same typed errors whether at open or later."""
        try:
            bf = BucketFile(path)
        except FileNotFoundError:
            raise CatalogError(f"tracker {self.name!r}: catalog key {key} names ledger {ledger_id}, "
                               f"but {path} is missing", path=path, key=key) from None
        with bf:
            meta, size = bf.metadata, bf.size
            check_identity(bf, ledger_id=ledger_id, tracker=self.name, store_id=self._store.store_id, key=key)
            if summary is not None:
                why = summary_mismatch(summary, meta, size)
                if why is not None:
                    raise CorruptLedgerError(path, bf.ledger.entry_payload_offset(0),
                                             f"bucket {key}: {why}")
        return meta, size

    def _open_covering(self, ledger_id: int) -> None:
        bucket = self._buckets.covering(ledger_id)
        if bucket is not None:
            self._open_bucket(bucket)

    def _open_bucket(self, bucket: SealedBucket, meta: BucketMetadata | None = None) -> None:
        """Read an unopened bucket's entry 0 and put its live positions in the index.

        Applies what recovery decided for it (the leading segments skipped; in journal
        mode their positions become ghosts): nothing can have touched the bucket's
        ledgers since, because every operation on them opens it first. Raises the
        same typed errors as recovery; on failure nothing changes.
        """
        summary = bucket.summary
        if summary is None or bucket.dead:
            return
        if meta is None:
            ahead = self._read_ahead.take_entry0(bucket)
            meta = ahead[0] if ahead is not None else \
                self._read_entry0(bucket.path, bucket.ledger_id, bucket.key, summary)[0]
        frontier = self._recovered_frontier
        skip = bucket.current
        live, skipped = split_positions(bucket, meta, skip, need_skipped=frontier is not None)
        live = without_delivered_head(self._index, bucket, live)
        for ledger, bm in live.items():
            self._index.add_bitmap(ledger, bm)
        if skipped is not None:
            # The skipped segments' rows stay in the file (a merge reads them): a
            # delivered position re-added later must not be made live again by them.
            for ledger, bm in skipped.items():
                self._index.add_ghosts(ledger, bm)
            self._untrack_delivered(bucket, skip, frontier)
        self._forget_unopened(bucket)
        _ = bucket.counts  # the segment table, decoded from the summary before it goes
        bucket.summary = None

    def _forget_unopened(self, bucket: SealedBucket) -> None:
        self._unopened -= 1
        self._unopened_rows -= bucket.pending_indexes
        self._membership.forget(bucket.ledger_id)

    def _unopened_contains(self, bucket: SealedBucket, ledger_id: int, entry_id: int) -> bool:
        """``contains_message`` on an unopened bucket's ledger, without opening it: the index holds
        nothing of its ledgers yet, and its live positions are those recovery left it (see
        :mod:`~bucketstore.engine.sealed_membership`), but for its prefix rows, which the index
        tracks from the open (delivery untracks them: :mod:`~bucketstore.engine.bucket_prefix`).
        Raises what opening it would raise."""
        if head_holds(bucket, ledger_id, entry_id):
            return self._index.contains(ledger_id, entry_id)
        answer = self._membership.contains(bucket.ledger_id, ledger_id, entry_id)
        if answer is not None:
            return answer
        meta = self._read_entry0(bucket.path, bucket.ledger_id, bucket.key, bucket.summary)[0]
        live, _ = split_positions(bucket, meta, bucket.current, need_skipped=False)
        if not self._membership.add(bucket.ledger_id, bucket.start_ledger, live):
            self._open_bucket(bucket, meta)  # a dense bucket, or the spill file failed: into the index
            return self._index.contains(ledger_id, entry_id)
        return bool(self._membership.contains(bucket.ledger_id, ledger_id, entry_id))

    def _load_segment(self, bucket: SealedBucket) -> Run:
        """The shared queue's loader: open the bucket on its first load, then read the segment."""
        if bucket.summary is not None:
            try:
                self._open_bucket(bucket)
            except BaseException:
                self._queue.push(Slot(bucket))  # the queue popped the slot: keep it for the next try
                raise
            self._open_ahead()
        return self._read_ahead.load(bucket)

    def _open_ahead(self) -> None:
        """Have the reader thread read the entry 0 of the unopened buckets due soonest."""
        if self._unopened and self._store.segment_reader is not None:
            self._open_ahead_of(self._queue.first_unopened(OPEN_AHEAD))

    def _open_ahead_of(self, buckets: list[SealedBucket]) -> None:
        """Have the reader thread read these unopened buckets' entry 0."""
        if self._store.segment_reader is None:
            return
        for b in buckets:
            if b.summary is not None and b.ahead is None:
                self._read_ahead.open_ahead(b, partial(self._read_entry0, b.path, b.ledger_id, b.key, b.summary))

    def _untrack_delivered(self, bucket: SealedBucket, first: int, frontier: tuple[int, int, int]) -> None:
        """Untrack a bucket's indexes at or before the frontier in the segments it falls in."""
        for number in range(first + 1, bucket.segment_count + 1):
            if int(bucket.min_ts[number - 1]) > frontier[0]:
                break
            run = bucket.read_segment(number)
            done = ~_after(run.ts, run.ledgers, run.entries, frontier)
            for ledger, entry in zip(run.ledgers[done].tolist(), run.entries[done].tolist()):
                self._index.discard(ledger, entry)
                # Its row stays in this segment: if the journal re-adds the position with
                # another time, only that time is live (as after a live delivery).
                self._index.add_ghosts(ledger, bitmap_of(np.array([entry], dtype=_U64)))

    def _replay(self, records: list[tuple], frontier: tuple[int, int, int] | None) -> None:
        """Re-apply journaled adds and untracks, in order, without the expiry check (a due
        index must now be delivered, not refused) and without journaling them again."""
        replaying, self._replaying = self._replaying, True
        try:
            for rec in records:
                if rec[0] == "x":
                    if self._unopened and rec[1] <= self._buckets.newest_end:
                        self._open_covering(rec[1])
                    if self._index.expire(rec[1], rec[2]):
                        # As a live expiry does: the TimeBucket index holds a position once, and a
                        # replayed re-add at another time must replace the row, not be dropped.
                        self._mutable.discard(rec[1], rec[2])
                    continue
                ledgers, entries, ts = rec[1], rec[2], rec[3]
                if frontier is not None:
                    keep = _after(ts, ledgers, entries, frontier)
                    ledgers, entries, ts = ledgers[keep], entries[keep], ts[keep]
                if not len(ledgers):
                    continue
                cuts = np.flatnonzero(ledgers[1:] != ledgers[:-1]) + 1
                for lo, hi in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(ledgers)])).tolist()):
                    self._add_ledger_run(int(ledgers[lo]), entries[lo:hi], ts[lo:hi], self._cutoff.value,
                                         journal=False, expire=False, trim=False)
        finally:
            self._replaying = replaying

    def _check(self) -> None:
        """Assert internal invariants (tests call this after every step)."""
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
        assert self._unopened_rows == sum(b.pending_indexes for b in unopened), "unopened count is stale"


def _fate_at_open(skip: int, segments: int, end: int, first_live: int, *, sealed: bool) -> str | None:
    """Why recovery deletes a bucket now, or None when it keeps it.

    Only what someone received goes: a bucket mark-delete passed (acknowledged), or in
    journal mode one whose every segment lies behind the durable (confirmed) delivery
    frontier. Sealed mode's skipped segments were never delivered: kept for the replay.
    """
    if end < first_live:
        return f"acknowledged: its ledgers end before the mark-delete position's ledger {first_live}"
    if segments == 0:
        return "empty: it holds no segment"
    if skip == segments and not sealed:
        return "delivered: every segment is behind the journal's confirmed delivery frontier"
    return None


def _summary_count(raw: bytes | None) -> int | None:
    """The row count a catalog summary records (None when there is none or it does not decode)."""
    if raw is None:
        return None
    try:
        return decode_summary(raw, path="", key="").count
    except (CatalogError, ValueError):
        return None


def _log_removal_at_open(tracker: str, key: str, ledger_id: int, path: str, rows: int | None, why: str) -> None:
    log.info("tracker %r: recovery deletes bucket %s (ledger %d, %s, %s rows): %s",
             tracker, key, ledger_id, path, "?" if rows is None else rows, why)


def _log_repair_drop(tracker: str, key: str, ledger_id: int, path: str, exc: BaseException) -> None:
    log.warning("tracker %r: repair drops bucket %s (ledger %d, %s): damaged: %s; its rows are lost, and the "
                "file goes at the next open if no key names it", tracker, key, ledger_id, path, exc)


def _log_held_removal(tracker: str, bucket: SealedBucket, why: str) -> None:
    log.info("tracker %r: deleting bucket %s (ledger %d, %s) holding %d rows skipped at open: %s",
             tracker, bucket.key, bucket.ledger_id, bucket.path, bucket.held_rows, why)


def _resolve_ranges(keys: dict[str, int], tracker: str) -> tuple[list[tuple[tuple[int, int], int]], list[str]]:
    """Order the catalog's buckets by range and resolve overlaps left by a crash mid-merge.

    A range that encloses others wins (the others are leftovers of a merge whose
    new key was committed before the old ones were removed); a partial overlap
    cannot come from any sequence of our own operations and is reported, never
    silently dropped. Deterministic: independent of key order.
    """
    parsed = []
    for key, ledger_id in keys.items():
        try:
            parsed.append((parse_bucket_key(key), ledger_id, key))
        except ValueError:
            raise CatalogError(f"tracker {tracker!r}: catalog key {key!r} is not a bucket key", key=key) from None
    # Widest first among equal starts, so an enclosing range is seen before what it encloses.
    parsed.sort(key=lambda p: (p[0][0], -p[0][1]))
    kept: list[tuple[tuple[int, int], int, str]] = []
    stale: list[str] = []
    for (start, end), ledger_id, key in parsed:
        if kept and start <= kept[-1][0][1]:
            (ks, ke), _, kkey = kept[-1]
            if end <= ke:
                stale.append(key)
                continue
            raise CatalogError(f"tracker {tracker!r}: bucket keys {kkey} and {key} overlap without one enclosing "
                               "the other", key=key)
        kept.append(((start, end), ledger_id, key))
    return [(r, lid) for r, lid, _ in kept], stale


def _after(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, key: tuple[int, int, int]) -> np.ndarray:
    """Mask of rows whose (timestamp, ledger, entry) sorts after ``key``."""
    t, l, e = (np.uint64(v) for v in key)
    return (ts > t) | ((ts == t) & ((ledgers > l) | ((ledgers == l) & (entries > e))))


def _positions(ledgers: np.ndarray, entries: np.ndarray) -> list[tuple[int, int]]:
    """Delivered positions (distinct), sorted by (ledger, entry)."""
    if len(ledgers) > 1:
        ledgers, entries = sort_positions(ledgers, entries)
    return list(zip(ledgers.tolist(), entries.tolist()))
