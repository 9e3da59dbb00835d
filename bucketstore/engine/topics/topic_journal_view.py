"""A topic as its writer's next open would have it, read without changing anything: the index
with the adds its journal holds beyond ``applied`` folded in (``docs/topics.md``, "The topic
journal"). What a reader in another process sees of a journal-mode topic: ``stats``, ``catalog``,
the Prometheus export, a read-only open and the Spark reader.

In journal mode up to a seal's worth of acknowledged adds (8,192) wait in the journal only. A
reader folds them into what it reads by the writer's own rules, the open's replay
(:mod:`~.topic_group_commit`): each add numbered from ``applied`` on, once, with its call's
cutoff, judged by :meth:`Topic._add_one` against the subscriptions as written (an unconfirmed
batch still that), which then restart as an open restarts them. The rows it adds or removes live
in memory only, over the read transaction's rows (:class:`FoldedRows`).

Beside a live writer, the journals are read before the read transaction begins: a checkpoint
deletes a journal's adds only once the synced index holds them, so every add the journals read
lack, the later transaction holds; the adds both hold are skipped by ``applied``. A torn last
group is left out (the writer may be writing it), as the next open cuts it.
"""

from __future__ import annotations

import bisect
import heapq
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import lmdb

from ...errors import JournalError
from .subscription_state import RowKey, SubscriptionState
from .topic import Topic
from .topic_group_commit import state_as_written
from .topic_journal import adds_after, journal_root, read_topic_journal, topic_journal_directory
from .topic_levels import RowView

__all__ = ["JournalSnapshot", "FoldedRows", "FoldedTopic", "fold_journal"]

Position = tuple[int, int]


class JournalSnapshot:
    """Every topic's journal records, read once (before the read transaction: see the module).
    A journal that cannot be read is an error of its topic alone, raised when that topic is read."""

    def __init__(self, topics_path: str) -> None:
        self.topics_path = topics_path
        root = journal_root(topics_path)
        names = sorted(os.listdir(root)) if os.path.isdir(root) else []
        self._records: dict[int, list[tuple] | JournalError] = {}
        for name in names:
            if name.isdigit():
                try:
                    self._records[int(name)] = read_topic_journal(topics_path, int(name))
                except JournalError as exc:
                    self._records[int(name)] = exc

    def adds(self, topic_id: int, applied: int) -> list[tuple[int, int, int, int]]:
        """The topic's journaled adds its index does not hold (numbered ``applied`` and on).

        :raises JournalError: its journal is damaged, or lacks adds after the index's.
        """
        records = self._records.get(topic_id)
        if isinstance(records, JournalError):
            raise records
        if not records:
            return []
        return adds_after(records, applied, topic_journal_directory(self.topics_path, topic_id))


class FoldedRows:
    """The reads of :class:`~.topic_levels.RowView` a reader makes (``versions``, ``rows_after``,
    ``count_between``, ``first_position``) over a topic's rows with rows added (``added``) and
    removed (``removed``) in memory: the adds of the journal folded in."""

    def __init__(self, base: RowView) -> None:
        self.base = base
        self.tables, self.runs, self.dead = base.tables, base.runs, base.dead
        self._mine: dict[Position, list[RowKey]] = {}  # the rows added, by position
        self._sorted: list[RowKey] | None = []
        self.removed: set[RowKey] = set()

    @property
    def added(self) -> list[RowKey]:
        """The rows added, in delivery order (sorted once the fold's adds are in)."""
        if self._sorted is None:
            self._sorted = sorted(row for rows in self._mine.values() for row in rows)
        return self._sorted

    # The writes of a fold (:class:`_Fold` passes this as the topic's tables).
    def insert(self, txn: Any, tid: int, row: RowKey) -> None:
        self._mine.setdefault((row[1], row[2]), []).append(row)
        self._sorted = None

    def delete(self, txn: Any, tid: int, row: RowKey) -> bool:
        mine = self._mine.get((row[1], row[2]), [])
        if row in mine:
            mine.remove(row)
            self._sorted = None
        else:
            self.removed.add(row)
        return True

    def _added_between(self, after: RowKey | None, upto: RowKey | None) -> list[RowKey]:
        lo = 0 if after is None else bisect.bisect_right(self.added, after)
        hi = len(self.added) if upto is None else bisect.bisect_right(self.added, upto)
        return self.added[lo:hi]

    def versions(self, txn: lmdb.Transaction, tid: int, ledger: int, entry: int) -> list[tuple[int, int]]:
        out = [(seq, ts) for seq, ts in self.base.versions(txn, tid, ledger, entry)
               if (ts, ledger, entry, seq) not in self.removed]
        out += [(r[3], r[0]) for r in self._mine.get((ledger, entry), ())]
        return sorted(out)

    def rows_after(self, txn: lmdb.Transaction, tid: int, after: RowKey | None) -> Iterator[RowKey]:
        base = self.base.rows_after(txn, tid, after)
        if self.removed:
            base = (row for row in base if row not in self.removed)
        return heapq.merge(base, self._added_between(after, None)) if self.added else base

    def count_between(self, txn: lmdb.Transaction, tid: int, after: RowKey | None, upto: RowKey | None) -> int:
        n = self.base.count_between(txn, tid, after, upto) + len(self._added_between(after, upto))
        return n - sum(1 for row in self.removed if (after is None or row > after) and (upto is None or row <= upto))

    def first_position(self, txn: lmdb.Transaction, tid: int) -> Position | None:
        """The least position with a row, or one before it (as :meth:`RowView.first_position`)."""
        found = [p for p in (self.base.first_position(txn, tid),) if p is not None]
        found += [pos for pos, rows in self._mine.items() if rows]
        return min(found) if found else None


class _NoWindows:
    def invalidate(self, ts: int) -> None:
        pass


class _Memory:
    """The transaction a fold runs in: it reads through the read transaction and writes nothing
    (rows go to :class:`FoldedRows`, the positions with several rows to the fold's set)."""

    def __init__(self, txn: lmdb.Transaction) -> None:
        self.cursor, self.get = txn.cursor, txn.get

    def put(self, *args: Any, **kwargs: Any) -> None:
        pass

    def delete(self, *args: Any, **kwargs: Any) -> None:
        pass


class _File:
    def __init__(self, rows: FoldedRows) -> None:
        self.tables, self.multi = rows, None


class _Fold:
    """What :meth:`Topic._add_one` reads and changes of a topic, in memory: the writer's rules of
    an add, run against a reader's view."""

    _add_one = Topic._add_one
    _insert = Topic._insert
    _forget_multi = Topic._forget_multi
    _versions = Topic._versions
    _max_mark_delete = Topic._max_mark_delete

    def __init__(self, tid: int, record: Mapping[str, Any], rows: FoldedRows, subs: dict[str, SubscriptionState],
                 multi: set[Position], last_position: Position) -> None:
        self._id, self._view, self._file, self._windows = tid, rows, _File(rows), _NoWindows()
        self._subs, self._multi, self._last_position = subs, multi, last_position
        self._next_seq, self._inserted, self._rows = record["next_seq"], record["inserted"], record["rows"]
        self._max_md = self._max_mark_delete()


@dataclass
class FoldedTopic:
    """A topic's record, subscriptions, rows and positions with several rows, the journal's adds in."""

    record: dict[str, Any]
    subs: dict[str, SubscriptionState]
    rows: RowView | FoldedRows
    multi: set[Position]


def fold_journal(txn: lmdb.Transaction, view: RowView, record: dict[str, Any], raw_subs: Mapping[str, bytes],
                 multi: set[Position], journal: JournalSnapshot | None) -> FoldedTopic:
    """The topic as read (``view``, its subscriptions' records as written, its positions with
    several rows), with its journal's adds beyond ``applied`` applied as the writer's open
    applies them.

    :raises JournalError: the journal is damaged, or lacks adds after the index's.
    """
    tid = record["id"]
    subs = {name: SubscriptionState.decode(name, raw) for name, raw in raw_subs.items()}
    adds = journal.adds(tid, record.get("applied", 0)) if journal is not None else []
    if not adds:
        return FoldedTopic(record, subs, view, multi)
    rows = FoldedRows(view)
    # As the open: the positions to deliver again count as positions seen (their rows may be gone).
    last = view.last_position(txn, tid) or (-1, -1)
    again = [(r[1], r[2]) for state in subs.values() for r in state.redeliver]
    if again:
        last = max(last, max(again))
    # The adds judged against the subscriptions as written, then restarted (_replay_before_restart).
    fold = _Fold(tid, record, rows, {name: state_as_written(name, raw) for name, raw in raw_subs.items()},
                 set(multi), last)
    dirty: set[str] = set()
    memory = _Memory(txn)
    for ledger, entry, ts, cutoff in adds:
        fold._add_one(memory, ledger, entry, ts, cutoff, dirty)
    folded = {**record, "next_seq": fold._next_seq, "inserted": fold._inserted, "rows": fold._rows,
              "cutoff": max(record["cutoff"], max(r[3] for r in adds)),
              "applied": record.get("applied", 0) + len(adds)}
    subs = {name: SubscriptionState.decode(name, state.encode()) for name, state in fold._subs.items()}
    return FoldedTopic(folded, subs, rows, fold._multi)
