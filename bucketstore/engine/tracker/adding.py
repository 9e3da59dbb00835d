"""Adding to the tracker: ``add_message`` and ``add_messages``, routing and time trimming.

A mixin of :class:`~bucketstore.engine.tracker.tracker.BucketTracker`, whose constructor sets up
the state these methods work on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ...cutoff import as_columns, check_position, check_timestamp
from ..durability.handoff import after_key
from ..queue.index_set import bitmap_of
from ..queue.shared_queue import sorted_run
from ..threads.side_thread import run_beside

__all__ = ["Adding"]

log = logging.getLogger("bucketstore")

_U64 = np.dtype("<u8")
#: A batch for covered ledgers smaller than this joins the buffered single adds (one run at the
#: next sync) instead of becoming a run of its own: each run is a heap entry of the shared queue
#: and a look at every frontier build, and a journal of single adds replayed at open made one
#: run per record (10,000 one-row runs beside a sealed bucket: 5 s to drain 60,000 indexes).
SMALL_RUN = 64


class Adding:
    """How an index gets tracked: into the mutable bucket, or (covered ledgers) the shared queue."""

    #: With ``sync_interval_ms > 0``: whether a group an add took is being written beside the
    #: callers (see :meth:`_write_taken`); set under the lock, cleared by the writer.
    _writing_behind = False
    #: Waits for the last such write (``abandon_store`` does: a crashed process has no threads).
    _behind: Callable[[], None] | None = None

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
            taken = self._take_group() if self._journal is not None else 0
            if tracked:
                self._due.added(deliver_at)
            if timed:
                self._ops.observe_add(time.perf_counter() - started)
            if timed or waited:  # the mutable bucket's size, reported 1 add in 16
                self._note_backlog(waited)
        if taken:
            self._write_taken(taken)
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
            taken = self._take_group() if self._journal is not None else 0
            if tracked:
                self._due.added(int(deliver_at.min()))
            self._ops.record("add", time.perf_counter() - started, True)
            self._note_backlog(waited)
        if taken:
            self._write_taken(taken)
        return tracked

    def _take_group(self) -> int:
        """An add's group commit, in two steps: when one is due (see ``_sync``), the pending group
        is taken here, under the lock, and written once the call let the lock go
        (:meth:`_write_taken`), so another thread's add never waits for this one's write and
        fsync (2-25 ms a group of 50,000 rows). With a window (``sync_interval_ms > 0``), none
        is taken while the last one is still being written: the pending group grows meanwhile,
        so the groups grow as the disk slows (fewer fsyncs) and nobody waits for the disk."""
        if not self._sync_due():
            return 0
        windowed = self._store.sync_interval_ms > 0
        if windowed and self._writing_behind:
            return 0
        self._last_sync = time.monotonic()
        taken = self._journal.take()
        if taken and windowed:
            self._writing_behind = True
        return taken

    def _write_taken(self, taken: int) -> None:
        """With ``sync_interval_ms=0`` the call returns once its group is durable, as documented.
        With a window no add's durability is promised before ``flush()`` (which, like a
        delivery's commit, a checkpoint and ``close()``, writes the taken groups first), and the
        group is written on a thread beside the caller, which goes on meanwhile."""
        if not self._store.sync_interval_ms:
            self._write_group(taken, wait=True)
            return

        def write() -> None:
            try:
                self._write_group(taken, wait=False)
            except Exception as exc:  # the group stays taken (or the journal poisoned): the next
                # take, commit or flush writes it or raises this; nothing is lost meanwhile
                log.warning("tracker %r: journal group written beside the caller failed: %s: %s",
                            self.name, type(exc).__name__, exc)
            finally:
                self._writing_behind = False

        try:
            self._behind = run_beside(write)
        except RuntimeError:  # no thread to be had: written here, as without a window
            self._writing_behind = False
            self._write_group(taken, wait=True)

    def _write_group(self, taken: int, wait: bool) -> None:
        """Write the group :meth:`_take_group` took (and any taken before it), without the lock;
        batches a frontier it carried made durable are then let go of, under the lock (beside
        the caller, only if the lock is free: the next commit lets them go otherwise)."""
        journal = self._journal
        before = journal.durable_frontier
        journal.write_taken(taken)
        if journal.durable_frontier != before and self._lock.acquire(blocking=wait):
            try:
                self._handoff.release(journal.durable_frontier)
            finally:
                self._lock.release()

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
        untracked_later = None
        if expired.any():
            # Expired rows untrack their position, as add_message does.
            for e in np.unique(entries[expired]).tolist():
                if self._index.expire(ledger_id, e):
                    self._mutable.discard(ledger_id, e)
                    if self._journal is not None:
                        self._journal.untrack(ledger_id, e)
            untracked_later = _followed_by_expiry(entries, expired)
        live = ~expired
        md = self._mark_delete
        if md is not None and ledger_id <= md[0]:
            live &= entries > np.uint64(md[1]) if ledger_id == md[0] else False  # acknowledged already
        # Row by row, a live row that a due row of its position follows is tracked (add_message
        # returns True) and then untracked: it counts, but is not stored.
        counted = int(np.count_nonzero(live))
        if untracked_later is not None:
            live &= ~untracked_later
        live_e = entries[live]
        live_t = deliver_at[live].astype(_U64)
        if not len(live_e):
            return counted
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
                return counted
        ts, ls, es = (live_t, ledgers, live_e) if new is None else (live_t[new], ledgers[new], live_e[new])
        target = self._route(ledger_id, cutoff)
        if target == self._mutable.add:
            run = self._mutable.add_run(ts, ls, es)
            if run is not None:  # the TimeBucket variant keeps rows until they are due
                self._queue.push(run)
        elif len(ts) < SMALL_RUN:
            direct = self._direct
            direct.ts.extend(ts.tolist())
            direct.ledgers.extend(ls.tolist())
            direct.entries.extend(es.tolist())
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
        return counted

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
        return np.where(after_key(floor, ledgers, entries, frontier), floor, ts).astype(_U64)


def _followed_by_expiry(entries: np.ndarray, expired: np.ndarray) -> np.ndarray:
    """The rows of one ledger's run that a later expired row of the same entry follows."""
    at = np.flatnonzero(expired)
    # The last expired row of each entry: unique over the reversed rows keeps the last.
    uniq, rev = np.unique(entries[at][::-1], return_index=True)
    last = at[::-1][rev]
    slot = np.minimum(np.searchsorted(uniq, entries), len(uniq) - 1)
    return ~expired & (uniq[slot] == entries) & (np.arange(len(entries)) < last[slot])
