"""Every row of a topic with what each subscription has of it: what a bulk reader (the Spark
data source, ``docs/spark.md``) exports of a store's topics.

The rows are those of :func:`~.topic_reader.topic_view`: the LMDB level and the sealed runs, less
the run rows gone since they were sealed, in delivery order. They are read in one read
transaction with the subscriptions' records, so rows and states are one consistent view (beside
a live writer too). Of each row, each subscription is in one state:

* :data:`PENDING`: the subscription tracks the row and has not delivered it (what its
  ``number_of_delayed_messages`` counts, with the unconfirmed ones);
* :data:`UNCONFIRMED`: delivered in a batch that was not confirmed before the writer closed or
  died; the subscription delivers it again first (at-least-once). Its record keeps the row, which
  may be gone from the topic's rows since (every other subscription past it): such a row is
  given for that subscription alone, after the topic's rows;
* :data:`DONE`: delivered, acknowledged (mark-delete), or never the subscription's (added before
  its ``start="latest"``, before its last ``clear()``, or another row of a position it tracks).

A row is judged as :func:`~.topic_figures.visible` judges it for ``stats``; the subscription's
bounds (frontier, mark-delete, start and clear sequences, exceptions) are compared over a whole
batch of rows at once, and only the rows of positions with several rows (or rows gone from a
run) one by one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import lmdb
import numpy as np

from ...errors import CatalogError
from ...format.topic_codec import RUN_KEY, TopicRecordError, decode_topic
from .subscription_state import SubscriptionState
from .topic_figures import visible
from .topic_file import topics_directory
from .topic_levels import RowView
from .topic_journal_view import FoldedRows, JournalSnapshot
from .topic_reader import _each, _reading, read_topic

__all__ = ["PENDING", "UNCONFIRMED", "DONE", "STATES", "TopicChunk", "topic_names", "read_topic_states",
           "run_listed"]

PENDING, UNCONFIRMED, DONE = "pending", "unconfirmed", "done"
#: The state codes of :attr:`TopicChunk.states`: ``STATES[code]``.
STATES = (PENDING, UNCONFIRMED, DONE)
_PENDING, _UNCONFIRMED, _DONE = range(3)
#: Rows judged at a time (32 bytes each, plus a byte per subscription).
DEFAULT_CHUNK_ROWS = 1 << 16


@dataclass(frozen=True)
class TopicChunk:
    """Consecutive rows of one topic, in delivery order, and each subscription's state of them.

    After the topic's rows come, per subscription, the rows of its unconfirmed batches that are
    no longer rows of the topic (every other subscription passed them since): a chunk whose
    ``states`` names that subscription alone, all :data:`UNCONFIRMED`.
    """

    topic: str
    #: (n, 4) uint64: deliver_at, ledger, entry, seq.
    rows: np.ndarray
    #: Subscription name -> (n,) uint8 codes into :data:`STATES`; empty when the topic has none.
    states: dict[str, np.ndarray]


def topic_names(store_path: str | os.PathLike[str]) -> list[str]:
    """The store's topics, sorted ([] when it has none)."""
    path = os.fspath(store_path)
    try:
        with _reading(path) as view:
            if view is None:
                return []
            _, txn, dbs = view
            return sorted(key.decode("utf-8", "replace") for key, _ in _each(txn, dbs["topics"]))
    except lmdb.Error as exc:
        where = topics_directory(path)
        raise CatalogError(f"{where}: cannot read the topic index: {exc}", path=where) from None


def run_listed(store_path: str | os.PathLike[str], run_path: str) -> bool:
    """Whether the topic index, read now, still lists the run file ``run_path``. A run file read
    through an older read transaction may be gone because the live writer dropped the run since
    (all its rows passed, or merged into another): no longer listed, that is a stale view, not
    damage."""
    stem = os.path.basename(run_path).removesuffix(".run")
    tid, _, run_id = stem.partition("-")
    if not (tid.isdigit() and run_id.isdigit()):
        return False
    with _reading(os.fspath(store_path)) as view:
        if view is None or view[2].get("runs") is None:
            return False
        _, txn, dbs = view
        return txn.get(RUN_KEY.pack(int(tid), int(run_id)), db=dbs["runs"]) is not None


def read_topic_states(store_path: str | os.PathLike[str], name: str,
                      chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[TopicChunk]:
    """Topic ``name``'s rows, both levels, with each subscription's state, ``chunk_rows`` at a time.

    The read transaction stays open until the iterator ends or is closed.

    :raises CatalogError: the store has no such topic, a record does not decode, a run file is
        damaged or missing (naming the file).
    """
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be at least 1")
    path = os.fspath(store_path)
    where = topics_directory(path)
    journal = JournalSnapshot(where)  # before the read transaction (engine/topics/topic_journal_view.py)
    try:
        with _reading(path) as view:
            raw = None
            if view is not None:
                _, txn, dbs = view
                raw = txn.get(name.encode("utf-8"), db=dbs["topics"])
            if raw is None:
                raise CatalogError(f"{where}: no topic named {name!r}", path=where)
            try:
                # The adds its journal holds beyond the index's folded in, as describe_topics does.
                folded = read_topic(txn, dbs, decode_topic(raw), journal)
            except TopicRecordError as exc:
                raise CatalogError(f"{where}: topic {name!r}: {exc}", path=where) from None
            tid, subs, tables = folded.record["id"], folded.subs, folded.rows
            # As describe_topics judges them: positions with several rows, or rows gone from a run.
            judged = folded.multi | set(tables.dead)
            # Rows of unconfirmed batches: usually still rows of the topic, but one every other
            # subscription has passed since is gone from it while this one will deliver it again.
            unconfirmed = {row for state in subs.values() for row in state.redeliver}
            found: set[tuple[int, int, int, int]] = set()
            pending: list[tuple[int, int, int, int]] = []
            for row in tables.rows_after(txn, tid, None):
                pending.append(row)
                if len(pending) == chunk_rows:
                    if unconfirmed:
                        found.update(r for r in pending if r in unconfirmed)
                    yield _chunk(txn, tables, tid, name, subs, judged, pending)
                    pending = []
            if pending:
                if unconfirmed:
                    found.update(r for r in pending if r in unconfirmed)
                yield _chunk(txn, tables, tid, name, subs, judged, pending)
            for sub_name, state in sorted(subs.items()):
                gone = sorted(set(state.redeliver) - found)
                for lo in range(0, len(gone), chunk_rows):
                    part = gone[lo:lo + chunk_rows]
                    yield TopicChunk(name, np.array(part, dtype=np.uint64).reshape(-1, 4),
                                     {sub_name: np.full(len(part), _UNCONFIRMED, dtype=np.uint8)})
    except lmdb.Error as exc:
        raise CatalogError(f"{where}: cannot read the topic index: {exc}", path=where) from None


def _chunk(txn: lmdb.Transaction, tables: RowView | FoldedRows, tid: int, name: str, subs: dict[str, SubscriptionState],
           judged: set[tuple[int, int]], rows: Sequence[tuple[int, int, int, int]]) -> TopicChunk:
    arr = np.array(rows, dtype=np.uint64).reshape(-1, 4)
    one_by_one = [i for i, (_, ledger, entry, _) in enumerate(rows) if (ledger, entry) in judged] if judged else []
    states = {}
    for sub_name, state in sorted(subs.items()):
        seen = _may_see(arr, state)
        for i in one_by_one:
            seen[i] = visible(txn, tables, tid, state, judged, rows[i])
        codes = np.where(seen, _PENDING, _DONE).astype(np.uint8)
        if state.redeliver:
            again = set(state.redeliver)
            for i in np.flatnonzero(~seen).tolist():
                if rows[i] in again:
                    codes[i] = _UNCONFIRMED
        states[sub_name] = codes
    return TopicChunk(name, arr, states)


def _may_see(rows: np.ndarray, state: SubscriptionState) -> np.ndarray:
    """:meth:`SubscriptionState.may_see` of every row at once."""
    ts, ledger, entry, seq = (rows[:, c] for c in range(4))
    ok = seq >= np.uint64(state.start_seq)
    if state.clear_seq >= 0:
        ok &= seq > np.uint64(state.clear_seq)
    md = state.mark_delete
    if md is not None:
        ok &= _after((ledger, entry), md)
    if state.frontier is not None:
        ok &= _after((ts, ledger, entry, seq), state.frontier)
    for (lg, en), bound in state.lost.items():
        ok &= ~((ledger == np.uint64(lg)) & (entry == np.uint64(en)) & (seq <= np.uint64(bound)))
    return ok


def _after(columns: tuple[np.ndarray, ...], key: Sequence[int]) -> np.ndarray:
    """Rows whose columns are after ``key`` in lexicographic order (compared as uint64)."""
    col, value = columns[-1], np.uint64(key[len(columns) - 1])
    out = col > value
    for col, value in zip(reversed(columns[:-1]), reversed([np.uint64(v) for v in key[:len(columns) - 1]])):
        out = (col > value) | ((col == value) & out)
    return out
