"""Delivering and acknowledging: the calls that take indexes out of the tracker.

A mixin of :class:`~bucketstore.engine.tracker.tracker.BucketTracker`: ``get_scheduled_messages``,
``wait_scheduled``, ``confirm_delivered``, the read-only questions (``contains_message``,
the counts and delivery times), ``mark_delete`` and ``replay_done``.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ...cutoff import check_max, check_position
from ...waiting import CancelToken
from ..buckets.sealed_bucket import SealedBucket
from ..queue.index_set import sort_positions
from .delivery_rollback import DeliveryMark

__all__ = ["Delivery"]

log = logging.getLogger("bucketstore")


class Delivery:
    """What leaves the tracker: due batches, and everything a mark-delete acknowledges."""

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
            mark = DeliveryMark(self._handoff, journal)
            ts, ledgers, entries, last_key = self._queue.pop_due(cutoff, max_messages, self._index)
            try:
                if last_key is not None:
                    batch = (ts, ledgers, entries) if journal is not None and self._handoff.at_least_once else None
                    key = self._handoff.delivered(last_key, batch)
                    if key is not None and journal is not None:
                        journal.frontier(key)  # at-most-once: durable before the batch is returned
                self._delete_exhausted()
                if journal is not None:
                    self._sync()
            except BaseException:
                # Recording the batch failed (a journal commit): it is not returned, so it goes
                # back, and the buckets read to their end stay (their files hold its rows).
                mark.put_back(self._queue, self._index, (ts, ledgers, entries))
                self._exhausted = []
                raise
            self._pager.maybe_sweep(self)  # (after the batch is recorded: a put-back needs its buckets in)
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
        may bring the batches back (see :mod:`~bucketstore.engine.durability.handoff`). In ``sealed``
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
        with self._lock:  # a background install may be moving positions between index and spill
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

        :raises CorruptLedgerError: a bucket it would delete, not read yet, disagrees with
            its catalog summary (nothing is recorded or deleted).
        """
        check_position(ledger_id, entry_id)
        with self._lock:
            self._check_open()
            if self._mark_delete is not None and (ledger_id, entry_id) < self._mark_delete:
                return
            if self._unopened and ledger_id <= self._buckets.newest_end:
                self._open_covering(ledger_id)  # the bucket the trim cuts through; may raise: nothing recorded yet
            if self._unopened:  # the ones it passes: checked against their file before any goes
                self._verify_before_delete([b for b in self._buckets.values() if b.end_ledger < ledger_id])
            previous, self._mark_delete = self._mark_delete, (ledger_id, entry_id)
            try:
                self._store.catalog.commit(self.name, state=self._state)
            except BaseException:
                # Not recorded: acknowledged in memory only, it would refuse re-adds of the
                # positions while still delivering them. As before the call; a retry records it.
                self._mark_delete = previous
                raise
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

        :raises CorruptLedgerError: a bucket it would delete disagrees with its catalog summary
            (its entry 0 is read first; nothing is deleted).
        """
        with self._lock:
            self._check_open()
            drained = [b for b in self._held_drained if not b.dead]
            self._verify_before_delete(drained)  # their rows were skipped on the summary's word
            self._held_drained = []
            for b in drained:
                _log_held_removal(self.name, b, "the embedder's replay is done (replay_done)")
            for b in self._buckets.values():
                b.held_rows = 0  # what is still to deliver goes when it is delivered, as usual
            self._delete_buckets(drained)


def _log_held_removal(tracker: str, bucket: SealedBucket, why: str) -> None:
    log.info("tracker %r: deleting bucket %s (ledger %d, %s) holding %d rows skipped at open: %s",
             tracker, bucket.key, bucket.ledger_id, bucket.path, bucket.held_rows, why)


def _positions(ledgers: np.ndarray, entries: np.ndarray) -> list[tuple[int, int]]:
    """Delivered positions (distinct), sorted by (ledger, entry)."""
    if len(ledgers) > 1:
        ledgers, entries = sort_positions(ledgers, entries)
    return list(zip(ledgers.tolist(), entries.tolist()))
