"""Reading a store as rows: which bucket files to read, and their rows as Arrow batches.

No Spark here; :mod:`bucketstore.spark.reader` wraps it as a data source. The
catalog is opened read-only and only while planning, and so is each tracker's
journal (for its durable delivery frontier, shipped to the tasks in the
planned ranges); tasks read ledger files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import pyarrow as pa

from ..errors import CatalogError, StaleSnapshotError
from ..engine.durability.journal import has_journal, read_frontier
from ..engine.store.tracker_record import recorded_durability
from ..format.ledger_file import LedgerReader
from ..format.snapshot import BucketFile, bucket_key, parse_bucket_key
from .schema import READ_ARROW_SCHEMA, signed_view, to_signed
from .store_access import ledger_path, open_catalog_readonly

__all__ = ["SegmentRange", "plan_scan", "read_segment_range", "DEFAULT_PARTITION_BYTES", "DEFAULT_BATCH_ROWS"]

#: Bytes of segments per input partition. Tasks cost a fixed overhead each, so
#: small buckets share a partition and a big bucket is split across several;
#: segment bytes stand in for index counts, which only entry 0 records.
DEFAULT_PARTITION_BYTES = 2 << 20
#: Rows per Arrow batch (segments are concatenated up to about this many).
DEFAULT_BATCH_ROWS = 1 << 16
#: How often planning starts again from a fresh catalog snapshot when a live writer retired
#: a bucket file the snapshot names before its sizes were read.
PLAN_ATTEMPTS = 20


class _Retired(Exception):
    """A file the snapshot names was retired by the writer since: plan again."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


@dataclass(frozen=True, slots=True)
class SegmentRange:
    """Segments ``first..last`` (1-based, inclusive) of one bucket file."""

    tracker: str
    start_ledger: int
    end_ledger: int
    path: str
    first: int
    last: int
    #: Whether the tracker has a journal; without one, ``delivered`` is unknown (null).
    journaled: bool = False
    #: The tracker's durable delivery frontier (timestamp, ledger, entry) at
    #: planning time; None with a journal means nothing was delivered durably.
    frontier: tuple[int, int, int] | None = None


def plan_scan(store: str, trackers: Sequence[str] | None = None,
              partition_bytes: int = DEFAULT_PARTITION_BYTES) -> list[list[SegmentRange]]:
    """Group the segments to read into partitions of about ``partition_bytes``, in tracker then ledger order.

    Reads the catalog read-only (no store lock) and each file's header and
    trailer for its segment sizes, so a file damaged there is reported now, at
    planning. The delivery frontier of each tracker that has buckets is read
    here too, once, without modifying its journal: every range of a tracker
    carries the same frontier, so all of a query's tasks agree on it.

    :param trackers: the trackers to read (default: every one); an unknown name is an error.
    :raises CatalogError: not a store, an unknown tracker, a key naming a missing file (one
        still named by a snapshot taken after it was found gone: a file a live writer retired
        meanwhile makes the planning start again from a newer snapshot).
    :raises CorruptLedgerError: a bucket file's header or trailer is damaged.
    :raises JournalError: a tracker's journal is damaged (not just a torn tail).
    :raises StaleSnapshotError: the writer retired files faster than :data:`PLAN_ATTEMPTS`
        snapshots could be planned.
    """
    if partition_bytes < 1:
        raise ValueError("partition_bytes must be at least 1")
    store = os.path.abspath(store)
    retired = ""
    for _ in range(PLAN_ATTEMPTS):
        try:
            return _plan_once(store, trackers, partition_bytes)
        except _Retired as gone:  # a merge, delivery or trim beside us: a newer snapshot plans it
            retired = gone.path
    raise StaleSnapshotError(f"{store}: the store's writer retired bucket files faster than the scan could be "
                             f"planned ({PLAN_ATTEMPTS} snapshots; the last one gone: {retired})", path=retired)


def _plan_once(store: str, trackers: Sequence[str] | None, partition_bytes: int) -> list[list[SegmentRange]]:
    """:func:`plan_scan` from one catalog snapshot; :class:`_Retired` when a file it names is gone
    and a newer snapshot no longer names it."""
    catalog = open_catalog_readonly(store)
    try:
        known = catalog.tracker_names()
        names = list(known) if trackers is None else list(trackers)
        unknown = [n for n in names if n not in known]
        if unknown:
            raise CatalogError(f"{store}: no tracker named {', '.join(map(repr, unknown))} "
                               f"(the store has {', '.join(map(repr, known)) or 'none'})", path=store)
        keyed = [(name, catalog.buckets(name)) for name in names]
        modes = {name: recorded_durability(catalog.tracker_state(name), store, name) for name in names}
    finally:
        catalog.close()
    partitions: list[list[SegmentRange]] = []
    current: list[SegmentRange] = []
    filled = 0
    for name, buckets in keyed:
        if not buckets:
            # No rows to mark: its journal (journal mode keeps one even for a
            # tracker that never sealed) is not read, so it cannot fail the query.
            continue
        # read_frontier's None means either "no journal" or "nothing delivered";
        # the column tells them apart (null: unknown, False: not delivered).
        # A tracker recorded as sealed has no journal of its own: files there are a deleted
        # tracker's of that name, whose frontier says nothing about these rows.
        journaled = modes[name] != "sealed" and has_journal(store, name)
        frontier = read_frontier(store, name) if journaled else None
        for key, ledger_id in sorted(buckets.items(), key=lambda kv: parse_bucket_key(kv[0])):
            start, end = parse_bucket_key(key)
            path = ledger_path(store, ledger_id)
            sizes = _segment_sizes(store, path, name, key, ledger_id)
            first = 1
            for number, size in enumerate(sizes, start=1):
                filled += size
                if filled >= partition_bytes:
                    current.append(SegmentRange(name, start, end, path, first, number, journaled, frontier))
                    partitions.append(current)
                    current, filled, first = [], 0, number + 1
            if first <= len(sizes):
                current.append(SegmentRange(name, start, end, path, first, len(sizes), journaled, frontier))
    if current:
        partitions.append(current)
    return partitions


def _segment_sizes(store: str, path: str, tracker: str, key: str, ledger_id: int) -> list[int]:
    try:
        with LedgerReader(path) as reader:
            return [reader.entry_size(k) for k in range(1, reader.entry_count)]
    except FileNotFoundError:
        if not _still_named(store, tracker, key, ledger_id):
            raise _Retired(path) from None
        raise CatalogError(f"tracker {tracker!r}: catalog key {key} names {path}, which is missing",
                           path=path, key=key) from None


def _still_named(store: str, tracker: str, key: str, ledger_id: int) -> bool:
    """Whether a catalog snapshot taken now still names ``ledger_id`` under ``key``: a missing file
    still named is damage; one no longer named was retired (key first, file second) meanwhile."""
    catalog = open_catalog_readonly(store)
    try:
        return catalog.buckets(tracker).get(key) == ledger_id
    finally:
        catalog.close()


def read_segment_range(part: SegmentRange, batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Yield the rows of a segment range as Arrow batches of :data:`READ_ARROW_SCHEMA`.

    :raises CorruptLedgerError: the file is damaged (naming the file and offset).
    :raises CatalogError: the file holds another ledger range than its catalog key, or is
        missing while the catalog still names it.
    :raises StaleSnapshotError: a live writer retired the file since the scan was planned.
    """
    pending: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    rows = 0
    try:
        bucket = BucketFile(part.path)
    except FileNotFoundError:
        _raise_missing(part)
    with bucket:
        meta = bucket.metadata
        if (meta.start_ledger, meta.end_ledger) != (part.start_ledger, part.end_ledger):
            raise CatalogError(f"{part.path} holds ledgers [{meta.start_ledger}, {meta.end_ledger}] but its catalog "
                               f"key says [{part.start_ledger}, {part.end_ledger}]", path=part.path)
        if part.last > bucket.segment_count:
            raise CatalogError(f"{part.path} has {bucket.segment_count} segments, fewer than planned "
                               f"({part.last}); was it replaced while being read?", path=part.path)
        for number in range(part.first, part.last + 1):
            seg = bucket.read_segment(number)
            pending.append((number, seg.timestamps, seg.ledger_ids, seg.entry_ids))
            rows += len(seg)
            if rows >= batch_rows:
                yield _batch(part, pending)
                pending, rows = [], 0
    if pending:
        yield _batch(part, pending)


def _raise_missing(part: SegmentRange) -> NoReturn:
    """A planned file is gone: retired by a live writer since the plan (typed, the query may be run
    again), or damage when the catalog still names it."""
    store = os.path.dirname(os.path.dirname(part.path))
    key = bucket_key(part.start_ledger, part.end_ledger)
    ledger_id = int(os.path.basename(part.path).split(".")[0])
    if _still_named(store, part.tracker, key, ledger_id):
        raise CatalogError(f"tracker {part.tracker!r}: catalog key {key} names {part.path}, which is missing",
                           path=part.path, key=key)
    raise StaleSnapshotError(f"{part.path}: tracker {part.tracker!r} bucket {key} was retired by the store's "
                             "writer after the scan was planned; run the query again to read a newer snapshot",
                             path=part.path)


def _batch(part: SegmentRange, segments: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]) -> pa.RecordBatch:
    counts = [len(ts) for _, ts, _, _ in segments]
    n = sum(counts)
    numbers = np.repeat(np.array([number for number, _, _, _ in segments], dtype=np.int32), counts)
    ts = np.concatenate([ts for _, ts, _, _ in segments])
    ledgers = np.concatenate([ls for _, _, ls, _ in segments])
    entries = np.concatenate([es for _, _, _, es in segments])
    columns = [
        _repeated(part.tracker, n),
        pa.array(np.full(n, to_signed(part.start_ledger), dtype=np.int64)),
        pa.array(np.full(n, to_signed(part.end_ledger), dtype=np.int64)),
        _repeated(part.path, n),
        pa.array(numbers),
        pa.array(signed_view(ts)),
        pa.array(signed_view(ledgers)),
        pa.array(signed_view(entries)),
        _delivered(part, ts, ledgers, entries),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=READ_ARROW_SCHEMA)


def _delivered(part: SegmentRange, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> pa.Array:
    """The ``delivered`` column: key at or before the frontier; all null without a journal."""
    n = len(ts)
    if not part.journaled:
        return pa.nulls(n, pa.bool_())
    if part.frontier is None:  # a journal, and no delivery recorded in it
        return pa.array(np.zeros(n, dtype=bool))
    # Compared on the uint64 arrays, before the signed view: a signed compare
    # would put ids and times of 2**63 and more before every small one.
    t, l, e = (np.uint64(v) for v in part.frontier)
    return pa.array((ts < t) | ((ts == t) & ((ledgers < l) | ((ledgers == l) & (entries <= e)))))


def _repeated(value: str, n: int) -> pa.Array:
    """A string column holding ``value`` n times, built from buffers rather than n Python strings."""
    raw = value.encode("utf-8")
    # pa.string() has int32 offsets: a batch (64k rows) of paths (4 KiB at most) stays far below 2 GiB.
    if len(raw) * n >= 1 << 31:
        raise ValueError(f"a batch of {n} rows of a {len(raw)}-byte string exceeds 2 GiB; lower the batch size")
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])
