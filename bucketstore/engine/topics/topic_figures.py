"""A topic's per-subscription figures by range scans, never by a pass over every row
(``docs/topics.md``): what ``topic.stats()``, ``bucketstore stats``/``catalog`` and the live
Prometheus scrape show, computed by one code path.

* ``held_rows`` (rows kept only because this subscription is the furthest behind): only the
  subscription strictly furthest behind holds any, the rows between its frontier and the next
  frontier; they are counted once, by windows (:meth:`RowTables.count_between`).
* ``due_undelivered`` and the oldest due row: the rows after the subscription's frontier up to
  the cutoff, in delivery order, are exactly its due rows not yet passed. Where the subscription
  sees all of them but its exceptions and the positions with several rows (no start or clear
  sequence, a mark-delete before every row), they count by windows as well, those positions'
  rows judged one by one; otherwise they are read and judged one by one.

So a scrape costs O(subscriptions x (log rows + windows due + positions with several rows)),
plus, for a subscription with a start or clear sequence or acknowledgements ahead of its
frontier, its due rows; a pass per subscription cost O(rows x subscriptions) under the topic's
lock.
``bucketstore.testing.topic_oracle`` keeps that pass, as the reference these must equal.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import lmdb

from ...format.topic_codec import MAX_KEY
from .subscription_state import RowKey, SubscriptionState
from .topic_rows import RowTables

__all__ = ["visible", "held_rows", "due_rows"]


def visible(txn: lmdb.Transaction, tables: RowTables, tid: int, state: SubscriptionState,
            multi: Collection[tuple[int, int]], row: RowKey) -> bool:
    """Whether ``row`` (of topic ``tid``) is one the subscription tracks: it may see it and, for
    a position with several rows (``multi``), it is the one tracked."""
    if not state.may_see(row):
        return False
    ledger, entry = row[1], row[2]
    if (ledger, entry) not in multi:
        return True
    return state.tracked_row(ledger, entry, tables.versions(txn, tid, ledger, entry)) == row


def held_rows(txn: lmdb.Transaction, tables: RowTables, tid: int,
              frontiers: Mapping[str, RowKey | None]) -> dict[str, int]:
    """Per subscription (name -> frontier, None: none yet), the rows after its frontier and at or
    before every other subscription's: at most two ranges are counted, whatever their number."""
    fixed = sorted(f for f in frontiers.values() if f is not None)
    counted: dict[tuple[RowKey | None, RowKey | None], int] = {}
    out = {}
    for name, front in frontiers.items():
        # The others' least frontier: the least of all, unless this one is it (then the next).
        if not fixed:
            upper = None
        elif front is None or front != fixed[0]:
            upper = fixed[0]
        else:
            upper = fixed[1] if len(fixed) > 1 else None
        if front is not None and upper is not None and upper <= front:
            out[name] = 0  # not strictly the furthest behind: every row it has not passed, another holds
            continue
        if (front, upper) not in counted:
            counted[front, upper] = tables.count_between(txn, tid, front, upper)
        out[name] = counted[front, upper]
    return out


def due_rows(txn: lmdb.Transaction, tables: RowTables, tid: int, state: SubscriptionState,
             multi: Collection[tuple[int, int]], cutoff: int) -> tuple[int, int | None]:
    """The rows due by ``cutoff`` the subscription tracks and has not delivered (its rows to
    redeliver aside): how many, and the earliest deliver_at among them (None: none)."""
    if state.start_seq == 0 and state.clear_seq == -1 and not _acknowledges_a_row(txn, tables, tid, state):
        return _due_by_windows(txn, tables, tid, state, multi, cutoff)
    n, first = 0, None
    for row in tables.rows_after(txn, tid, state.frontier):
        if row[0] > cutoff:
            break
        if visible(txn, tables, tid, state, multi, row):
            n += 1
            if first is None:  # delivery order: the first is the earliest
                first = row[0]
    return n, first


def _acknowledges_a_row(txn: lmdb.Transaction, tables: RowTables, tid: int, state: SubscriptionState) -> bool:
    if state.mark_delete is None:
        return False
    least = tables.first_position(txn, tid)
    return least is not None and least <= state.mark_delete


def _due_by_windows(txn: lmdb.Transaction, tables: RowTables, tid: int, state: SubscriptionState,
                    multi: Collection[tuple[int, int]], cutoff: int) -> tuple[int, int | None]:
    """:func:`due_rows` for a subscription that sees every row after its frontier but those of
    its exceptions and of positions with several rows: a subscription of ``start="earliest"``,
    never cleared, whose mark-delete is before every row (the common case, a stalled one too).
    The rows of the range count by windows; those few positions' rows are then judged one by one."""
    front = state.frontier
    n = tables.count_between(txn, tid, front, (cutoff, *MAX_KEY[1:]))
    if not n:
        return 0, None
    for ledger, entry in set(multi) | set(state.lost):
        for seq, ts in tables.versions(txn, tid, ledger, entry):
            row = (ts, ledger, entry, seq)
            if ts <= cutoff and (front is None or row > front) and not visible(txn, tables, tid, state, multi, row):
                n -= 1
    first = None
    for row in tables.rows_after(txn, tid, front):  # invisible rows before the first: those few only
        if row[0] > cutoff:
            break
        if visible(txn, tables, tid, state, multi, row):
            first = row[0]
            break
    return n, first
