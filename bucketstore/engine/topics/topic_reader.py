"""Read a store's topics without changing anything: what ``stats``, ``catalog``, ``verify`` and
the Prometheus export show of them (``docs/topics.md``).

Opens ``STORE/topics/`` read-only (beside a live writer too: one read transaction is one
consistent view) and writes nothing. :func:`describe_topics` gives, per topic, its rows and
bytes and, per subscription, what it tracks, where its frontier is, how many rows it alone
holds and how many due rows it has not delivered; :func:`verify_topics` lists every record that
does not decode or does not agree with the others.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import lmdb
import numpy as np

from ...cutoff import Clock, system_clock
from ...errors import CatalogError, JournalError, ReadOnlyError
from ...format.fs import REAL_FS
from ...format.topic_codec import (DEAD_KEY, MULTI, RUN_KEY, U64, TopicRecordError, decode_run_record, decode_topic,
                                  row_from, row_parts, split_position, split_sub_key, topic_prefix)
from ..catalog.catalog import _is_permission_error
from ..catalog.lmdb_file import check_data_file
from ..directory.store_lock import writer_pid
from .subscription_state import SubscriptionState
from .topic_figures import due_rows, held_rows
from .topic_file import MAX_DBS, live_topic_file, topics_directory
from .topic_journal_view import FoldedTopic, JournalSnapshot, fold_journal
from .topic_levels import RowView
from .topic_rows import RowTables
from .topic_runs import RunSet, runs_directory
from .topic_windows import WindowBudget

__all__ = ["describe_topics", "verify_topics", "ReadOnlyTopics"]


def _open(store_path: str) -> lmdb.Environment | None:
    path = topics_directory(store_path)
    data = os.path.join(path, "data.mdb")
    if not os.path.isfile(data):
        return None
    check_data_file(data)  # raises CatalogError on a truncated file (never a SIGBUS)
    # As the catalog's readers do: registered in the reader table (so that a live writer never
    # reuses the pages being read), or, without write access to lock.mdb, lock-less and only
    # while no writer holds the store.
    try:
        try:
            return lmdb.open(path, readonly=True, max_dbs=MAX_DBS, subdir=True, create=False)
        except lmdb.Error as exc:
            if not _is_permission_error(exc):
                raise
        if writer_pid(store_path) is not None:
            raise CatalogError(f"{path}: cannot register as a reader in lock.mdb (no write access), and a writer "
                               "has the store open: a lock-less read could see a torn view", path=path)
        return lmdb.open(path, readonly=True, lock=False, max_dbs=MAX_DBS, subdir=True, create=False)
    except lmdb.Error as exc:
        raise CatalogError(f"{path}: cannot open the topic index: {exc}", path=path) from None


_NAMES = ("topics", "subs", "rows", "positions", "multi", "meta", "runs", "dead")
#: Tables an index written before sealed runs lacks (read as empty).
_LATER = ("runs", "dead")
_DUPS = ("rows", "positions")


@contextmanager
def _reading(store_path: str) -> Iterator[tuple[lmdb.Environment, lmdb.Transaction, dict[str, Any]] | None]:
    """One read transaction on the topic index (None: the store has none), through this
    process's writer when it has the environment open (LMDB allows one open per process)."""
    live = live_topic_file(store_path)
    if live is not None:
        with live.lock:
            live.settle()  # the writer's subscriptions' progress in their group-commit window
            env = live._live()
            with env.begin(buffers=False) as txn:
                yield env, txn, {**{name: getattr(live, name) for name in _NAMES}, "_path": live.path,
                                 "_budget": live.windows}  # the writer's cache of run segments
        return
    env = _open(store_path)
    if env is None:
        yield None
        return
    try:
        with env.begin(buffers=False) as txn:
            yield env, txn, {**{name: _open_db(env, txn, name) for name in _NAMES},
                             "_path": topics_directory(store_path)}
    finally:
        env.close()


def _open_db(env: lmdb.Environment, txn: lmdb.Transaction, name: str) -> Any:
    try:
        return env.open_db(name.encode(), txn=txn, create=False, dupsort=name in _DUPS, dupfixed=name in _DUPS)
    except lmdb.NotFoundError:
        if name in _LATER:
            return None
        raise


def _each(txn: lmdb.Transaction, db: Any, prefix: bytes = b""):
    if db is None:
        return
    with txn.cursor(db=db) as cur:
        if cur.set_range(prefix):
            for key, value in cur:
                if not key.startswith(prefix):
                    return
                yield key, value


def topic_view(txn: lmdb.Transaction, dbs: dict[str, Any], tid: int) -> RowView:
    """Topic ``tid``'s rows, in its tables and its sealed runs (read on demand, cached apart
    from any writer's), less the run rows gone (``dead``)."""
    runs = None
    if dbs.get("runs") is not None:
        # The environment's own directory (dbs come from the writer, or from this path).
        runs = RunSet(runs_directory(dbs["_path"]), tid, dbs.get("_budget") or WindowBudget(), REAL_FS)
        runs.load(txn, dbs["runs"])
    dead = {DEAD_KEY.unpack(k)[1:]: U64.unpack(v)[0] for k, v in _each(txn, dbs.get("dead"), topic_prefix(tid))}
    return RowView(RowTables(dbs["rows"], dbs["positions"]), runs, dead)


def read_topic(txn: lmdb.Transaction, dbs: dict[str, Any], record: dict[str, Any],
               journal: JournalSnapshot | None) -> FoldedTopic:
    """Topic ``record``'s subscriptions, rows and positions with several rows as read, with the
    adds its journal holds beyond the index's folded in (:func:`~.topic_journal_view.fold_journal`).

    :raises TopicRecordError: a subscription's record does not decode.
    """
    tid = record["id"]
    prefix = topic_prefix(tid)
    multi = {MULTI.unpack(k)[1:] for k, _ in _each(txn, dbs["multi"], prefix)}
    raw_subs = {split_sub_key(key)[1]: value for key, value in _each(txn, dbs["subs"], prefix)}
    return fold_journal(txn, topic_view(txn, dbs, tid), record, raw_subs, multi, journal)


def describe_topics(store_path: str | os.PathLike[str], now_ms: int | None = None,
                    clocks: Mapping[str, Clock | None] | None = None) -> dict[str, Any]:
    """Every topic of the store with its subscriptions' figures ({} when it has none).

    :param now_ms: the clock for "due" (default: the system clock); the cutoff is the later
        of ``now + tick`` and the topic's recorded cutoff.
    :param clocks: per topic name, the clock its open handle runs on (None: the system's),
        in place of ``now_ms``: the writer's own metrics judge "due" as its topics do.
    :raises CatalogError: the topic index cannot be opened or a record does not decode.
    """
    path = os.fspath(store_path)
    where = topics_directory(path)
    journal = JournalSnapshot(where)  # before the read transaction (engine/topics/topic_journal_view.py)
    try:
        with _reading(path) as view:
            if view is None:
                return {}
            env, txn, dbs = view
            out = {}
            for raw_name, value in _each(txn, dbs["topics"]):
                name = raw_name.decode("utf-8", "replace")
                try:
                    clock = (clocks or {}).get(name)
                    now = int(clock()) if clock is not None else now_ms
                    out[name] = _describe(txn, dbs, decode_topic(value), now, journal)
                except TopicRecordError as exc:
                    raise CatalogError(f"{where}: topic {name!r}: {exc}", path=where) from None
            file_bytes, live_bytes = _sizes(env, txn, dbs)
            for doc in out.values():  # the environment is shared by the store's topics
                doc["file_bytes"], doc["live_bytes"] = file_bytes, live_bytes
            return out
    except lmdb.Error as exc:
        raise CatalogError(f"{where}: cannot read the topic index: {exc}", path=where) from None


def _sizes(env: lmdb.Environment, txn: lmdb.Transaction, dbs: dict[str, Any]) -> tuple[int, int]:
    """The bytes of the environment's pages, and of those in use: LMDB never gives pages back to
    the file system, so after a bulk delete the file stays at its high-water mark while the
    pages freed wait for reuse; the difference is what a compacting copy would save."""
    psize = env.stat()["psize"]
    used = 2  # the two meta pages
    tables = [db for name, db in dbs.items() if name in _NAMES and db is not None]
    for db in (None, *tables):  # None: the main table, which names the others
        st = env.stat() if db is None else txn.stat(db)
        used += st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
    return (env.info()["last_pgno"] + 1) * psize, used * psize


def _describe(txn: lmdb.Transaction, dbs: dict[str, Any], record: dict[str, Any], now_ms: int | None,
              journal: JournalSnapshot | None = None) -> dict[str, Any]:
    folded = read_topic(txn, dbs, record, journal)
    record, subs, tables, multi = folded.record, folded.subs, folded.rows, folded.multi
    tid = record["id"]
    tick = 0 if record["config"].get("deliver_at_time_strict") else int(record["config"].get("tick_time_ms", 0))
    now = system_clock() if now_ms is None else now_ms
    cutoff = max(record["cutoff"], now + tick)
    judged = multi | set(tables.dead)  # rows judged one by one: several rows, or rows gone from a run
    # Range scans only (engine/topics/topic_figures.py): the topic's lock is held while they run.
    held = held_rows(txn, tables, tid, {name: state.frontier for name, state in subs.items()})
    doc_subs = {}
    for sub_name, state in subs.items():
        due, first = due_rows(txn, tables, tid, state, judged, cutoff)
        oldest = min((t for t in (first, *(row[0] for row in state.redeliver)) if t is not None), default=None)
        doc_subs[sub_name] = {
            "number_of_delayed_messages": state.count(record["inserted"]),
            "frontier": list(state.frontier) if state.frontier else None,
            "mark_delete": list(state.mark_delete) if state.mark_delete else None,
            "held_rows": held[sub_name], "due_undelivered": due + len(state.redeliver),
            "exceptions": len(state.lost), "unconfirmed": len(state.redeliver),
            # How long the oldest of those has waited past its time (None: nothing is due).
            "oldest_due_age_ms": None if oldest is None else max(0, now - oldest)}
    # The topic record's count, kept with every change (verify checks it against the rows).
    runs = tables.runs.runs.values() if tables.runs is not None else ()
    return {"id": tid, "rows": record["rows"], "multi_positions": len(multi), "cutoff": cutoff,
            "run_files": len(runs), "run_bytes": sum(_size(tables.runs.path(r.run_id)) for r in runs),  # type: ignore[union-attr]
            "subscriptions": dict(sorted(doc_subs.items()))}


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # verify reports a missing run; the figures go on
        return 0


def verify_topics(store_path: str | os.PathLike[str]) -> list[str]:
    """Every problem of the topic index, one line each ([] when sound or absent).

    Each record must decode; each row must have its twin in ``positions`` (same deliver_at)
    and the reverse; a ``multi`` entry must name a position with rows; every row's seq must be
    below its topic's ``next_seq``; every subscription must belong to a topic.
    """
    path = os.fspath(store_path)
    where = topics_directory(path)
    problems: list[str] = []
    journal = JournalSnapshot(where)  # before the read transaction (engine/topics/topic_journal_view.py)
    try:
        with _reading(path) as view:
            if view is None:
                return []
            _, txn, dbs = view
            _verify(txn, dbs, where, problems, journal)
    except CatalogError as exc:
        return [str(exc)]
    except lmdb.Error as exc:
        problems.append(f"{where}: cannot read the topic index: {exc}")
    return problems


def _verify(txn: lmdb.Transaction, dbs: dict[str, Any], where: str, problems: list[str],
            journal: JournalSnapshot) -> None:
    topics = {}
    recorded_rows: dict[int, int] = {}
    applied: dict[int, int] = {}
    for raw_name, value in _each(txn, dbs["topics"]):
        try:
            record = decode_topic(value)
            topics[record["id"]] = (raw_name.decode("utf-8", "replace"), record["next_seq"])
            recorded_rows[record["id"]] = record["rows"]
            applied[record["id"]] = record.get("applied", 0)
        except TopicRecordError as exc:
            problems.append(f"{where}: topic {raw_name!r}: {exc}")
    rows: dict[tuple[int, int, int, int], int] = {}
    held: dict[int, int] = {}
    for key, value in _each(txn, dbs["rows"]):
        try:
            ts, ledger, entry, seq = row_from(key, value)
        except TopicRecordError as exc:
            problems.append(f"{where}: rows record {key.hex()}/{value.hex()}: {exc}")
            continue
        tid = int.from_bytes(key[:4], "big")
        key = b"".join(row_parts(tid, ts, ledger, entry, seq))  # the row, as the messages name it
        rows[(tid, ledger, entry, seq)] = ts
        held[tid] = held.get(tid, 0) + 1
        if tid not in topics:
            problems.append(f"{where}: row {key.hex()} of unknown topic id {tid}")
        elif seq >= topics[tid][1]:
            problems.append(f"{where}: row {key.hex()} has seq {seq} >= the topic's next_seq {topics[tid][1]}")
    with_rows = set()
    for key, value in _each(txn, dbs["positions"]):
        try:
            tid, ledger, entry, seq, ts = split_position(key, value)
        except TopicRecordError as exc:
            problems.append(f"{where}: positions record {key.hex()}: {exc}")
            continue
        with_rows.add((tid, ledger, entry))
        if rows.pop((tid, ledger, entry, seq), None) != ts:
            problems.append(f"{where}: position {key.hex()}/{value.hex()} (deliver_at {ts}) has no row with that "
                            "time")
    for (tid, ledger, entry, seq), ts in rows.items():
        problems.append(f"{where}: row {b''.join(row_parts(tid, ts, ledger, entry, seq)).hex()} has no position "
                        "record")
    _verify_runs(txn, dbs, where, topics, held, with_rows, problems)
    for key, _ in _each(txn, dbs["multi"]):
        if len(key) != MULTI.size or MULTI.unpack(key) not in with_rows:
            problems.append(f"{where}: multi record {key.hex()} names a position without rows")
    for key, value in _each(txn, dbs["subs"]):
        try:
            tid, sub_name = split_sub_key(key)
            SubscriptionState.decode(sub_name, value)
        except TopicRecordError as exc:
            problems.append(f"{where}: subscription record {key.hex()}: {exc}")
            continue
        if tid not in topics:
            problems.append(f"{where}: subscription {sub_name!r} of unknown topic id {tid}")
    for tid, (name, _) in topics.items():
        if held.get(tid, 0) != recorded_rows[tid]:
            problems.append(f"{where}: topic {name!r} records {recorded_rows[tid]} rows, holds {held.get(tid, 0)}")
        try:  # its journal's groups decode, and follow the adds the index holds
            journal.adds(tid, applied[tid])
        except JournalError as exc:
            problems.append(str(exc))


def _verify_runs(txn: lmdb.Transaction, dbs: dict[str, Any], where: str, topics: dict[int, tuple[str, int]],
                 held: dict[int, int], with_rows: set[tuple[int, int, int]], problems: list[str]) -> None:
    """Each sealed run's entry decodes and its file holds what the entry says (rows in delivery
    order, first and last row, positions, seqs below next_seq); its rows not gone count as held.
    A file no entry names is not damage: a seal killed before its commit leaves one, removed at
    the next open."""
    for key, value in _each(txn, dbs.get("runs")):
        if len(key) != RUN_KEY.size:
            problems.append(f"{where}: runs record {key.hex()}: key of {len(key)} bytes")
            continue
        tid, run_id = RUN_KEY.unpack(key)
        try:
            r = decode_run_record(value)
        except TopicRecordError as exc:
            problems.append(f"{where}: run {run_id} of topic id {tid}: {exc}")
            continue
        if tid not in topics:
            problems.append(f"{where}: run {run_id} of unknown topic id {tid}")
            continue
        runs = RunSet(runs_directory(dbs["_path"]), tid, WindowBudget(), REAL_FS)
        runs.load(txn, dbs["runs"])
        run = runs.runs[run_id]
        held[tid] = held.get(tid, 0) + r["rows"] - r["killed"]  # as its entry says, read or not
        try:
            rows = runs.rows_of(run)
        except CatalogError as exc:
            problems.append(str(exc))
            continue
        path = runs.path(run_id)
        keys = np.ascontiguousarray(rows.astype(">u8")).view("S32").ravel()
        if len(rows) > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            problems.append(f"{path}: rows not in delivery order")
        order = np.lexsort((rows[:, 3], rows[:, 2], rows[:, 1]))
        found = {"first": tuple(int(x) for x in rows[0]), "last": tuple(int(x) for x in rows[-1]),
                 "min_pos": (int(rows[order[0], 1]), int(rows[order[0], 2])),
                 "max_pos": (int(rows[order[-1], 1]), int(rows[order[-1], 2])),
                 "seq": (int(rows[:, 3].min()), int(rows[:, 3].max()))}
        for field, got in found.items():
            if r[field] != got:
                problems.append(f"{path}: its entry's {field} is {r[field]}, the file's {got}")
        if found["seq"][1] >= topics[tid][1]:
            problems.append(f"{path}: holds seq {found['seq'][1]} >= the topic's next_seq {topics[tid][1]}")
        with_rows.update((tid, int(lg), int(en)) for lg, en in rows[:, 1:3].tolist())
    for key, value in _each(txn, dbs.get("dead")):
        if len(key) != DEAD_KEY.size or len(value) != U64.size:
            problems.append(f"{where}: dead record {key.hex()}/{value.hex()} is not {DEAD_KEY.size}+{U64.size} bytes")
        elif DEAD_KEY.unpack(key)[0] not in topics:
            problems.append(f"{where}: dead record {key.hex()} of unknown topic id {DEAD_KEY.unpack(key)[0]}")


class ReadOnlyTopics:
    """What a read-only store (``bucketstore.open(path, read_only=True)``) offers of its topics:
    their names and figures, read beside a live writer; never a change."""

    path: str

    def _check_open(self) -> None:
        raise NotImplementedError

    def topics(self) -> list[str]:
        """Names of every topic in the store, sorted."""
        self._check_open()
        return sorted(describe_topics(self.path))

    def topic_stats(self, name: str) -> dict[str, Any]:
        """One topic's rows and, per subscription, its figures (as ``bucketstore stats`` shows them).

        :raises ReadOnlyError: the store has no such topic (a read-only handle creates none).
        """
        self._check_open()
        doc = describe_topics(self.path)
        if name not in doc:
            raise ReadOnlyError(f"store {self.path} has no topic {name!r} (a read-only open creates nothing)")
        return doc[name]

    def topic(self, name: str, config: Any = None, clock: Any = None) -> Any:
        """Refused: a topic handle changes its file as it delivers; read with :meth:`topic_stats`."""
        raise ReadOnlyError(f"store {self.path} is open read-only: a topic cannot be opened; "
                            "use topic_stats() or `bucketstore stats` to look at it")

    def delete_topic(self, name: str) -> None:
        raise ReadOnlyError(f"store {self.path} is open read-only: topic {name!r} is not deleted")
