"""A topic: one delayed index shared by its subscriptions (issue 25, ``docs/topics.md``).

A message is added to a topic once; each subscription delivers it on its own. The topic keeps
each row once, in the store's topic environment (:mod:`~bucketstore.engine.topics.topic_file`), in
delivery order (``rows``) and in acknowledgement order (``positions``); each subscription keeps
O(1) numbers plus its exceptions (:mod:`~bucketstore.engine.topics.subscription_state`). So disk and
memory grow with the messages, not with messages x subscriptions.

Every add goes to every subscription, exactly as if each had its own tracker and received the
add: a subscription that still tracks the position ignores it, one that delivered it tracks it
again, one that acknowledged it ignores it. An add of a row already due untracks the position
for all. A row leaves the topic once every subscription is past it (its frontier beyond it, or
its mark-delete); a stalled subscription holds the rows after its frontier.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lmdb
import numpy as np

from ...config import TrackerConfig
from ...cutoff import Clock, Cutoff, as_columns, check_position, check_timestamp
from ...errors import CatalogError, StoreClosedError
from ...format.topic_codec import (MAX_KEY, MULTI, TopicRecordError, decode_topic, encode_topic, multi_key,
                                  WINDOW_BITS, records_of, split_sub_key, sub_key, topic_prefix,
                                  validate_name)
from ...waiting import DueWaiter
from .subscription import Subscription
from .subscription_state import RowKey, SubscriptionState
from .topic_figures import due_rows, held_rows, visible
from .topic_file import TopicFile
from .topic_fresh import fresh_adds
from .topic_group_commit import JournaledAdds
from .topic_marks import tracked_in_range
from .topic_sealing import SealedRuns
from .topic_windows import Window, WindowCache, visible_indexes

__all__ = ["Topic", "START_MODES"]

START_MODES = ("earliest", "latest")


class Topic(JournaledAdds, SealedRuns):
    """One topic's shared index. Obtain it with :meth:`bucketstore.Store.topic`."""

    def __init__(self, file: TopicFile, name: str, config: TrackerConfig, clock: Clock | None, *,
                 durability: str, sync_interval_ms: int, confirm_sync_ms: int, delivery: str,
                 on_close: Any = None, store_id: str | None = None, journal_fds: Any = None) -> None:
        if config.precision_bits:
            raise ValueError("a topic keeps exact delivery times: precision_bits must be 0")
        self._file = file
        self.name = name
        self.config = config
        self._durability = durability
        self._sync_interval = sync_interval_ms
        self._confirm_sync = confirm_sync_ms
        self._at_most_once = delivery == "at-most-once"
        self._on_close = on_close
        self._lock = file.lock
        self._cond = threading.Condition(self._lock)
        self._due = DueWaiter(self._cond, clock)
        self._cutoff = Cutoff(config, clock)
        self.clock = clock  #: None: the system clock (the metrics judge "due" by it, as the topic does)
        self._closed = False
        self._last_sync = self._last_commit = time.monotonic()
        #: Whether a committed transaction wrote subscription state that is not synced yet.
        self._behind = False
        #: Subscriptions whose deliveries or confirmations are not written yet (see :meth:`_progress`).
        self._unsaved: set[str] = set()
        #: Adds answered and not yet written: (ledger, entry, deliver_at, the cutoff of their call).
        self._pending: list[tuple[int, int, int, int]] = []
        self._pending_limit = config.min_index_count_per_bucket  # journal mode: see _open_journal
        self._handles: dict[str, Subscription] = {}
        self._raw_name = raw_name = validate_name(name, "topic")
        self._config_record = {k: getattr(config, k) for k in config.__dataclass_fields__}
        with file.write() as txn:
            raw = txn.get(raw_name, db=file.topics)
            if raw is None:
                record = {"id": file.next_topic_id(txn), "next_seq": 0, "inserted": 0, "rows": 0, "cutoff": -1,
                          "config": {k: getattr(config, k) for k in config.__dataclass_fields__}}
                txn.put(raw_name, encode_topic(record), db=file.topics)
            else:
                record = self._decode(decode_topic, raw, f"topic {name!r}")
            self._id: int = record["id"]
            self._prefix = topic_prefix(self._id)
            self._windows = WindowCache(file.rows, self._id, file.windows)
            self._open_runs(txn, config)
            self._next_seq: int = record["next_seq"]
            self._inserted: int = record["inserted"]
            #: Rows the topic holds (kept with each change: stats never count them by a pass).
            self._rows: int = record["rows"]
            self._cutoff.raise_to(record["cutoff"])
            self._subs: dict[str, SubscriptionState] = {}
            self._states_read: dict[str, bytes] = {}
            with txn.cursor(db=file.subs) as cur:
                if cur.set_range(self._prefix):
                    for key, value in cur:
                        if not key.startswith(self._prefix):
                            break
                        _, sub_name = self._decode(split_sub_key, key, "subscription key")
                        self._subs[sub_name] = self._decode(lambda v: SubscriptionState.decode(sub_name, v), value,
                                                            f"subscription {sub_name!r}")
                        self._states_read[sub_name] = value  # as written: a journal replay needs it
            self._multi: set[tuple[int, int]] = set()
            with txn.cursor(db=file.multi) as cur:
                if cur.set_range(self._prefix):
                    for key in cur.iternext(values=False):
                        if not key.startswith(self._prefix):
                            break
                        _, ledger, entry = MULTI.unpack(key)
                        self._multi.add((ledger, entry))
            for state in self._subs.values():  # their unconfirmed batches became rows to redeliver
                txn.put(sub_key(self._id, state.name), state.encode(), db=file.subs)
            #: Every position with a row is at or before it: an add after it is of a new position
            #: (the common case, positions grow), found so without a lookup.
            self._last_position = self._view.last_position(txn, self._id) or (-1, -1)
            # So are the positions to deliver again (their rows may be gone): a re-add of one
            # must be judged against them (_add_one), never taken for a new position.
            again = [(r[1], r[2]) for state in self._subs.values() for r in state.redeliver]
            if again:
                self._last_position = max(self._last_position, max(again))
        file.sync()
        self._runs.remove_orphans()
        self._max_md = self._max_mark_delete()
        self._open_journal(durability, name, store_id, record.get("applied", 0), journal_fds)  # journal mode's adds
        file.add_settler(id(self), self._settle)

    @contextmanager
    def _write(self, room: int = 0, step: str = "topic_commit") -> Iterator[lmdb.Transaction]:
        """A write transaction of the topic's file. If it is undone, the window cache is
        emptied: it may hold windows read inside it (a collection reads what the adds before
        it in the same transaction wrote)."""
        try:
            with self._file.write(room, step) as txn:
                yield txn
        except BaseException:
            self._windows.clear()
            raise

    def _decode(self, decode: Any, raw: bytes, what: str) -> Any:
        try:
            return decode(raw)
        except TopicRecordError as exc:
            raise CatalogError(f"{self._file.path}: {what}: {exc}", path=self._file.path) from None

    # -- helpers --------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._closed:
            raise StoreClosedError(f"topic {self.name!r} is closed")

    def _max_mark_delete(self) -> tuple[int, int] | None:
        marks = [s.mark_delete for s in self._subs.values() if s.mark_delete is not None]
        return max(marks) if marks else None

    def _versions(self, txn: lmdb.Transaction, ledger: int, entry: int) -> list[tuple[int, int]]:
        """(seq, deliver_at) of every row of the position, oldest first."""
        return self._view.versions(txn, self._id, ledger, entry)

    def _insert(self, txn: lmdb.Transaction, ts: int, ledger: int, entry: int) -> int:
        seq = self._next_seq
        self._next_seq += 1
        self._file.tables.insert(txn, self._id, (ts, ledger, entry, seq))
        self._windows.invalidate(ts)
        self._rows += 1
        if (ledger, entry) > self._last_position:
            self._last_position = (ledger, entry)
        return seq

    def _delete_row(self, txn: lmdb.Transaction, ts: int, ledger: int, entry: int, seq: int,
                    dirty: set[str]) -> None:
        self._file.tables.delete(txn, self._id, (ts, ledger, entry, seq))
        self._windows.invalidate(ts)
        self._rows -= 1
        pos = (ledger, entry)
        if pos in self._multi and not self._versions(txn, ledger, entry):
            self._forget_multi(txn, pos, dirty)

    def _forget_multi(self, txn: lmdb.Transaction, pos: tuple[int, int], dirty: set[str]) -> None:
        """The position has no row left: its exceptions go with it."""
        self._multi.discard(pos)
        txn.delete(multi_key(self._id, *pos), db=self._file.multi)
        for s in self._subs.values():
            if s.lost.pop(pos, None) is not None:
                dirty.add(s.name)

    def _save(self, txn: lmdb.Transaction, dirty: set[str] | tuple[str, ...] = ()) -> None:
        record = {"id": self._id, "next_seq": self._next_seq, "inserted": self._inserted, "rows": self._rows,
                  "cutoff": self._cutoff.value, "config": self._config_record, "applied": self._applied}
        txn.put(self._raw_name, encode_topic(record), db=self._file.topics)
        # Every state not written yet goes with any transaction: one that deletes rows must
        # carry the frontiers that pass them.
        for name in self._unsaved.union(dirty):
            state = self._subs.get(name)
            if state is not None:
                txn.put(sub_key(self._id, name), state.encode(), db=self._file.subs)
                self._behind = True
        self._unsaved.clear()
        self._last_commit = time.monotonic()

    def _progress(self, state: SubscriptionState) -> None:
        """A delivery or confirmation moved the subscription (in memory): write it now, or with
        the first transaction once ``max(sync_interval_ms, confirm_sync_ms)`` has passed, as
        the tracker group-commits its frontier. A crash in between brings those batches back
        (at-least-once), never loses one: the rows stay until a written frontier passes them.
        At-most-once deliveries are written before the call returns."""
        self._unsaved.add(state.name)
        interval = max(self._sync_interval, self._confirm_sync)
        if self._at_most_once or interval == 0 or (time.monotonic() - self._last_commit) * 1000 >= interval:
            self._commit_progress()
            self._durable()

    def _commit_progress(self) -> None:
        """Write the subscriptions' progress not written yet, with the rows it lets go."""
        if not self._unsaved:
            return
        dirty: set[str] = set()
        with self._write() as txn:
            self._collect(txn, dirty)
            self._save(txn, dirty)

    def _durable(self) -> None:
        """After a committed delivery, confirmation or acknowledgement: sync when journal mode's
        ``confirm_sync_ms`` window says (a lost one brings batches back, never loses one).
        Sealed mode keeps no promise on delivery progress between flushes."""
        if self._durability == "journal":
            interval = max(self._sync_interval, self._confirm_sync)
            if interval == 0 or (time.monotonic() - self._last_sync) * 1000 >= interval:
                self._sync()

    def _sync(self) -> None:
        """Write the pending adds and progress and make everything committed durable."""
        self._apply()
        self._commit_progress()
        self._file.sync()
        self._runs.unlink_dropped()  # their deletion is durable now
        self._last_sync = time.monotonic()
        self._behind = False
        self._journal_synced()

    # -- adding ---------------------------------------------------------------------------------
    def _add_one(self, txn: lmdb.Transaction, ledger: int, entry: int, ts: int, cutoff: int,
                 dirty: set[str]) -> bool:
        """Add for every subscription; whether any subscription (or, with none, the topic) keeps it."""
        subs = self._subs
        pos = (ledger, entry)
        md = self._max_md
        fresh = md is None or pos > md
        if fresh and ts > cutoff and pos not in self._multi:
            newest = pos > self._last_position
            versions = [] if newest else self._versions(txn, ledger, entry)
            # The common case: a new position, tracked by every subscription. A position with no
            # row may still wait in a batch to deliver again (never past the last position).
            if not versions and (newest or not any(s.awaits(ledger, entry) for s in subs.values())):
                self._insert(txn, ts, ledger, entry)
                self._inserted += 1
                return True
        else:
            versions = self._versions(txn, ledger, entry)
        if ts <= cutoff:
            for s in subs.values():
                if s.expire_redelivery(ledger, entry):
                    dirty.add(s.name)
            if versions:  # due: untracked for every subscription that tracks it
                for s in subs.values():
                    if s.tracked_row(ledger, entry, versions) is not None:
                        s.count_base -= 1
                        dirty.add(s.name)
                for seq, vts in versions:
                    if not self._file.tables.delete(txn, self._id, (vts, ledger, entry, seq)):
                        self._kill(txn, ledger, entry, seq)
                    self._windows.invalidate(vts)
                    self._rows -= 1
                if pos in self._multi:
                    self._forget_multi(txn, pos, dirty)
            return False
        gaining = [s for s in subs.values() if not s.acked(ledger, entry)
                   and s.tracked_row(ledger, entry, versions) is None and not s.redelivers(ledger, entry)]
        if subs and not gaining:
            return any(not s.acked(ledger, entry) for s in subs.values())
        seq = self._insert(txn, ts, ledger, entry)
        for s in gaining:
            s.count_base += 1
            s.supersede(ledger, entry)
            dirty.add(s.name)
        # One that delivers the position again ignored the add: the new row is gone for it.
        waiting = [s for s in subs.values() if s.redelivers(ledger, entry)]
        for s in waiting:
            s.lost[pos] = seq
            dirty.add(s.name)
        if (versions or waiting) and pos not in self._multi:
            self._multi.add(pos)
            txn.put(multi_key(self._id, ledger, entry), b"", db=self._file.multi)
        return True

    def _add_rows(self, rows: list[tuple[int, int, int]], sub: SubscriptionState | None) -> list[bool]:
        """Answer the adds now; write them now or at the group commit (see :meth:`_apply`).

        The answers need no row: an add is kept unless it is due or acknowledged (by this
        subscription, or for the topic by all of them), whatever the rows hold.
        """
        with self._lock:
            self._check_alive()
            cutoff = self._cutoff.advance()
            subs = self._subs.values()
            md = self._max_md
            out = []
            pending = self._pending
            for ledger, entry, ts in rows:
                pending.append((ledger, entry, ts, cutoff))
                if ts <= cutoff:
                    out.append(False)
                    continue
                self._due.added(ts)
                if sub is not None:
                    out.append(not sub.acked(ledger, entry))
                else:
                    out.append(md is None or (ledger, entry) > md or any(not s.acked(ledger, entry) for s in subs))
            if self._journal is not None:
                self._journal_adds()  # its group commit, a seal's worth into a run
            elif len(self._pending) >= self._pending_limit:
                self._apply()
                if self._durability == "sealed":  # the seal's promise; journal mode syncs by its interval
                    self._sync()
            return out

    def _apply(self) -> None:
        """Write the adds answered but not yet written, in one transaction.

        Adds wait in memory: in ``journal`` mode, durable in the topic's journal from their group
        commit on (engine/topics/topic_group_commit.py), up to a seal's worth; in ``sealed`` mode
        (Pulsar's mutable bucket) durable at the "seal", every ``min_index_count_per_bucket``
        adds, or at ``flush``. Every other call writes them first, so it sees what was added before it.
        """
        pending = self._pending
        if not pending:
            return
        self._pending = []
        dirty: set[str] = set()
        # Counted as held by the index (``applied``) with the transaction that writes them.
        with self._applying(pending) as step, self._write(room=len(pending) * 200, step=step) as txn:
            start = 0
            while start < len(pending):
                start = self._append_new(txn, pending, start)
                if start < len(pending):
                    self._add_one(txn, *pending[start], dirty)
                    start += 1
            self._save(txn, dirty)
        self._maybe_seal()

    def _append_new(self, txn: lmdb.Transaction, pending: list[tuple[int, int, int, int]], start: int) -> int:
        """Write ``pending[start:]`` up to the first add that is not of a new position (the
        common case: positions grow, past every mark-delete, not due) in one call per table;
        the index of that add (``len(pending)``: all written). Such an add is tracked by every
        subscription: it bumps only the topic's ``inserted``."""
        n, ledgers, entries, times, last = fresh_adds(pending, start, self._last_position, self._max_md, self._multi)
        if n:
            if self._windows.holds_any():
                for window in np.unique(times >> np.uint64(WINDOW_BITS)).tolist():
                    self._windows.invalidate(window << WINDOW_BITS)
            if not self._seal_fresh(txn, times, ledgers, entries, self._next_seq):
                self._file.tables.insert_records(txn, *records_of(self._id, times, ledgers, entries, self._next_seq))
            self._next_seq, self._last_position = self._next_seq + n, last
            self._rows += n
            self._inserted += n
        return start + n

    def add_message(self, ledger_id: int, entry_id: int, deliver_at: int) -> bool:
        """Add an index for every subscription (once, whatever their number).

        :return: False when it is due already (dispatch it now) or every subscription has
            acknowledged it; True when some subscription tracks it (or, without any
            subscription, the topic keeps it for an ``earliest`` one).
        """
        check_position(ledger_id, entry_id)
        check_timestamp(deliver_at)
        return self._add_rows([(ledger_id, entry_id, deliver_at)], None)[0]

    def add_messages(self, indexes: Any) -> int:
        """Add a batch (columns or rows, as ``BucketTracker.add_messages``) in one transaction;
        how many :meth:`add_message` would have answered True for."""
        ledgers, entries, deliver_at = as_columns(indexes)
        return sum(self._add_rows(list(zip(ledgers.tolist(), entries.tolist(), deliver_at.tolist())), None))

    # -- subscriptions --------------------------------------------------------------------------
    def subscription(self, name: str, start: str = "earliest") -> Subscription:
        """Open (creating if needed) the subscription ``name``.

        :param start: for a new subscription, ``"earliest"``: it tracks every row the topic
            holds that is not due yet; ``"latest"``: only what is added from now on. Ignored
            when the subscription exists.
        """
        validate_name(name, "subscription")
        if start not in START_MODES:
            raise ValueError(f"start must be one of {START_MODES}, not {start!r}")
        with self._lock:
            self._check_alive()
            self._apply()
            live = self._handles.get(name)
            if live is not None:
                return live
            if name not in self._subs:
                self._create_subscription(name, start)
            handle = self._handles[name] = Subscription(self, self._subs[name])
            return handle

    def _create_subscription(self, name: str, start: str) -> None:
        cutoff = self._cutoff.advance()
        state = SubscriptionState(name=name, inserted_base=self._inserted)
        with self._write() as txn:
            if start == "latest":
                state.start_seq = self._next_seq
                state.frontier = (cutoff, *MAX_KEY[1:])
            else:
                state.frontier = (cutoff, *MAX_KEY[1:])
                state.count_base = self._count_tracked(txn, state)
            self._subs[name] = state
            self._save(txn, (name,))
        self._max_md = self._max_mark_delete()
        self._sync()

    def _count_tracked(self, txn: lmdb.Transaction, state: SubscriptionState) -> int:
        """How many positions the subscription tracks: one pass over the rows after its frontier."""
        return sum(len(idx) for _, idx, _ in self._visible_windows(txn, state, MAX_KEY))

    def subscriptions(self) -> list[str]:
        """The names of the topic's subscriptions, sorted."""
        with self._lock:
            self._check_alive()
            return sorted(self._subs)

    def delete_subscription(self, name: str) -> None:
        """Delete a subscription durably; the rows only it held leave the topic."""
        validate_name(name, "subscription")
        with self._lock:
            self._check_alive()
            self._apply()
            if name not in self._subs:
                raise KeyError(f"topic {self.name!r} has no subscription {name!r}")
            handle = self._handles.pop(name, None)
            if handle is not None:
                handle._closed = True
            del self._subs[name]
            self._max_md = self._max_mark_delete()
            dirty: set[str] = set()
            with self._write() as txn:
                txn.delete(sub_key(self._id, name), db=self._file.subs)
                self._collect(txn, dirty)
                self._save(txn, dirty)
            self._sync()
            self._cond.notify_all()

    def _handle_closed(self, handle: Any) -> None:
        if self._handles.get(handle.name) is handle:
            del self._handles[handle.name]

    # -- reading rows ---------------------------------------------------------------------------
    def _visible(self, txn: lmdb.Transaction, state: SubscriptionState, row: RowKey) -> bool:
        """Whether the row (after the subscription's frontier) is one it tracks."""
        return visible(txn, self._view, self._id, state, self._judged(), row)

    def _first_visible(self, state: SubscriptionState) -> RowKey | None:
        with self._file.read() as txn:
            for window, idx, _ in self._visible_windows(txn, state, MAX_KEY):
                if len(idx):
                    return window.row(int(idx[0]))
        return None

    def _visible_windows(self, txn: lmdb.Transaction, state: SubscriptionState,
                         upto: RowKey) -> Iterator[tuple[Window, np.ndarray, int]]:
        """The windows of rows after the subscription's frontier (as it is when called) up to
        ``upto``: each with the indexes of the rows the subscription tracks, and the index after
        the last row of it in range. Whole windows at a time (engine/topics/topic_windows.py); only
        positions with several rows, and the subscription's exceptions, are judged one by one."""
        judged = self._judged()
        special = judged | state.lost.keys() if judged or state.lost else frozenset()

        def judge(row: RowKey) -> bool:
            return self._visible(txn, state, row)
        for window, lo, hi in self._windows.scan(txn, state.frontier, upto):
            yield window, visible_indexes(window, lo, hi, state, special, judge), hi

    # -- delivery -------------------------------------------------------------------------------
    def _deliver(self, state: SubscriptionState, max_messages: int) -> list[tuple[int, int]]:
        cutoff = self._cutoff.advance()
        out: list[tuple[int, int]] = []
        delivered: list[RowKey] = []
        while state.redeliver and len(out) < max_messages:
            row = state.redeliver.pop(0)
            if not state.acked(row[1], row[2]):
                out.append((row[1], row[2]))
                delivered.append(row)
                state.count_base -= 1
        need = max_messages - len(out)
        taken: list[tuple[Window, np.ndarray]] = []
        if need > 0:
            # Walked even when nothing is tracked: passing the due rows that are not this
            # subscription's (acknowledged, cleared) lets the topic drop them.
            with self._file.read() as txn:
                for window, idx, hi in self._visible_windows(txn, state, (cutoff, *MAX_KEY[1:])):
                    full = len(idx) >= need
                    if full:
                        idx = idx[:need]
                    if len(idx):
                        taken.append((window, idx))
                        need -= len(idx)
                        if self._multi:
                            self._lose_delivered(state, window, idx)
                    if full:
                        state.frontier = window.row(int(idx[-1]))
                        break
                    state.frontier = window.row(hi - 1)
        if taken:
            # One (n, 4) array, written as is (see SubscriptionState), its columns viewed.
            block = np.concatenate([w.columns[i] for w, i in taken]) if len(taken) > 1 else \
                taken[0][0].columns[taken[0][1]]
            ledgers, entries = block[:, 1], block[:, 2]
            state.count_base -= len(block)
            if delivered:
                delivered.extend(map(tuple, block.tolist()))
            else:
                delivered = block  # type: ignore[assignment]
            if out:
                out.extend(zip(ledgers.tolist(), entries.tolist()))
                out.sort()
            else:
                order = np.lexsort((entries, ledgers))
                out = list(zip(ledgers[order].tolist(), entries[order].tolist()))
        else:
            out.sort()
        # The batches returned before are confirmed by this call (the delivery handoff).
        state.unconfirmed = [] if self._at_most_once else delivered
        self._progress(state)
        return out

    def _lose_delivered(self, state: SubscriptionState, window: Window, idx: np.ndarray) -> None:
        """The delivered rows of positions with several rows: their other rows are gone for
        the subscription. Set before the next window is judged (its rows may be another row of
        the same position; within a window the judge sees the rows delivered as its own)."""
        for pos in zip(window.ledger[idx].tolist(), window.entry[idx].tolist()):
            if pos in self._multi:
                state.lost[pos] = self._next_seq - 1

    def _collect(self, txn: lmdb.Transaction, dirty: set[str]) -> None:
        """Delete the rows every subscription is past: before every frontier, or acknowledged by all."""
        subs = list(self._subs.values())
        if not subs:
            return
        fronts = [s.frontier for s in subs]
        if all(f is not None for f in fronts):
            bound = min(fronts)  # type: ignore[type-var]
            self._drop_rows_upto(txn, bound, dirty)  # type: ignore[arg-type]
        marks = [s.mark_delete for s in subs]
        if all(m is not None for m in marks):
            self._drop_positions(txn, min(marks), dirty)  # type: ignore[type-var]
        if self._runs.runs:
            self._drop_runs(txn, min(fronts) if all(f is not None for f in fronts) else None,  # type: ignore[type-var]
                            min(marks) if all(m is not None for m in marks) else None, dirty)  # type: ignore[type-var]

    def _drop_positions(self, txn: lmdb.Transaction, upto: tuple[int, int], dirty: set[str]) -> None:
        doomed = []
        for row in self._file.tables.positions_after(txn, self._id, None):
            if (row[1], row[2]) > upto:
                break
            doomed.append(row)
        for row in doomed:
            self._delete_row(txn, *row, dirty)

    # -- acknowledgement, clear -----------------------------------------------------------------
    def _mark_delete(self, state: SubscriptionState, ledger: int, entry: int) -> None:
        md = state.mark_delete
        if md is not None and (ledger, entry) < md:
            return
        dirty = {state.name}
        with self._write() as txn:
            # Untrack what the subscription tracks up to the position: counted by columns.
            state.count_base -= tracked_in_range(txn, self._view, self._id, state, self._judged(), md,
                                                 (ledger, entry))
            kept = [r for r in state.redeliver if (r[1], r[2]) > (ledger, entry)]
            state.count_base -= len(state.redeliver) - len(kept)
            state.redeliver = kept
            # Acknowledged rows of the batch not confirmed yet must not come back at a restart.
            state.unconfirmed = [r for r in state.unconfirmed if (r[1], r[2]) > (ledger, entry)]
            state.lost = {p: s for p, s in state.lost.items() if p > (ledger, entry)}
            state.mark_delete = (ledger, entry)
            self._max_md = self._max_mark_delete()
            self._collect(txn, dirty)
            self._save(txn, dirty)
        self._durable()

    def _clear(self, state: SubscriptionState) -> None:
        state.clear_seq = self._next_seq - 1
        state.count_base = 0
        state.inserted_base = self._inserted
        state.lost = {}
        state.unconfirmed = []
        state.redeliver = []
        with self._write() as txn:
            self._save(txn, (state.name,))
        self._sync()
        self._due.wake_all()

    def _confirm(self, state: SubscriptionState) -> None:
        if not len(state.unconfirmed):
            return
        state.unconfirmed = []
        self._progress(state)

    def _contains(self, state: SubscriptionState, ledger: int, entry: int) -> bool:
        if any(r[1] == ledger and r[2] == entry for r in state.redeliver):
            return True
        with self._file.read() as txn:
            return state.tracked_row(ledger, entry, self._versions(txn, ledger, entry)) is not None

    def _last_time(self) -> int | None:
        with self._file.read() as txn:
            row = self._view.last_row(txn, self._id)
        return None if row is None else row[0]

    # -- lifecycle, figures ---------------------------------------------------------------------
    def flush(self) -> None:
        """Make everything added to the topic durable (each subscription's ``flush`` also
        confirms its deliveries)."""
        with self._lock:
            self._check_alive()
            self._sync()

    def close(self) -> None:
        """Close the topic and its subscriptions' handles; nothing is deleted."""
        with self._lock:
            if self._closed:
                return
            for handle in list(self._handles.values()):
                handle._closed = True
            self._handles.clear()
            try:
                self._apply()
                with self._write() as txn:
                    self._save(txn)
                self._sync()
                self._close_journal()
            finally:
                self._release_journal()
                self._closed = True
                self._file.add_settler(id(self), None)
                self._windows.clear()
                self._cond.notify_all()
        if self._on_close is not None:
            self._on_close(self)

    def __enter__(self) -> "Topic":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def held_rows(self, state: SubscriptionState) -> int:
        """Rows the topic keeps only because of this subscription: those after its frontier
        and at or before every other subscription's (it is the furthest behind)."""
        return self._held()[state.name]

    def _held(self) -> dict[str, int]:
        with self._file.read() as txn:
            return held_rows(txn, self._view, self._id, {n: s.frontier for n, s in self._subs.items()})

    def due_undelivered(self, state: SubscriptionState) -> int:
        """Rows due now that the subscription tracks and has not delivered."""
        with self._file.read() as txn:
            due = due_rows(txn, self._view, self._id, state, self._judged(), self._cutoff.value)[0]
        return due + len(state.redeliver)

    def stats(self) -> dict[str, Any]:
        """The topic's rows and, per subscription, its frontier, count and what it holds."""
        with self._lock:
            self._check_alive()
            self._apply()
            self._commit_progress()  # the rows every subscription has passed leave first
            held = self._held()  # one count for all of them, not one per subscription
            return {"topic": self.name, "rows": self._rows, "multi_positions": len(self._multi),
                    "cutoff": self._cutoff.value, "next_seq": self._next_seq,
                    "subscriptions": {name: self._sub_stats(state, held[name])
                                      for name, state in sorted(self._subs.items())}}

    def _sub_stats(self, state: SubscriptionState, held: int | None = None) -> dict[str, Any]:
        return {"number_of_delayed_messages": state.count(self._inserted),
                "frontier": list(state.frontier) if state.frontier else None,
                "mark_delete": list(state.mark_delete) if state.mark_delete else None,
                "held_rows": self.held_rows(state) if held is None else held,
                "due_undelivered": self.due_undelivered(state),
                "exceptions": len(state.lost), "unconfirmed": len(state.unconfirmed),
                "redeliver": len(state.redeliver)}
