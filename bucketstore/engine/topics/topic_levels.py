"""A topic's rows as one set: its LMDB level (:class:`~.topic_rows.RowTables`) and its sealed runs
(:class:`~.topic_runs.RunSet`), less the run rows gone since they were sealed (``dead``).

:class:`RowView` answers the reads of :class:`~.topic_rows.RowTables` (``versions``,
``rows_after``, ``count_between``, ``positions_after``, ``first_position``, ``last_position``,
``last_row``) over both, so that the topic, its figures and the offline reader judge a row the
same wherever it lives. Writes go to the level (rows) or the runs' catalog (seals, drops, dead).

A row in a run cannot be deleted; when one must go before its run does (an add of its position
that is already due), the position's ``dead`` bound records it: every run row of the position
with a seq at or below it is gone, for every subscription.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping

import lmdb

from .subscription_state import RowKey
from .topic_rows import RowTables
from .topic_runs import RunSet

__all__ = ["RowView"]

Position = tuple[int, int]


class RowView:
    """Reads over a topic's level and runs (``runs`` None: a level alone)."""

    def __init__(self, tables: RowTables, runs: RunSet | None, dead: Mapping[Position, int]) -> None:
        self.tables = tables
        self.runs = runs
        self.dead = dead

    def _sealed(self) -> RunSet | None:
        runs = self.runs
        return runs if runs is not None and runs.runs else None

    def _alive(self, row: RowKey) -> bool:
        dead = self.dead
        return not dead or row[3] > dead.get((row[1], row[2]), -1)

    def versions(self, txn: lmdb.Transaction, tid: int, ledger: int, entry: int) -> list[tuple[int, int]]:
        """(seq, deliver_at) of every row of the position, oldest first."""
        out = self.tables.versions(txn, tid, ledger, entry)
        runs = self._sealed()
        if runs is not None:
            bound = self.dead.get((ledger, entry), -1)
            sealed = [(seq, ts) for seq, ts, _ in runs.versions(ledger, entry) if seq > bound]
            if sealed:
                out = sorted(out + sealed)
        return out

    def rows_after(self, txn: lmdb.Transaction, tid: int, after: RowKey | None) -> Iterator[RowKey]:
        runs = self._sealed()
        if runs is None:
            return self.tables.rows_after(txn, tid, after)
        merged = heapq.merge(self.tables.rows_after(txn, tid, after), runs.rows_after(after))
        return (row for row in merged if self._alive(row)) if self.dead else merged

    def count_between(self, txn: lmdb.Transaction, tid: int, after: RowKey | None, upto: RowKey | None) -> int:
        n = self.tables.count_between(txn, tid, after, upto)
        runs = self._sealed()
        if runs is not None:
            n += runs.count_between(after, upto)
            for (ledger, entry), bound in self.dead.items():  # few: rows gone from their runs
                for seq, ts, _ in runs.versions(ledger, entry):
                    row = (ts, ledger, entry, seq)
                    if seq <= bound and (after is None or row > after) and (upto is None or row <= upto):
                        n -= 1
        return n

    def positions_after(self, txn: lmdb.Transaction, tid: int, after: Position | None,
                        upto: Position | None = None) -> Iterator[RowKey]:
        """The rows whose position is after ``after`` (all when None), in acknowledgement order;
        ``upto``: the caller stops past it, so runs wholly past it are not read."""
        runs = self._sealed()
        if runs is None:
            return self.tables.positions_after(txn, tid, after)

        def order(row: RowKey) -> tuple[int, int, int]:
            return row[1], row[2], row[3]
        merged = heapq.merge(self.tables.positions_after(txn, tid, after), runs.positions_after(after, upto),
                             key=order)
        return (row for row in merged if self._alive(row)) if self.dead else merged

    def first_position(self, txn: lmdb.Transaction, tid: int) -> Position | None:
        """The least position with a row (a run's least may be a row gone since: never later)."""
        found = [p for p in (self.tables.first_position(txn, tid),) if p is not None]
        runs = self._sealed()
        if runs is not None:
            found.extend(run.min_pos for run in runs.runs.values())
        return min(found) if found else None

    def last_position(self, txn: lmdb.Transaction, tid: int) -> Position | None:
        """The greatest position with a row, or one after it (a row of a run gone since)."""
        found = [p for p in (self.tables.last_position(txn, tid),) if p is not None]
        runs = self._sealed()
        if runs is not None:
            found.extend(run.max_pos for run in runs.runs.values())
        return max(found) if found else None

    def last_row(self, txn: lmdb.Transaction, tid: int) -> RowKey | None:
        """The last row in delivery order that is not gone."""
        best = self.tables.last_row(txn, tid)
        runs = self._sealed()
        if runs is None:
            return best
        for run in runs.runs.values():
            if best is not None and run.last <= best:
                continue
            if self._alive(run.last):
                best = run.last
                continue
            for row in reversed(runs.rows_of(run).tolist()):  # its last rows are gone: rare
                row = tuple(row)
                if best is not None and row <= best:
                    break
                if self._alive(row):
                    best = row
                    break
        return best
