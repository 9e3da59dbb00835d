"""A topic's rows in its two LMDB tables, ``rows`` (delivery order) and ``positions``
(acknowledgement order): every read and write of them but the window reads of a delivery
(:mod:`~bucketstore.engine.topics.topic_windows`), and nothing else (``formats/topics.md``).

Both tables are ``MDB_DUPSORT | MDB_DUPFIXED``: a key holds many fixed-size values, which LMDB
packs without a per-row header. ``rows`` keys a topic's rows by ``deliver_at >> 12`` (4.096 s
windows), each value the rest of the key in order; ``positions`` keys them by ledger. So a row
costs its 26 + 24 bytes, not two B-tree nodes of their own.
"""

from __future__ import annotations

from collections.abc import Iterator

import lmdb

from ...format.topic_codec import (POS_DUP, POS_KEY, ROW_KEY, position_parts, row_from, row_parts, split_position,
                                  topic_prefix)

__all__ = ["RowTables"]

Row = tuple[int, int, int, int]  # deliver_at, ledger, entry, seq
_MAX = (1 << 64) - 1


def _seek_after(cur: lmdb.Cursor, tid: int, after: Row | None) -> bool:
    """Put ``cur`` (on ``rows``) on the first row after ``after`` (the topic's first when None),
    or on the next topic's first record; False when the table ends before."""
    if after is None:
        return cur.set_range(topic_prefix(tid))
    key, dup = row_parts(tid, *after)
    if cur.set_range_dup(key, dup):
        return cur.next() if cur.value() == dup else True
    return cur.set_range(key + b"\x00")


class RowTables:
    """The ``rows`` and ``positions`` tables of one environment (handles opened by ``TopicFile``)."""

    def __init__(self, rows: object, positions: object) -> None:
        self.rows = rows
        self.positions = positions

    # -- writes ---------------------------------------------------------------------------------
    def insert(self, txn: lmdb.Transaction, tid: int, row: Row) -> None:
        txn.put(*row_parts(tid, *row), db=self.rows)
        key, value = position_parts(tid, *row)
        # Positions mostly grow: appended, a page fills up instead of splitting in half.
        if not txn.put(key, value, append=True, db=self.positions):
            txn.put(key, value, db=self.positions)

    def insert_records(self, txn: lmdb.Transaction, rows: list[tuple[bytes, bytes]],
                       positions: list[tuple[bytes, bytes]]) -> None:
        """Insert rows given by their records in both tables (``row_parts``/``position_parts``),
        one call per table."""
        with txn.cursor(db=self.rows) as cur:
            cur.putmulti(rows, dupdata=True)
        with txn.cursor(db=self.positions) as cur:
            # Positions mostly grow: appended, pages fill up instead of splitting in half (a
            # quarter fewer bytes a row). LMDB refuses (and skips) a record that is not at the
            # end; put those normally (putting a present record again changes nothing).
            if cur.putmulti(positions, dupdata=True, append=True)[1] < len(positions):
                cur.putmulti(positions, dupdata=True)

    def delete(self, txn: lmdb.Transaction, tid: int, row: Row) -> None:
        txn.delete(*row_parts(tid, *row), db=self.rows)
        txn.delete(*position_parts(tid, *row), db=self.positions)

    def delete_records(self, txn: lmdb.Transaction, rows: list[tuple[bytes, bytes]],
                       positions: list[tuple[bytes, bytes]], whole_key: bytes | None = None) -> None:
        """Delete rows given by their records in both tables (:class:`~.topic_windows.Window`
        builds them for a window at once). ``whole_key``: the rows are every value of that
        ``rows`` key, deleted in one call (``rows`` is then ignored)."""
        if whole_key is not None:
            txn.delete(whole_key, db=self.rows)  # no value given: the key with all its values
        else:
            for key, value in rows:
                txn.delete(key, value, db=self.rows)
        for key, value in positions:
            txn.delete(key, value, db=self.positions)

    def delete_topic(self, txn: lmdb.Transaction, tid: int) -> None:
        prefix = topic_prefix(tid)
        for db in (self.rows, self.positions):
            with txn.cursor(db=db) as cur:
                if cur.set_range(prefix):
                    while cur.key()[:4] == prefix:
                        if not cur.delete(dupdata=True):
                            break

    # -- reads ----------------------------------------------------------------------------------
    def versions(self, txn: lmdb.Transaction, tid: int, ledger: int, entry: int) -> list[tuple[int, int]]:
        """(seq, deliver_at) of every row of the position, oldest first."""
        out = []
        key = POS_KEY.pack(tid, ledger)
        with txn.cursor(db=self.positions) as cur:
            if cur.set_range_dup(key, POS_DUP.pack(entry, 0, 0)):
                for value in cur.iternext_dup(keys=False):
                    en, seq, ts = POS_DUP.unpack(value)
                    if en != entry:
                        break
                    out.append((seq, ts))
        return out

    def rows_after(self, txn: lmdb.Transaction, tid: int, after: Row | None) -> Iterator[Row]:
        """The topic's rows after ``after`` (from its first when None), in delivery order."""
        prefix = topic_prefix(tid)
        with txn.cursor(db=self.rows) as cur:
            if not _seek_after(cur, tid, after):
                return
            for key, value in cur.iternext():
                if key[:4] != prefix:
                    return
                yield row_from(key, value)

    def count_between(self, txn: lmdb.Transaction, tid: int, after: Row | None, upto: Row | None) -> int:
        """How many of the topic's rows lie after ``after`` and at or before ``upto`` (None: no
        bound), in delivery order.

        A window (one ``rows`` key) wholly inside the range counts by its number of values,
        which LMDB keeps with the key; only the windows holding a bound are read row by row.
        So the cost grows with the windows of the range, not with its rows.
        """
        if after is not None and upto is not None and upto <= after:
            return 0
        prefix = topic_prefix(tid)
        low = None if after is None else row_parts(tid, *after)[0]
        high, high_dup = (None, None) if upto is None else row_parts(tid, *upto)
        n = 0
        with txn.cursor(db=self.rows) as cur:
            found = _seek_after(cur, tid, after)
            while found:
                key = cur.key()
                if key[:4] != prefix or (high is not None and key > high):
                    break
                if key != low and key != high:  # at its first value: the whole window is inside
                    n += cur.count()
                    found = cur.next_nodup()
                    continue
                if key == high and cur.value() > high_dup:  # type: ignore[operator]
                    break
                n += 1
                found = cur.next()
        return n

    def positions_from(self, txn: lmdb.Transaction, tid: int, ledger: int, entry: int) -> Iterator[Row]:
        """The topic's rows at or after position (ledger, entry), in acknowledgement order."""
        prefix = topic_prefix(tid)
        key = POS_KEY.pack(tid, ledger)
        with txn.cursor(db=self.positions) as cur:
            if not (cur.set_range_dup(key, POS_DUP.pack(entry, 0, 0)) or cur.set_range(key + b"\x00")):
                return
            for key, value in cur.iternext():
                if key[:4] != prefix:
                    return
                lg = POS_KEY.unpack(key)[1]
                en, seq, ts = POS_DUP.unpack(value)
                yield ts, lg, en, seq

    def positions_after(self, txn: lmdb.Transaction, tid: int, after: tuple[int, int] | None) -> Iterator[Row]:
        """The rows whose position is after ``after`` (all when None), in acknowledgement order."""
        if after is None:
            return self.positions_from(txn, tid, 0, 0)
        ledger, entry = after
        if entry < _MAX:
            return self.positions_from(txn, tid, ledger, entry + 1)
        if ledger < _MAX:
            return self.positions_from(txn, tid, ledger + 1, 0)
        return iter(())

    def _last(self, txn: lmdb.Transaction, db: object, tid: int) -> tuple[bytes, bytes] | None:
        with txn.cursor(db=db) as cur:
            after = tid < 0xFFFFFFFF and cur.set_range(topic_prefix(tid + 1))
            found = cur.prev() if after else cur.last()
            if not found or cur.key()[:4] != topic_prefix(tid):
                return None
            return cur.key(), cur.value()

    def last_row(self, txn: lmdb.Transaction, tid: int) -> Row | None:
        """The topic's last row in delivery order (the latest deliver_at), or None."""
        found = self._last(txn, self.rows, tid)
        return None if found is None else row_from(*found)

    def first_position(self, txn: lmdb.Transaction, tid: int) -> tuple[int, int] | None:
        """The least position with a row, or None."""
        with txn.cursor(db=self.positions) as cur:
            if not cur.set_range(topic_prefix(tid)) or cur.key()[:4] != topic_prefix(tid):
                return None
            return POS_KEY.unpack(cur.key())[1], POS_DUP.unpack(cur.value())[0]

    def last_position(self, txn: lmdb.Transaction, tid: int) -> tuple[int, int] | None:
        """The greatest position with a row, or None."""
        found = self._last(txn, self.positions, tid)
        if found is None:
            return None
        return POS_KEY.unpack(found[0])[1], POS_DUP.unpack(found[1])[0]

    def count(self, txn: lmdb.Transaction, tid: int) -> int:
        return sum(1 for _ in self.rows_after(txn, tid, None))

    # -- whole tables, for the checks -----------------------------------------------------------
    def all_rows(self, txn: lmdb.Transaction) -> Iterator[tuple[int, Row]]:
        """(topic id, row) of every row of every topic; undecodable records raise TopicRecordError."""
        with txn.cursor(db=self.rows) as cur:
            for key, value in cur.iternext():
                yield ROW_KEY.unpack(key)[0] if len(key) == ROW_KEY.size else -1, row_from(key, value)

    def all_positions(self, txn: lmdb.Transaction) -> Iterator[tuple[int, Row]]:
        with txn.cursor(db=self.positions) as cur:
            for key, value in cur.iternext():
                tid, ledger, entry, seq, ts = split_position(key, value)
                yield tid, (ts, ledger, entry, seq)
