"""A topic's sealed runs, as the topic manages them (mixed into :class:`~.topic.Topic`):
loading their entries at open, sealing the LMDB level into a run, merging runs, dropping them
once every subscription is past them, and marking a run row gone (``docs/topics.md``, "Sealed
runs"). The files are :mod:`~.topic_runs`'s; which runs merge and what a merge keeps,
:mod:`~.topic_merge`'s; reads over both levels, :mod:`~.topic_levels`'s.
"""

from __future__ import annotations

from typing import Any

import lmdb
import numpy as np

from ...config import TrackerConfig
from ...format.topic_codec import DEAD_KEY, MAX_KEY, POS_KEY, ROW_KEY, U64, encode_topic
from .subscription_state import RowKey, SubscriptionState
from .topic_file import TopicFile
from .topic_levels import RowView
from .topic_merge import kept_rows, plan_merge
from .topic_runs import Run, RunSet
from .topic_windows import Window, WindowCache, packed_key

__all__ = ["SealedRuns", "LEVEL_ROWS"]

#: The most rows the LMDB level holds before they are sealed into a run (fewer when
#: ``min_index_count_per_bucket`` says so, Pulsar's seal), and the most adds that wait in memory
#: (in journal mode, in the topic's journal) before going straight into a run. LMDB never gives
#: pages back to the file system, so the level's peak is what it costs on disk for good: up to
#: two seals' worth when a call that reads writes the waiting adds into it. Each seal costs two
#: fsyncs and a commit whatever its size, and each merge as much again, which the adds pay for
#: (tools/bench/bench_topics.py, issue 25).
LEVEL_ROWS = 8_192


class SealedRuns:
    """Mixed into :class:`~.topic.Topic`, which sets the attributes used here."""

    _file: TopicFile
    _id: int
    _prefix: bytes
    _windows: WindowCache
    _rows: int
    _next_seq: int
    _inserted: int
    _cutoff: Any
    _multi: set[tuple[int, int]]
    _subs: dict[str, SubscriptionState]
    _raw_name: bytes
    _durability: str
    _config_record: dict[str, Any]
    _applied: int
    _journal: Any

    def _write(self, room: int = 0, step: str = "topic_commit") -> Any:
        raise NotImplementedError

    def _versions(self, txn: lmdb.Transaction, ledger: int, entry: int) -> list[tuple[int, int]]:
        raise NotImplementedError

    def _forget_multi(self, txn: lmdb.Transaction, pos: tuple[int, int], dirty: set[str]) -> None:
        raise NotImplementedError

    def _open_runs(self, txn: lmdb.Transaction, config: TrackerConfig) -> None:
        """Load the runs' entries and the dead bounds (the files are read when first needed)."""
        file = self._file
        #: The sealed runs (engine/topics/topic_runs.py): their entries only, files read lazily.
        self._runs = RunSet(file.runs_path, self._id, file.windows, file.fs)
        self._runs.load(txn, file.runs)
        self._windows.runs = self._runs
        #: Per position, the seq up to which its rows in runs are gone (see topic_levels.py).
        self._dead: dict[tuple[int, int], int] = {}
        with txn.cursor(db=file.dead) as cur:
            if cur.set_range(self._prefix):
                for key, value in cur:
                    if not key.startswith(self._prefix):
                        break
                    _, ledger, entry = DEAD_KEY.unpack(key)
                    self._dead[ledger, entry] = U64.unpack(value)[0]
        self._view = RowView(file.tables, self._runs, self._dead)
        #: Rows of the runs not gone: the level holds ``_rows`` less these.
        self._sealed_rows = sum(run.live for run in self._runs.runs.values())
        #: Rows of the level that make a seal: see :data:`LEVEL_ROWS`.
        self._seal_rows = min(config.min_index_count_per_bucket, LEVEL_ROWS)
        self._seal_at = self._seal_rows

    def _judged(self) -> set[tuple[int, int]] | frozenset[tuple[int, int]]:
        """Positions whose rows are judged one by one: those with several rows, and those with
        rows gone from a run (the window columns cannot tell)."""
        if not self._dead:
            return self._multi
        return self._multi | self._dead.keys()

    def _kill(self, txn: lmdb.Transaction, ledger: int, entry: int, seq: int) -> None:
        """A row of a sealed run is gone before its run: the position's dead bound says so."""
        for s, _, run_id in self._runs.versions(ledger, entry):
            if s == seq:
                run = self._runs.runs[run_id]
                run.killed += 1
                self._runs.put(txn, self._file.runs, run)
        self._sealed_rows -= 1
        pos = (ledger, entry)
        self._dead[pos] = max(self._dead.get(pos, -1), seq)
        txn.put(DEAD_KEY.pack(self._id, ledger, entry), U64.pack(self._dead[pos]), db=self._file.dead)

    def _maybe_seal(self) -> None:
        """Seal once the level holds enough rows (see :data:`LEVEL_ROWS`); merge what is due."""
        if self._rows - self._sealed_rows >= self._seal_at:
            self._seal()
        while (group := plan_merge(self._runs.runs.values(), self._seal_rows)) is not None:
            self._merge(group)

    def _seal_fresh(self, txn: lmdb.Transaction, times: np.ndarray, ledgers: np.ndarray, entries: np.ndarray,
                    first_seq: int) -> bool:
        """In ``sealed`` mode, and in ``journal`` mode from the topic's journal, write a group of
        adds of new positions (uint64 columns, seqs from ``first_seq``: not due, past every row)
        straight into a run, listed by the adds' own transaction ``txn``,
        rather than into the level: Pulsar's seal of ``min_index_count_per_bucket`` adds, which
        would otherwise pass through LMDB and leave its file that large for good. False (nothing
        done): write them to the level."""
        if (self._durability != "sealed" and self._journal is None) or len(times) < self._seal_rows:
            return False
        cols = np.column_stack((times, ledgers, entries,
                                np.arange(first_seq, first_seq + len(times), dtype=np.uint64)))
        cols = cols[np.lexsort((cols[:, 3], cols[:, 2], cols[:, 1], cols[:, 0]))]
        run = self._runs.write(cols)  # durable before the transaction that lists it commits
        self._runs.put(txn, self._file.runs, run)
        self._runs.runs[run.run_id] = run
        self._sealed_rows += run.rows
        self._windows.clear()  # the merged windows lack its rows
        return True

    def _seal(self) -> None:
        """Move the level's rows that are not due (so after every frontier: a frontier never
        passes the cutoff) into a new sealed run, but those of judged positions (several rows,
        rows gone): the file first, durably, then one transaction lists it and deletes them.
        Nothing any subscription sees changes, so a kill anywhere in between loses nothing (a
        file no entry names is removed at open)."""
        cutoff = np.uint64(max(self._cutoff.value, 0))
        judged = self._judged()
        taken: list[np.ndarray] = []
        records: list[tuple[Window, np.ndarray]] = []
        with self._file.read() as txn:
            for window in self._windows.scan_level(txn, MAX_KEY):
                keep = window.ts > cutoff
                if self._cutoff.value < 0:
                    keep[:] = True
                if judged:
                    for i in np.flatnonzero(keep).tolist():
                        if (int(window.ledger[i]), int(window.entry[i])) in judged:
                            keep[i] = False
                idx = np.flatnonzero(keep)
                if len(idx):
                    taken.append(window.columns[idx])
                    records.append((window, idx))
        level = self._rows - self._sealed_rows
        n = sum(len(idx) for _, idx in records)
        if n * 2 < self._seal_rows or not n:
            # Mostly due or judged rows: wait for as many again before looking.
            self._seal_at = level + max(1, self._seal_rows // 2)
            return
        cols = np.concatenate(taken)
        run = self._runs.write(cols)
        tables = self._file.tables
        with self._write(step="topic_seal_commit") as txn:
            self._runs.put(txn, self._file.runs, run)
            if n == level:  # the whole level (the usual case): whole keys, not a record at a time
                tables.delete_keys(txn, [w.raw[:ROW_KEY.size] for w, _ in records],
                                   [POS_KEY.pack(self._id, lg) for lg in np.unique(cols[:, 1]).tolist()])
            else:
                for window, idx in records:
                    rows, positions = window.records_at(idx)
                    tables.delete_records(txn, rows, positions,
                                          window.raw[:ROW_KEY.size] if len(idx) == len(window.keys) else None)
        self._runs.runs[run.run_id] = run
        self._sealed_rows += run.rows
        self._seal_at = self._seal_rows

    def _merge(self, group: list[Run]) -> None:
        """Merge sealed runs into one (engine/topics/topic_merge.py), dropping the rows no
        subscription can see again: the new file first, durably, then one transaction lists it
        and drops the old entries, whose files go once that is synced. Like a seal, it changes
        no answer, so a kill anywhere in between loses nothing."""
        subs = list(self._subs.values())
        fronts = [s.frontier for s in subs]
        marks = [s.mark_delete for s in subs]
        front = min(fronts) if subs and all(f is not None for f in fronts) else None  # type: ignore[type-var]
        mark = min(marks) if subs and all(m is not None for m in marks) else None  # type: ignore[type-var]
        rows = np.concatenate([self._runs.rows_of(run) for run in group])
        rows = kept_rows(rows, self._dead, self._multi, front, mark)  # type: ignore[arg-type]
        rows = rows[np.lexsort((rows[:, 3], rows[:, 2], rows[:, 1], rows[:, 0]))]
        merged = self._runs.write(rows) if len(rows) else None
        before = sum(run.live for run in group)
        with self._write(step="topic_seal_commit") as txn:
            if merged is not None:
                self._runs.put(txn, self._file.runs, merged)
            for run in group:
                self._runs.drop(txn, self._file.runs, run)
            if merged is not None:
                self._runs.runs[merged.run_id] = merged
            gone = before - len(rows)
            self._rows -= gone
            self._sealed_rows -= gone
            self._forget_dead(txn)
            record = {"id": self._id, "next_seq": self._next_seq, "inserted": self._inserted, "rows": self._rows,
                      "cutoff": self._cutoff.value, "config": self._config_record, "applied": self._applied}
            txn.put(self._raw_name, encode_topic(record), db=self._file.topics)
        self._windows.clear()  # the merged windows held the rows of the old runs

    def _forget_dead(self, txn: lmdb.Transaction) -> None:
        """Drop the dead bounds no run can hold a row of any more."""
        runs = list(self._runs.runs.values())
        for pos, bound in list(self._dead.items()):
            if not any(r.seq[0] <= bound and r.min_pos <= pos <= r.max_pos for r in runs):
                del self._dead[pos]
                txn.delete(DEAD_KEY.pack(self._id, *pos), db=self._file.dead)

    def _drop_runs(self, txn: lmdb.Transaction, front: RowKey | None, mark: tuple[int, int] | None,
                   dirty: set[str]) -> None:
        """Drop the runs every subscription is past: each frontier after its last row, or each
        mark-delete at or after its greatest position. Their files go once this is synced."""
        gone: list[Run] = [run for run in self._runs.runs.values()
                           if (front is not None and run.last <= front) or (mark is not None and run.max_pos <= mark)]
        if not gone:
            return
        for run in gone:
            self._runs.drop(txn, self._file.runs, run)
            self._rows -= run.live
            self._sealed_rows -= run.live
        self._windows.clear()  # the merged windows held their rows
        self._forget_dead(txn)
        for pos in [p for p in self._multi if not self._versions(txn, *p)]:
            self._forget_multi(txn, pos, dirty)

    def _drop_rows_upto(self, txn: lmdb.Transaction, bound: RowKey, dirty: set[str]) -> None:
        """Delete the LMDB level's rows at or before ``bound`` in delivery order, a window at a
        time (read afresh: the cached windows hold the runs' rows too, which leave by whole runs,
        :meth:`_drop_runs`)."""
        emptied: set[tuple[int, int]] = set()
        tables = self._file.tables
        for window in self._windows.scan_level(txn, bound):
            hi = int(np.searchsorted(window.keys, packed_key(self._id, bound), side="right"))
            if not hi:
                break
            whole = hi == len(window.keys)
            tables.delete_records(txn, [] if whole else window.row_records(hi), window.position_records(hi),
                                  window.raw[:ROW_KEY.size] if whole else None)
            self._windows.invalidate(int(window.ts[0]))
            self._rows -= hi
            if self._multi:
                emptied.update(p for p in zip(window.ledger[:hi].tolist(), window.entry[:hi].tolist())
                               if p in self._multi)
        for pos in emptied:
            if not self._versions(txn, *pos):
                self._forget_multi(txn, pos, dirty)
