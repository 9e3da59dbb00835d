"""A topic's sealed runs: immutable files of rows (``formats/topic_runs.md``, ``docs/topics.md``).

The topic's LMDB tables are its mutable level; once they hold enough rows that are not due,
those rows are sealed into a run (:mod:`~bucketstore.format.topic_run`) in ``STORE/topics/runs/``:
the file is written, fsynced and renamed into place first, then one LMDB transaction lists it
in the ``runs`` table and deletes its rows from the level. A kill between the two leaves a file
no entry names, removed at the next open (the rows are still in LMDB). A run leaves once every
subscription is past it: its entry is deleted in a transaction, and the file unlinked only after
that transaction is synced (:meth:`RunSet.unlink_dropped`).

Only a run's catalog entry is held at open; its directory, segments and bitmaps are read when a
delivery, a lookup or a figure first needs them, and cached in the store's window budget
(:class:`~bucketstore.engine.topics.topic_windows.WindowBudget`), least recently used out first.
"""

from __future__ import annotations

import heapq
import os
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import lmdb
import numpy as np
from pyroaring import BitMap64

from ...errors import CatalogError
from ...format.fs import FileSystem
from ...format.topic_codec import RUN_KEY, WINDOW_BITS, decode_run_record, encode_run_record, topic_prefix
from ...format.topic_run import (HEADER, TRAILER, RunDirectory, TopicRunError, decode_bitmaps, decode_directory,
                                 decode_segment, decode_trailer, encode_run, run_file_name)
from .subscription_state import RowKey
from .topic_windows import WindowBudget

_U32_LIMIT = 1 << 32

__all__ = ["Run", "RunSet", "runs_directory"]

Position = tuple[int, int]


def runs_directory(topics_path: str) -> str:
    return os.path.join(topics_path, "runs")


def _extreme_position(cols: np.ndarray, pick: Any) -> Position:
    """The least (``pick=min``) or greatest (``max``) position of rows in delivery order: two
    passes over the columns, where sorting them by position cost a seal and a merge more than
    the rest of their bookkeeping."""
    ledgers = cols[:, 1]
    ledger = ledgers.min() if pick is min else ledgers.max()
    entries = cols[ledgers == ledger, 2]
    return int(ledger), int(entries.min() if pick is min else entries.max())


@dataclass
class Run:
    """A sealed run's catalog entry, and what was read of its file."""

    run_id: int
    rows: int
    killed: int
    first: RowKey
    last: RowKey
    min_pos: Position
    max_pos: Position
    seq: tuple[int, int]
    directory: RunDirectory | None = field(default=None, repr=False)
    #: Per segment, the window number (deliver_at >> 12) of its first and of its last row.
    seg_first: list[int] = field(default_factory=list, repr=False)
    seg_last: list[int] = field(default_factory=list, repr=False)

    def record(self) -> dict[str, Any]:
        return {"rows": self.rows, "killed": self.killed, "first": list(self.first), "last": list(self.last),
                "min_pos": list(self.min_pos), "max_pos": list(self.max_pos), "seq": list(self.seq)}

    @property
    def live(self) -> int:
        return self.rows - self.killed


class _Held:
    """Something read from a run, in the window budget (which counts ``nbytes``)."""

    __slots__ = ("value", "nbytes")

    def __init__(self, value: Any, nbytes: int) -> None:
        self.value = value
        self.nbytes = nbytes


class RunSet:
    """The sealed runs of one topic (``tid``), read through ``fs`` from ``directory``."""

    def __init__(self, directory: str, tid: int, budget: WindowBudget, fs: FileSystem) -> None:
        self.directory = directory
        self.tid = tid
        self._budget = budget
        self._fs = fs
        self.runs: dict[int, Run] = {}
        self.next_id = 0
        #: Files of runs whose entries were deleted: unlinked once that deletion is synced.
        self.dropped: list[str] = []

    # -- the catalog ----------------------------------------------------------------------------
    def load(self, txn: lmdb.Transaction, db: object) -> None:
        prefix = topic_prefix(self.tid)
        with txn.cursor(db=db) as cur:
            if cur.set_range(prefix):
                for key, value in cur:
                    if not key.startswith(prefix):
                        break
                    run_id = RUN_KEY.unpack(key)[1]
                    r = decode_run_record(value)
                    self.runs[run_id] = Run(run_id, r["rows"], r["killed"], r["first"], r["last"], r["min_pos"],
                                            r["max_pos"], r["seq"])
                    self.next_id = max(self.next_id, run_id + 1)

    def path(self, run_id: int) -> str:
        return os.path.join(self.directory, run_file_name(self.tid, run_id))

    def remove_orphans(self) -> None:
        """Unlink this topic's files that no entry names: a seal killed before its commit, or a
        run dropped whose unlink did not happen. Their rows are in LMDB, or were passed by all."""
        if not os.path.isdir(self.directory):
            return
        keep = {run_file_name(self.tid, r) for r in self.runs}
        mine = f"{self.tid:010d}-"
        gone = [f for f in os.listdir(self.directory) if f.startswith(mine) and f not in keep]
        for name in gone:
            self._fs.unlink(os.path.join(self.directory, name))
        if gone:
            self._fs.fsync_dir(self.directory)

    def write(self, cols: np.ndarray) -> Run:
        """Write a run of ``cols`` ((n, 4) rows sorted in delivery order) durably under its final
        name (written, fsynced, renamed, directory fsynced); its entry is the caller's to commit."""
        run_id = self.next_id
        self.next_id += 1
        fs = self._fs
        if not os.path.isdir(self.directory):
            os.mkdir(self.directory)
            fs.fsync_dir(os.path.dirname(self.directory))  # the directory's own name, durable
        data = encode_run(self.tid, run_id, cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3])
        final = self.path(run_id)
        tmp = final + ".tmp"
        if os.path.exists(tmp):  # a seal killed before its rename
            fs.unlink(tmp)
        fd = fs.create(tmp)
        try:
            fs.write(fd, data)
            fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.rename(tmp, final)
        fs.fsync_dir(self.directory)
        return Run(run_id, len(cols), 0, tuple(int(x) for x in cols[0]), tuple(int(x) for x in cols[-1]),
                   _extreme_position(cols, min), _extreme_position(cols, max),
                   (int(cols[:, 3].min()), int(cols[:, 3].max())))

    def put(self, txn: lmdb.Transaction, db: object, run: Run) -> None:
        txn.put(RUN_KEY.pack(self.tid, run.run_id), encode_run_record(run.record()), db=db)

    def drop(self, txn: lmdb.Transaction, db: object, run: Run) -> None:
        txn.delete(RUN_KEY.pack(self.tid, run.run_id), db=db)
        del self.runs[run.run_id]
        self.dropped.append(self.path(run.run_id))
        for key in [k for k in self._budget.windows if k[0] == self.tid and isinstance(k[1], tuple)
                    and k[1][1] == run.run_id]:
            self._budget.drop(key)

    def unlink_dropped(self) -> None:
        """Unlink the files of dropped runs: call only once their deletion is synced."""
        if not self.dropped:
            return
        for path in self.dropped:
            if os.path.exists(path):
                self._fs.unlink(path)
        self._fs.fsync_dir(self.directory)
        self.dropped = []

    # -- reading files --------------------------------------------------------------------------
    def _fail(self, run: Run, exc: Exception) -> CatalogError:
        path = self.path(run.run_id)
        return CatalogError(f"{path}: {exc}", path=path)

    def _read(self, path: str, length: int, offset: int) -> bytes:
        fd = self._fs.open_read(path)
        try:
            return self._fs.pread(fd, length, offset)
        finally:
            self._fs.close(fd)

    def _dir(self, run: Run) -> RunDirectory:
        if run.directory is None:
            held = self._budget.get((self.tid, ("dir", run.run_id)))  # type: ignore[arg-type]
            if held is not None:  # read by another view of the same topic (the writer's)
                d = held.value
                run.directory = d
                run.seg_first = [s.first_ts >> WINDOW_BITS for s in d.segments]
                run.seg_last = [s.last_ts >> WINDOW_BITS for s in d.segments]
                return d
            path = self.path(run.run_id)
            try:
                size = os.path.getsize(path)
                header = self._read(path, HEADER.size, 0)
                trailer = decode_trailer(self._read(path, TRAILER.size, max(0, size - TRAILER.size)), size)
                d = decode_directory(header, self._read(path, trailer[1], trailer[0]), trailer)
            except (OSError, TopicRunError) as exc:
                raise self._fail(run, exc) from None
            if d.topic_id != self.tid or d.run_id != run.run_id or d.rows != run.rows:
                raise self._fail(run, TopicRunError(f"file of topic {d.topic_id} run {d.run_id} with {d.rows} rows, "
                                                    f"its entry says topic {self.tid} run {run.run_id}, {run.rows}"))
            run.directory = d
            run.seg_first = [s.first_ts >> WINDOW_BITS for s in d.segments]
            run.seg_last = [s.last_ts >> WINDOW_BITS for s in d.segments]
            self._budget.put((self.tid, ("dir", run.run_id)), _Held(d, 64 * len(d.segments) + 256))  # type: ignore[arg-type]
        return run.directory

    def segments_of(self, run: Run) -> list[Any]:
        """The run's segment entries (their times and row counts), read once."""
        return list(self._dir(run).segments)

    def segment(self, run: Run, i: int) -> np.ndarray:
        """Segment ``i`` of the run, (n, 4) uint64 rows in delivery order."""
        key = (self.tid, ("seg", run.run_id, i))
        held = self._budget.get(key)  # type: ignore[arg-type]
        if held is None:
            entry = self._dir(run).segments[i]
            try:
                rows = decode_segment(self._read(self.path(run.run_id), entry.length, entry.offset), entry)
            except (OSError, TopicRunError) as exc:
                raise self._fail(run, exc) from None
            held = _Held(rows, rows.nbytes)
            self._budget.put(key, held)  # type: ignore[arg-type]
        return held.value

    def _keys(self, run: Run, what: str, i: int, rows: np.ndarray, cols: tuple[int, ...]) -> np.ndarray:
        """``rows``' columns ``cols`` as sortable bytes (big-endian), cached with the rows: the
        binary searches of a figure or a lookup then cost log n, not a pass to pack them."""
        key = (self.tid, (what, run.run_id, i))
        held = self._budget.get(key)  # type: ignore[arg-type]
        if held is None:
            keys = np.ascontiguousarray(rows[:, list(cols)].astype(">u8")).view(f"S{8 * len(cols)}").ravel()
            held = _Held(keys, keys.nbytes)
            self._budget.put(key, held)  # type: ignore[arg-type]
        return held.value

    def search(self, run: Run, i: int, key: RowKey, side: str) -> int:
        """Where row ``key`` goes in segment ``i`` of the run (delivery order)."""
        keys = self._keys(run, "skey", i, self.segment(run, i), (0, 1, 2, 3))
        return int(np.searchsorted(keys, np.array(key, dtype=">u8").tobytes(), side=side))  # type: ignore[call-overload]

    def search_position(self, run: Run, pos: tuple[int, ...], side: str) -> int:
        """Where position ``pos`` ((ledger, entry), or with a seq) goes in the run's rows in
        acknowledgement order (:meth:`_by_position`)."""
        keys = self._keys(run, "pkey", 0, self._by_position(run), (1, 2, 3))
        probe = np.array(pos, dtype=">u8").tobytes()
        if len(pos) < 3:  # a prefix: pad to the first (side="left") or past the last (right) seq
            probe += (b"\x00" if side == "left" else b"\xff") * 8 * (3 - len(pos))
        return int(np.searchsorted(keys, probe, side=side))  # type: ignore[call-overload]

    def rows_of(self, run: Run) -> np.ndarray:
        """Every row of the run in delivery order (a figure's or a lookup's read)."""
        return np.concatenate([self.segment(run, i) for i in range(len(self._dir(run).segments))])

    def _bitmaps(self, run: Run) -> dict[int, Any]:
        key = (self.tid, ("bm", run.run_id))
        held = self._budget.get(key)  # type: ignore[arg-type]
        if held is None:
            offset, length, crc = self._dir(run).bitmaps
            try:
                bitmaps = decode_bitmaps(self._read(self.path(run.run_id), length, offset), offset, crc)
            except (OSError, TopicRunError) as exc:
                raise self._fail(run, exc) from None
            held = _Held(bitmaps, length + 64 * len(bitmaps))
            self._budget.put(key, held)  # type: ignore[arg-type]
        return held.value

    def _by_position(self, run: Run) -> np.ndarray:
        """The run's rows in acknowledgement order (ledger, entry, seq)."""
        key = (self.tid, ("pos", run.run_id))
        held = self._budget.get(key)  # type: ignore[arg-type]
        if held is None:
            rows = self.rows_of(run)
            rows = rows[np.lexsort((rows[:, 3], rows[:, 2], rows[:, 1]))]
            held = _Held(rows, rows.nbytes)
            self._budget.put(key, held)  # type: ignore[arg-type]
        return held.value

    # -- lookups --------------------------------------------------------------------------------
    def holds(self, run: Run, ledger: int, entry: int) -> bool:
        """Whether the run has a row of the position: its range, then its bitmaps."""
        if not run.min_pos <= (ledger, entry) <= run.max_pos:
            return False
        bitmap = self._bitmaps(run).get(ledger)
        # A ledger whose ids all fit 32 bits has a 32-bit bitmap, which cannot be asked of a wider id.
        return bitmap is not None and (entry < _U32_LIMIT or isinstance(bitmap, BitMap64)) and entry in bitmap

    def count_positions(self, run: Run, after: Position | None, upto: Position) -> int:
        """The run's positions after ``after`` (all when None) and at or before ``upto``, by its
        bitmaps (each position once, whatever its rows in the run)."""
        def upto_entry(bitmap: Any, entry: int) -> int:  # its entries at or before ``entry``
            if entry >= _U32_LIMIT and not isinstance(bitmap, BitMap64):
                return len(bitmap)
            return int(bitmap.rank(entry))
        n = 0
        for ledger, bitmap in self._bitmaps(run).items():
            if (after is not None and ledger < after[0]) or ledger > upto[0]:
                continue
            n += upto_entry(bitmap, upto[1]) if ledger == upto[0] else len(bitmap)
            if after is not None and ledger == after[0]:
                n -= upto_entry(bitmap, after[1])
        return n

    def versions(self, ledger: int, entry: int) -> list[tuple[int, int, int]]:
        """(seq, deliver_at, run id) of every row of the position in a run."""
        out = []
        for run in self.runs.values():
            if self.holds(run, ledger, entry):
                rows = self._by_position(run)
                lo = self.search_position(run, (ledger, entry), "left")
                hi = self.search_position(run, (ledger, entry), "right")
                out.extend((int(r[3]), int(r[0]), run.run_id) for r in rows[lo:hi])
        return out

    def positions_after(self, after: Position | None, upto: Position | None = None) -> Iterator[RowKey]:
        """Every run row whose position is after ``after`` (all when None), in acknowledgement
        order; runs whose positions all lie past ``upto`` are not read (nor yielded)."""
        parts = [self._positions_of(run, after) for run in self.runs.values()
                 if (after is None or run.max_pos > after) and (upto is None or run.min_pos <= upto)]
        for ledger, entry, seq, ts in heapq.merge(*parts):
            yield ts, ledger, entry, seq

    def _positions_of(self, run: Run, after: Position | None) -> Iterator[tuple[int, int, int, int]]:
        rows = self._by_position(run)  # read when the merge first asks, not before
        lo = 0 if after is None else self.search_position(run, after, "right")
        yield from _chunked(rows[lo:], (1, 2, 3, 0))  # type: ignore[misc]

    # -- delivery order -------------------------------------------------------------------------
    def next_window(self, n: int) -> int | None:
        """The least window number at or after ``n`` holding a run row, or None."""
        best = None
        for run in self.runs.values():
            if run.last[0] >> WINDOW_BITS < n or (best is not None and run.first[0] >> WINDOW_BITS >= best):
                continue
            self._dir(run)
            i = bisect_left(run.seg_last, n)
            if run.seg_first[i] >= n:
                found = run.seg_first[i]
            else:
                ts = self.segment(run, i)[:, 0]
                found = int(ts[int(np.searchsorted(ts, np.uint64(n << WINDOW_BITS)))]) >> WINDOW_BITS
            if best is None or found < best:
                best = found
        return best

    def window_rows(self, number: int) -> list[np.ndarray]:
        """The run rows of window ``number``, one sorted (n, 4) block per run that has any."""
        lo_ts, hi_ts = np.uint64(number << WINDOW_BITS), np.uint64((number + 1) << WINDOW_BITS)
        out = []
        for run in self.runs.values():
            if not run.first[0] >> WINDOW_BITS <= number <= run.last[0] >> WINDOW_BITS:
                continue
            self._dir(run)
            i = bisect_left(run.seg_last, number)
            while i < len(run.seg_first) and run.seg_first[i] <= number:
                rows = self.segment(run, i)
                ts = rows[:, 0]
                a, b = int(np.searchsorted(ts, lo_ts)), int(np.searchsorted(ts, hi_ts))
                if a < b:
                    out.append(rows[a:b])
                i += 1
        return out

    def rows_after(self, after: RowKey | None) -> Iterator[RowKey]:
        """Every run row after ``after`` (all when None), in delivery order."""
        parts = [self._run_after(run, after) for run in self.runs.values() if after is None or run.last > after]
        return heapq.merge(*parts)

    def _run_after(self, run: Run, after: RowKey | None) -> Iterator[RowKey]:
        d = self._dir(run)
        for i in range(len(d.segments)):
            if after is not None and d.segments[i].last_ts < after[0]:
                continue
            rows = self.segment(run, i)
            lo = 0 if after is None else self.search(run, i, after, "right")
            yield from _chunked(rows[lo:], (0, 1, 2, 3))

    def count_between(self, after: RowKey | None, upto: RowKey | None) -> int:
        """Run rows after ``after`` and at or before ``upto`` (None: no bound): whole runs by
        their entry, segments wholly inside by their row count, two binary searches for the rest."""
        return sum(self.count_run(run, after, upto) for run in self.runs.values())

    def count_run(self, run: Run, after: RowKey | None, upto: RowKey | None) -> int:
        """:meth:`count_between` of one run."""
        if (after is not None and run.last <= after) or (upto is not None and run.first > upto):
            return 0
        if (after is None or run.first > after) and (upto is None or run.last <= upto):
            return run.rows
        n = 0
        for i, seg in enumerate(self._dir(run).segments):
            if (after is not None and seg.last_ts < after[0]) or (upto is not None and seg.first_ts > upto[0]):
                continue
            if (after is None or seg.first_ts > after[0]) and (upto is None or seg.last_ts < upto[0]):
                n += seg.rows
                continue
            lo = 0 if after is None else self.search(run, i, after, "right")
            hi = seg.rows if upto is None else self.search(run, i, upto, "right")
            n += max(0, hi - lo)
        return n


def _chunked(rows: np.ndarray, order: tuple[int, int, int, int]) -> Iterator[RowKey]:
    """The rows as tuples of the columns ``order``, a few hundred at a time (a reader that stops
    at the first it wants converts no more)."""
    cols = list(order)
    for lo in range(0, len(rows), 256):
        for r in rows[lo:lo + 256][:, cols].tolist():
            yield tuple(r)  # type: ignore[misc]
