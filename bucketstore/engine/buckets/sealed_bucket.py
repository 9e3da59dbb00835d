"""A sealed (immutable) bucket as the tracker holds it in memory.

Only what delivery needs stays resident: the ledger range, the file's path and
ledger id, and per segment its min/max timestamp and count (three small numpy
arrays). The per-ledger bitmaps of entry 0 are OR-ed into the tracker-wide
index on seal or recovery and then dropped; the segments are read one at a
time, when the shared queue reaches them.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from collections.abc import Callable

import numpy as np
from pyroaring import BitMap64
from sortedcontainers import SortedDict

from ...errors import CorruptLedgerError
from ...format.bucket_summary import BucketSummary, prefix_mismatch
from ...format.fs import REAL_FS, FileSystem
from ...format.ledger_file import LedgerReader
from ...format.snapshot import (BucketMetadata, EntryBitmap, bucket_key, ledger_bitmaps, read_segment_entry,
                               union_bitmaps)
from ..queue.shared_queue import Run

__all__ = ["SealedBucket", "BucketMap", "split_positions"]


class SealedBucket:
    """One sealed bucket: ledgers ``[start_ledger, end_ledger]`` stored as ledger file ``ledger_id``.

    :ivar current: the last segment handed to the queue (1-based; 0 = none yet).
    :ivar dead: set once the bucket is deleted or merged away; the queue then
        ignores its runs and slots.
    :ivar ahead: the read-ahead of a later segment, if one was asked for
        (:class:`~bucketstore.engine.buckets.read_ahead.SegmentRead`; see ``read_ahead``).
    :ivar head: the catalog summary whose prefix (segment 1's first rows) the queue holds as
        a run of their own (see :mod:`~bucketstore.engine.buckets.bucket_prefix`), until segment 1 is
        read: its load then hands over only the rows after the prefix. None: no prefix queued.
    :ivar held_rows: rows of segments that ``sealed`` recovery skipped as already due
        and that no one has received: the file is their only copy until the embedder's
        replay is done or mark-delete passes the bucket, so it is neither deleted nor
        merged before then (0: nothing held).
    """

    __slots__ = ("start_ledger", "end_ledger", "ledger_id", "path", "size", "min_ts", "max_ts", "counts",
                 "current", "dead", "merging", "ahead", "_on_load", "summary", "held_rows", "head", "fs",
                 "paged")

    def __init__(self, path: str, ledger_id: int, meta: BucketMetadata, size: int, *,
                 first_segment: int = 1, on_load: Callable[[float, bool], None] | None = None,
                 fs: FileSystem = REAL_FS) -> None:
        self.start_ledger = meta.start_ledger
        self.end_ledger = meta.end_ledger
        self.ledger_id = ledger_id
        self.path = path
        self.size = size
        self.min_ts = np.array([s.min_timestamp for s in meta.segments], dtype=np.uint64)
        self.max_ts = np.array([s.max_timestamp for s in meta.segments], dtype=np.uint64)
        self.counts = np.array([s.count for s in meta.segments], dtype=np.int64)
        self.current = first_segment - 1
        self.dead = False
        self.merging = False
        self.ahead = None
        self.held_rows = 0
        self.head: BucketSummary | None = None
        self._on_load = on_load
        self.fs = fs  # the file layer its segments are read through
        #: The catalog's summary while entry 0 is unread (the bucket is *unopened*: its
        #: positions are not in the tracker's index yet); None once opened.
        self.summary: BucketSummary | None = None
        #: While the bucket's positions are paged out of the tracker's index (to the membership
        #: spill, see ``index_pager``): how many there are; None while they are in the index.
        self.paged: int | None = None

    @classmethod
    def unopened(cls, path: str, ledger_id: int, start: int, end: int, summary: BucketSummary, *,
                 first_segment: int = 1, on_load: Callable[[float, bool], None] | None = None,
                 fs: FileSystem = REAL_FS) -> "SealedBucket":
        """A bucket known from its catalog summary only; its entry 0 is read when it is first needed."""
        b = cls.__new__(cls)
        b.start_ledger, b.end_ledger, b.ledger_id, b.path, b.size = start, end, ledger_id, path, summary.size
        # min_ts, max_ts and counts stay unset until first read (__getattr__ decodes them from
        # the summary): most buckets of a large store are never looked at before they are due.
        b.current = first_segment - 1
        b.dead = b.merging = False
        b.ahead = None
        b.held_rows = 0
        b.head = None
        b._on_load = on_load
        b.fs = fs
        b.summary = summary
        b.paged = None
        return b

    def __getattr__(self, name: str):
        # Only reached for an unset slot: the segment table of a bucket recovered from its summary.
        if name in ("min_ts", "max_ts", "counts") and self.summary is not None:
            self.min_ts, self.max_ts, self.counts = self.summary.table()
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def opened(self) -> bool:
        """Whether entry 0 has been read and the bucket's positions are in the tracker's index
        (not paged out)."""
        return self.summary is None and self.paged is None

    @property
    def key(self) -> str:
        """The bucket's cursor-property key."""
        return bucket_key(self.start_ledger, self.end_ledger)

    @property
    def segment_count(self) -> int:
        summary = self.summary
        return summary.segments if summary is not None else len(self.counts)

    @property
    def pending_indexes(self) -> int:
        """Indexes in segments not yet handed to the queue (an upper bound on what is left on disk)."""
        summary = self.summary
        if summary is not None and self.current == 0:
            # Prefix rows queued from the summary are in the tracker's index already.
            return summary.count - (self.head.prefix_rows if self.head is not None else 0)
        return int(self.counts[self.current:].sum())

    def covers(self, ledger_id: int) -> bool:
        return self.start_ledger <= ledger_id <= self.end_ledger

    def has_next_segment(self) -> bool:
        return self.current < self.segment_count

    def next_segment_ready(self) -> bool:
        """Whether the next segment was read ahead and waits to be taken (no disk read then).
        Never for an unopened bucket: taking it would read entry 0 under the lock first."""
        if self.summary is not None:
            return False
        a = self.ahead
        return a is not None and a.done and a.run is not None and a.number == self.current + 1

    def next_segment_min_ts(self) -> int:
        """The first timestamp not yet handed to the queue (after the prefix, if one is queued)."""
        if self.current == 0 and self.head is not None:
            return self.head.prefix_next
        summary = self.summary
        if summary is not None and self.current == 0:
            return summary.first_min
        return int(self.min_ts[self.current])

    def read_segment(self, number: int) -> Run:
        """Read segment ``number`` (1-based) from the ledger file as a run.

        Uses only what never changes after construction (path, ids, per-segment
        counts and timestamps): the read-ahead thread calls it with no lock held."""
        with LedgerReader(self.path, fs=self.fs) as reader:
            # The file is opened anew for every segment: check it is still the ledger
            # recovery or the seal registered (a file swapped underneath would otherwise
            # deliver another bucket's positions).
            props = reader.properties
            if reader.ledger_id != self.ledger_id or (props.get("start_ledger"), props.get("end_ledger")) \
                    != (self.start_ledger, self.end_ledger):
                raise CorruptLedgerError(self.path, 0, f"header says ledger {reader.ledger_id} holding ledgers "
                                         f"[{props.get('start_ledger')}, {props.get('end_ledger')}], but the "
                                         f"catalog entry is ledger {self.ledger_id} holding "
                                         f"[{self.start_ledger}, {self.end_ledger}]")
            if number > reader.entry_count - 1:
                raise CorruptLedgerError(self.path, reader.trailer_offset,
                                         f"segment {number} is missing: the ledger holds {reader.entry_count} entries")
            seg = read_segment_entry(reader, number, int(self.counts[number - 1]), int(self.min_ts[number - 1]),
                                     int(self.max_ts[number - 1]))
        return Run(seg.timestamps, seg.ledger_ids, seg.entry_ids, owner=self)

    def load_next_segment(self) -> Run:
        """Read the next segment and advance :attr:`current`. On failure nothing changes,
        so the next attempt reads the same segment again."""
        number = self.current + 1
        started = time.perf_counter()
        try:
            run = self._past_head(number, self.read_segment(number))
        except (OSError, CorruptLedgerError):
            if self._on_load:
                self._on_load(time.perf_counter() - started, False)
            raise
        self.current = number
        if self._on_load:
            self._on_load(time.perf_counter() - started, True)
        return run

    def adopt(self, number: int, run: Run) -> Run:
        """Take segment ``number``, read ahead off the lock, as the next segment (it must be
        ``current + 1``). Recorded as a load that cost the caller nothing."""
        assert number == self.current + 1, (number, self.current)
        run = self._past_head(number, run)
        self.current = number
        if self._on_load:
            self._on_load(0.0, True)
        return run

    def _past_head(self, number: int, run: Run) -> Run:
        """Segment 1 without the prefix rows the queue took from the summary (checked against
        the file: they were delivered on the summary's word). Other segments unchanged."""
        head = self.head
        if number != 1 or head is None:
            return run
        self.check_prefix(head, run)
        self.head = None
        k = head.prefix_rows
        return Run(run.ts[k:], run.ledgers[k:], run.entries[k:], owner=self)

    def check_prefix(self, summary: BucketSummary, run: Run) -> None:
        """Raise :class:`~bucketstore.CorruptLedgerError` at segment 1's offset when ``run`` (segment 1
        as read from the file) disagrees with the prefix rows ``summary`` keeps."""
        why = prefix_mismatch(summary, run.ts, run.ledgers, run.entries)
        if why is not None:
            raise CorruptLedgerError(self.path, _payload_offset(self.path, 1), f"bucket {self.key}: {why}")

    def file_exists(self) -> bool:
        return os.path.exists(self.path)

    def __repr__(self) -> str:
        return (f"SealedBucket([{self.start_ledger}, {self.end_ledger}], ledger {self.ledger_id}, "
                f"segment {self.current}/{self.segment_count})")


def _payload_offset(path: str, entry: int) -> int:
    """Where entry ``entry``'s payload starts in the file (0 when the file cannot say: an error path)."""
    try:
        with LedgerReader(path) as reader:
            return reader.entry_payload_offset(entry)
    except (OSError, CorruptLedgerError):
        return 0


def split_positions(bucket: SealedBucket, meta: BucketMetadata, skip: int, need_skipped: bool
                    ) -> tuple[dict[int, EntryBitmap], dict[int, EntryBitmap] | None]:
    """The positions of segments ``skip+1..N`` (live) and, when asked, of ``1..skip`` (skipped).

    Version 1 records each segment's bitmaps; version 2 records the bucket's, so
    one side is decoded from its segments and the other is the difference. The
    side decoded is the smaller one, unless the skipped positions are wanted.
    """
    if meta.version == 1:
        return (union_bitmaps(s.bitmaps for s in meta.segments[skip:]),
                union_bitmaps(s.bitmaps for s in meta.segments[:skip]) if need_skipped else None)
    if skip == 0:
        return meta.bitmaps, ({} if need_skipped else None)
    total = int(bucket.counts.sum())
    skipped_count = int(bucket.counts[:skip].sum())
    if need_skipped or skipped_count <= total - skipped_count:
        skipped = _decoded(bucket, range(1, skip + 1))
        return _difference(meta.bitmaps, skipped), (skipped if need_skipped else None)
    live = _decoded(bucket, range(skip + 1, bucket.segment_count + 1))
    return live, None


def _decoded(bucket: SealedBucket, numbers: range) -> dict[int, EntryBitmap]:
    runs = [bucket.read_segment(n) for n in numbers]
    if not runs:
        return {}
    return ledger_bitmaps(np.concatenate([r.ledgers for r in runs]), np.concatenate([r.entries for r in runs]))


def _difference(whole: dict[int, EntryBitmap], part: dict[int, EntryBitmap]) -> dict[int, EntryBitmap]:
    out: dict[int, EntryBitmap] = {}
    for ledger, bm in whole.items():
        minus = part.get(ledger)
        if minus is None:
            out[ledger] = bm
            continue
        rest = bm - minus if type(minus) is type(bm) else BitMap64(bm) - BitMap64(minus)
        if rest:
            out[ledger] = rest
    return out


class BucketMap:
    """A tracker's sealed buckets by ledger range: non-overlapping ``[start, end]`` ranges.

    Keeps the newest range's end at hand, because every add asks "is this ledger
    newer than every sealed bucket?" and that must cost an attribute read.
    """

    __slots__ = ("_by_start", "newest_end", "_flat")

    def __init__(self) -> None:
        self._by_start: SortedDict = SortedDict()
        # Starts and buckets as plain lists for covering(), rebuilt after a change: buckets come
        # and go a few times a second at most, and covering() is asked per question (a paged-out
        # or unopened bucket's contains_message), where SortedDict's bisect and peekitem cost
        # about a quarter of the answer.
        self._flat: tuple[list[int], list[SealedBucket]] | None = None
        #: The largest ``end_ledger`` of any bucket, -1 when there is none.
        self.newest_end = -1

    def __len__(self) -> int:
        return len(self._by_start)

    def __bool__(self) -> bool:
        return bool(self._by_start)

    def add(self, bucket: SealedBucket) -> None:
        self._by_start[bucket.start_ledger] = bucket
        self._flat = None
        self.newest_end = max(self.newest_end, bucket.end_ledger)

    def remove(self, bucket: SealedBucket) -> None:
        """Forget ``bucket`` if it is the one registered at its start (idempotent)."""
        if self._by_start.get(bucket.start_ledger) is bucket:
            del self._by_start[bucket.start_ledger]
            self._flat = None
            self.newest_end = self._by_start.peekitem(-1)[1].end_ledger if self._by_start else -1

    def clear(self) -> None:
        self._by_start.clear()
        self._flat = None
        self.newest_end = -1

    def covering(self, ledger_id: int) -> SealedBucket | None:
        """The bucket whose range holds ``ledger_id``, or None. O(log n)."""
        if ledger_id > self.newest_end:
            return None  # the common case: a ledger newer than every sealed bucket
        flat = self._flat
        if flat is None:
            flat = self._flat = (list(self._by_start.keys()), list(self._by_start.values()))
        i = bisect_right(flat[0], ledger_id) - 1
        if i < 0:
            return None
        bucket = flat[1][i]
        return bucket if bucket.end_ledger >= ledger_id else None

    def values(self) -> list[SealedBucket]:
        """The buckets in ledger order."""
        return list(self._by_start.values())

    def latest_timestamp(self) -> int | None:
        """The latest max timestamp of any bucket's last segment (None without a segment).
        O(buckets); an unopened bucket's comes from its catalog summary, no file is read."""
        return max((int(b.max_ts[-1]) for b in self._by_start.values() if b.segment_count), default=None)
