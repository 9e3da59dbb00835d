"""A topic's ``rows`` table read a window at a time as numpy columns: the delivery's hot path
(``docs/topics.md``, "Delivery").

A ``rows`` key holds a 4.096 s window of a topic's rows as ``MDB_DUPFIXED`` values, so one
``MDB_GET_MULTIPLE`` read (py-lmdb's ``Cursor.getmulti(..., dupfixed_bytes=...)``) copies a
whole window out in one call, key and value of each row side by side at a fixed width. Those
bytes sort as the rows do (big-endian integers), so the bounds of a delivery (after the
frontier, up to the cutoff) are two binary searches on them, and the columns decode at once.

Decoded windows are cached and shared by a topic's subscriptions, which all read the same
windows as they keep up: a hundred subscriptions decode a window once, not a hundred times.
A write to a window drops it from the cache (:meth:`WindowCache.invalidate`); the store's topics
share one budget (:class:`WindowBudget`, ``DEFAULT_BUDGET`` bytes), least recently used out first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import lmdb
import numpy as np

from ...format.topic_codec import POS_DUP, POS_KEY, ROW_DUP, ROW_KEY, WINDOW_BITS, topic_prefix
from .subscription_state import RowKey, SubscriptionState

__all__ = ["Window", "WindowCache", "WindowBudget", "visible_indexes", "DEFAULT_BUDGET"]

_ITEM = np.dtype([("tid", ">u4"), ("win", ">u8"), ("lo", ">u2"), ("ledger", ">u8"), ("entry", ">u8"),
                  ("seq", ">u8")])
_WIDTH = ROW_KEY.size + ROW_DUP.size
assert _ITEM.itemsize == _WIDTH
_POSITION = np.dtype([("tid", ">u4"), ("ledger", ">u8"), ("entry", ">u8"), ("seq", ">u8"), ("ts", ">u8")])
assert _POSITION.itemsize == POS_KEY.size + POS_DUP.size
_MAX = (1 << 64) - 1
_LOW_MASK = (1 << WINDOW_BITS) - 1
#: Bytes of decoded windows a store's topics keep in all (70 bytes a row: 38 raw, 32 as columns;
#: 32 MB is about 480,000 rows, some 115 windows of 4,096 rows).
DEFAULT_BUDGET = 32 << 20


def _packed(tid: int, row: RowKey) -> bytes:
    ts, ledger, entry, seq = row
    return ROW_KEY.pack(tid, ts >> WINDOW_BITS) + ROW_DUP.pack(ts & _LOW_MASK, ledger, entry, seq)


@dataclass(frozen=True)
class Window:
    """One window's rows in delivery order: the raw sortable keys and the decoded columns."""

    raw: bytes  # each row as its key and value side by side, 38 bytes
    keys: np.ndarray  # the same as S38, to search (sorted: big-endian numbers)
    columns: np.ndarray  # (n, 4) uint64: deliver_at, ledger, entry, seq

    @classmethod
    def decode(cls, raw: bytes) -> "Window":
        items = np.frombuffer(raw, dtype=_ITEM)
        columns = np.empty((len(items), 4), dtype=np.uint64)
        columns[:, 0] = (items["win"].astype(np.uint64) << np.uint64(WINDOW_BITS)) | items["lo"]
        columns[:, 1], columns[:, 2], columns[:, 3] = items["ledger"], items["entry"], items["seq"]
        return cls(raw, np.frombuffer(raw, dtype=f"S{_WIDTH}"), columns)

    @property
    def ts(self) -> np.ndarray:
        return self.columns[:, 0]

    @property
    def ledger(self) -> np.ndarray:
        return self.columns[:, 1]

    @property
    def entry(self) -> np.ndarray:
        return self.columns[:, 2]

    @property
    def seq(self) -> np.ndarray:
        return self.columns[:, 3]

    @property
    def nbytes(self) -> int:
        return len(self.keys) * (_WIDTH + 32)

    def position_records(self, hi: int) -> list[tuple[bytes, bytes]]:
        """The ``positions`` key and value of the rows ``:hi`` (to delete them)."""
        items = np.empty(hi, dtype=_POSITION)
        items["tid"], items["ledger"], items["entry"] = self.tid, self.ledger[:hi], self.entry[:hi]
        items["seq"], items["ts"] = self.seq[:hi], self.ts[:hi]
        raw = items.tobytes()
        k, w = POS_KEY.size, _POSITION.itemsize
        return [(raw[i:i + k], raw[i + k:i + w]) for i in range(0, len(raw), w)]

    def row_records(self, hi: int) -> list[tuple[bytes, bytes]]:
        """The ``rows`` key and value of the rows ``:hi``."""
        raw, k = self.raw, ROW_KEY.size
        return [(raw[i:i + k], raw[i + k:i + _WIDTH]) for i in range(0, hi * _WIDTH, _WIDTH)]

    @property
    def tid(self) -> int:
        return int.from_bytes(self.raw[:4], "big")

    def row(self, i: int) -> RowKey:
        return int(self.ts[i]), int(self.ledger[i]), int(self.entry[i]), int(self.seq[i])


class WindowBudget:
    """The decoded windows of every topic of one environment, under one budget in bytes:
    least recently used out first. (Shared so that a store's memory for them is bounded
    whatever its number of topics; an idle topic's windows go first.)"""

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = budget
        self.held = 0
        self.windows: OrderedDict[tuple[int, int], Window] = OrderedDict()

    def get(self, key: tuple[int, int]) -> Window | None:
        found = self.windows.get(key)
        if found is not None:
            self.windows.move_to_end(key)
        return found

    def put(self, key: tuple[int, int], window: Window) -> None:
        self.drop(key)
        self.windows[key] = window
        self.held += window.nbytes
        while self.held > self.budget and len(self.windows) > 1:
            self.held -= self.windows.popitem(last=False)[1].nbytes

    def drop(self, key: tuple[int, int]) -> None:
        gone = self.windows.pop(key, None)
        if gone is not None:
            self.held -= gone.nbytes


class WindowCache:
    """The decoded windows of one topic (``tid``) in the ``rows`` table ``db``, kept in the
    environment's shared :class:`WindowBudget`."""

    def __init__(self, db: object, tid: int, shared: WindowBudget) -> None:
        self._db = db
        self._tid = tid
        self._prefix = topic_prefix(tid)
        self._shared = shared

    def invalidate(self, ts: int) -> None:
        """A row at ``ts`` is being written or deleted: its window is read again next time."""
        self._shared.drop((self._tid, ts >> WINDOW_BITS))

    def holds_any(self) -> bool:
        """Whether any window may be cached (of any topic: a cheap test before invalidating)."""
        return bool(self._shared.windows)

    def clear(self) -> None:
        """Forget this topic's windows."""
        for key in [k for k in self._shared.windows if k[0] == self._tid]:
            self._shared.drop(key)

    def _window(self, txn: lmdb.Transaction, key: bytes, number: int) -> Window:
        found = self._shared.get((self._tid, number))
        if found is not None:
            return found
        with txn.cursor(db=self._db) as cur:
            raw = cur.getmulti([key], dupdata=True, dupfixed_bytes=ROW_DUP.size, keyfixed=True)
        window = Window.decode(bytes(raw))
        self._shared.put((self._tid, number), window)
        return window

    def scan(self, txn: lmdb.Transaction, after: RowKey | None,
             upto: RowKey) -> Iterator[tuple[Window, int, int]]:
        """The topic's rows after ``after`` (from the first when None) and at or before ``upto``,
        as ``(window, lo, hi)``: the rows ``lo:hi`` of each window, in order. The caller may
        delete the rows of a window it was given before taking the next."""
        tid = self._tid
        last = upto[0] >> WINDOW_BITS
        first = 0 if after is None else after[0] >> WINDOW_BITS
        with txn.cursor(db=self._db) as cur:
            found = cur.set_range(ROW_KEY.pack(tid, first))
            while found:
                key = cur.key()
                if key[:4] != self._prefix:
                    return
                number = ROW_KEY.unpack(key)[1]
                if number > last:
                    return
                window = self._window(txn, key, number)
                lo = 0
                if after is not None and number == first:
                    lo = int(np.searchsorted(window.keys, _packed(tid, after), side="right"))
                hi = len(window.keys)
                if number == last:
                    hi = int(np.searchsorted(window.keys, _packed(tid, upto), side="right"))
                if lo < hi:
                    yield window, lo, hi
                found = number < _MAX >> WINDOW_BITS and cur.set_range(ROW_KEY.pack(tid, number + 1))


def visible_indexes(window: Window, lo: int, hi: int, state: SubscriptionState,
                    special: Collection[tuple[int, int]], judge: Callable[[RowKey], bool]) -> np.ndarray:
    """Indexes (into ``window``) of the rows ``lo:hi`` the subscription tracks, in order.

    The start, clear and mark-delete bounds apply to whole columns. The rows of ``special``
    positions (those with several rows, and the subscription's exceptions) depend on the
    position's other rows: each is left to ``judge`` (few: only re-added positions have them).
    """
    ok = np.ones(hi - lo, dtype=bool)
    seq = window.seq[lo:hi]
    if state.start_seq > 0:
        ok &= seq >= np.uint64(state.start_seq)
    if state.clear_seq >= 0:
        ok &= seq > np.uint64(state.clear_seq)
    ledger = window.ledger[lo:hi]
    md = state.mark_delete
    if md is not None:
        mdl, mde = np.uint64(md[0]), np.uint64(md[1])
        ok &= (ledger > mdl) | ((ledger == mdl) & (window.entry[lo:hi] > mde))
    if special:
        ledgers = np.fromiter({lg for lg, _ in special}, dtype=np.uint64)
        for i in np.flatnonzero(ok & np.isin(ledger, ledgers)).tolist():
            row = window.row(lo + i)
            if (row[1], row[2]) in special:
                ok[i] = judge(row)
    return np.flatnonzero(ok) + lo
