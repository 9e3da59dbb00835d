"""What a subscription's ``mark_delete`` untracks: the positions it tracks in a range, by columns.

A mark-delete from M to M' untracks every position in (M, M'] the subscription tracks, and its
count drops by that many. Most positions have one row (they are not *judged*: no second row, no
row gone from a run, no exception of the subscription's), and such a position is tracked exactly
when its row is: after the frontier, at or after the start sequence, after the clear sequence.
So the count is the rows in range that pass those three tests, taken a column at a time:

* the LMDB level's rows in range, one ``MDB_GET_MULTIPLE`` read per ledger (the level is small:
  sealing keeps it to a few thousand rows);
* a sealed run with no sequence bound inside it: wholly in range, by its entry (every row, or
  the rows after the frontier by binary searches on its segments); partly in range and wholly
  after the frontier (a stalled subscription's), by its per-ledger bitmaps (ranks at the two
  bounds); any other run a segment at a time (segments wholly at or before the frontier
  skipped), numpy over the segment's columns;

less the rows of the judged positions in range that passed, each of which is then judged one by
one as a delivery judges it (:meth:`SubscriptionState.tracked_row`). ``tests/engine/topics/
test_topic_marks.py`` holds it equal to that judgement of every position in range.
"""

from __future__ import annotations

from collections.abc import Iterable

import lmdb
import numpy as np

from ...format.topic_codec import POS_KEY, topic_prefix
from .subscription_state import RowKey, SubscriptionState
from .topic_levels import RowView
from .topic_runs import Run, RunSet

__all__ = ["tracked_in_range"]

Position = tuple[int, int]

#: A ``positions`` record as ``MDB_GET_MULTIPLE`` with ``keyfixed`` gives it: key, then value.
_POS_ITEM = np.dtype([("topic", ">u4"), ("ledger", ">u8"), ("entry", ">u8"), ("seq", ">u8"), ("ts", ">u8")])


def tracked_in_range(txn: lmdb.Transaction, view: RowView, tid: int, state: SubscriptionState,
                     judged: Iterable[Position], after: Position | None, upto: Position) -> int:
    """How many positions after ``after`` (all when None) and at or before ``upto`` the
    subscription tracks, its rows to deliver again aside (the caller counts those)."""
    md = state.mark_delete
    if md is not None and (after is None or md > after):
        after = md  # acknowledged: none tracked
    if after is not None and after >= upto:
        return 0
    special = [p for p in {*judged, *state.lost} if (after is None or p > after) and p <= upto]
    n = _level_rows(txn, view, tid, state, after, upto)
    runs = view.runs
    if runs is not None:
        for run in list(runs.runs.values()):
            n += _run_rows(runs, run, state, after, upto, special)
    for ledger, entry in special:
        # Its rows were counted above as if alone; take them back, then judge the position.
        physical = [(ts, ledger, entry, seq) for seq, ts in view.tables.versions(txn, tid, ledger, entry)]
        if runs is not None and runs.runs:
            physical.extend((ts, ledger, entry, seq) for seq, ts, _ in runs.versions(ledger, entry))
        n -= sum(1 for row in physical if _passes(row, state))
        if state.tracked_row(ledger, entry, view.versions(txn, tid, ledger, entry)) is not None:
            n += 1
    return n


def _passes(row: RowKey, state: SubscriptionState) -> bool:
    """The tests a row of a position that is not judged must pass (the range is the caller's)."""
    return row[3] >= state.start_seq and row[3] > state.clear_seq and (state.frontier is None or row > state.frontier)


def _count_passing(cols: np.ndarray, state: SubscriptionState, after: Position | None, upto: Position | None) -> int:
    """Rows ``(deliver_at, ledger, entry, seq)`` in the position range that pass :func:`_passes`."""
    ok = np.ones(len(cols), dtype=bool)
    ledger, entry = cols[:, 1], cols[:, 2]
    if after is not None:
        ok &= _after((ledger, entry), after)
    if upto is not None:
        ok &= ~_after((ledger, entry), upto)
    seq = cols[:, 3]
    if state.start_seq:
        ok &= seq >= np.uint64(state.start_seq)
    if state.clear_seq >= 0:
        ok &= seq > np.uint64(state.clear_seq)
    if state.frontier is not None:
        ok &= _after((cols[:, 0], ledger, entry, seq), state.frontier)
    return int(np.count_nonzero(ok))


def _after(columns: tuple[np.ndarray, ...], key: tuple[int, ...]) -> np.ndarray:
    """Rows whose columns come after ``key`` in lexicographic order."""
    out = columns[-1] > np.uint64(key[len(columns) - 1])
    for col, value in zip(reversed(columns[:-1]), reversed(key[:len(columns) - 1])):
        v = np.uint64(value)
        out = (col > v) | ((col == v) & out)
    return out


def _level_rows(txn: lmdb.Transaction, view: RowView, tid: int, state: SubscriptionState,
                after: Position | None, upto: Position) -> int:
    """The LMDB level's rows in range that pass: one read per ledger of their records."""
    n = 0
    prefix = topic_prefix(tid)
    with txn.cursor(db=view.tables.positions) as cur:
        found = cur.set_range(POS_KEY.pack(tid, 0 if after is None else after[0]))
        while found:
            key = cur.key()
            if key[:4] != prefix or POS_KEY.unpack(key)[1] > upto[0]:
                break
            raw = cur.getmulti([key], dupdata=True, dupfixed_bytes=_POS_ITEM.itemsize - POS_KEY.size, keyfixed=True)
            items = np.frombuffer(raw, dtype=_POS_ITEM)
            cols = np.empty((len(items), 4), dtype=np.uint64)
            cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3] = items["ts"], items["ledger"], items["entry"], items["seq"]
            n += _count_passing(cols, state, after, upto)
            found = cur.next_nodup()
    return n


def _run_rows(runs: RunSet, run: Run, state: SubscriptionState, after: Position | None, upto: Position,
              special: list[Position]) -> int:
    """The run's rows in range that pass: by its entry or its bitmaps when it can, else a
    segment at a time."""
    front = state.frontier
    if (after is not None and run.max_pos <= after) or run.min_pos > upto:
        return 0  # no position in range
    if run.seq[1] < state.start_seq or run.seq[1] <= state.clear_seq or (front is not None and run.last <= front):
        return 0  # every row before the start, cleared or passed
    inside = (after is None or run.min_pos > after) and run.max_pos <= upto
    if run.seq[0] >= state.start_seq and run.seq[0] > state.clear_seq:
        if inside:
            return run.rows if front is None or run.first > front else runs.count_run(run, front, None)
        if front is None or run.first > front:
            # Every row passes: the rows in range are its positions in range (bitmaps), plus the
            # second and later rows of a judged position in the run.
            n = runs.count_positions(run, after, upto)
            for ledger, entry in special:
                if runs.holds(run, ledger, entry):
                    n += sum(1 for _, _, run_id in runs.versions(ledger, entry) if run_id == run.run_id) - 1
            return n
    n = 0
    for i, seg in enumerate(runs.segments_of(run)):
        if front is not None and seg.last_ts < front[0]:
            continue  # wholly passed
        n += _count_passing(runs.segment(run, i), state, None if inside else after, None if inside else upto)
    return n
