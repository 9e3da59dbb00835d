"""The catalog's summary of a sealed bucket: what opening a tracker needs without reading the file.

Recovery used to read entry 0 (bitmaps and segment table) of every bucket, so
opening cost grew with the store. The summary, committed in the same catalog
transaction as the bucket's key, holds the ledger id and file size (identity),
the index count and the segment table (per segment min/max timestamp and count):
enough to decide which leading segments recovery skips, to key the bucket in the
shared queue by its first live segment and to count its indexes exactly. The
bitmaps stay in the file until the bucket is first needed.

Version 2 adds the bucket's first rows (its *prefix*: the first :data:`PREFIX_ROWS`
rows of segment 1, and the timestamp of the row after them). The first batch after
a restart takes every overlapping bucket's earliest rows; with the prefix they are
in memory once the catalog is read, and a bucket's file is opened only when a batch
reaches past its prefix (see :mod:`~bucketstore.engine.buckets.bucket_prefix`).

Byte layout (all little-endian; see ``formats/catalog.md``)::

    u8   version (1 or 2)
    u64  ledger id
    u64  ledger file size in bytes
    u64  index count (the sum of the segment counts)
    u32  segment count N
    N x (u64 min timestamp, u64 max timestamp, u64 count)
    version 2 only:
    u32  prefix rows K (0: no prefix; else fewer than segment 1's count)
    u64  the timestamp of segment 1's row K+1
    K x u64 timestamps, K x u64 ledger ids, K x u64 entry ids (segment 1's first K rows)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import CatalogError
from .snapshot import BucketMetadata

__all__ = ["BucketSummary", "encode_summary", "decode_summary", "summary_mismatch", "SUMMARY_VERSION",
           "PREFIX_ROWS", "prefix_mismatch"]

SUMMARY_VERSION = 2
#: Rows of segment 1 a summary keeps (fewer when segment 1 is not longer than this: then none).
#: 32 rows (780 bytes a bucket) let the first batch after a restart take about 32 x the
#: number of overlapping buckets rows before it opens any file (tools/bench/bench_drain_scale.py).
PREFIX_ROWS = 32
_HEADER = struct.Struct("<BQQQI")
_SEGMENT = struct.Struct("<QQQ")
_PREFIX = struct.Struct("<IQ")
_U64 = np.dtype("<u8")


@dataclass(frozen=True, slots=True)
class BucketSummary:
    """A summary as recovery reads it: the header and the first segment's times decoded at once
    (all that opening a tracker needs in the common case), the table when asked for."""

    ledger_id: int
    size: int
    count: int
    segments: int
    #: The first segment's min and max timestamps (0 when there is no segment).
    first_min: int
    first_max: int
    raw: bytes
    path: str
    key: str
    #: Segment 1's first rows kept in the summary (0: none, a version-1 summary or a short
    #: segment 1) and the timestamp of the row after them.
    prefix_rows: int = 0
    prefix_next: int = 0

    def prefix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Segment 1's first :attr:`prefix_rows` rows as (timestamps, ledger ids, entry ids) views."""
        k = self.prefix_rows
        at = _HEADER.size + self.segments * _SEGMENT.size + _PREFIX.size
        cols = np.frombuffer(self.raw, dtype=_U64, offset=at, count=3 * k)
        return cols[:k], cols[k:2 * k], cols[2 * k:]

    def table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The segment table as (min timestamps, max timestamps, counts).

        :raises CatalogError: the counts do not add up, or a segment's min is after its max.
        """
        table = np.frombuffer(self.raw, dtype=_U64, offset=_HEADER.size, count=3 * self.segments).reshape(self.segments, 3)
        counts = table[:, 2].astype(np.int64)
        if int(counts.sum()) != self.count or bool((table[:, 0] > table[:, 1]).any()):
            raise CatalogError(f"{self.path}: summary of bucket {self.key} is inconsistent (counts do not add up "
                               f"to {self.count}, or a segment's min timestamp is after its max)",
                               path=self.path, key=self.key)
        return table[:, 0], table[:, 1], counts


def encode_summary(meta: BucketMetadata, ledger_id: int, size: int,
                   rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> bytes:
    """The summary of a bucket whose entry 0 is ``meta``, stored as ledger ``ledger_id`` of ``size`` bytes.

    :param rows: the bucket's rows in index order (at least its first :data:`PREFIX_ROWS` + 1,
        as written to segment 1), for the prefix; None writes no prefix (opening then reads
        the file for the first batch, as with a version-1 summary).
    """
    table = np.array([(s.min_timestamp, s.max_timestamp, s.count) for s in meta.segments], dtype=_U64)
    out = _HEADER.pack(SUMMARY_VERSION, ledger_id, size, meta.count, len(meta.segments)) + table.tobytes()
    k = PREFIX_ROWS if rows is not None and meta.segments and meta.segments[0].count > PREFIX_ROWS else 0
    if not k:
        return out + _PREFIX.pack(0, 0)
    ts, ledgers, entries = rows
    if len(ts) <= k or int(ts[0]) != meta.segments[0].min_timestamp:
        raise ValueError(f"rows do not start segment 1 of bucket {meta.key}")
    cols = np.concatenate([np.asarray(c[:k], dtype=_U64) for c in (ts, ledgers, entries)])
    return out + _PREFIX.pack(k, int(ts[k])) + cols.tobytes()


def decode_summary(raw: bytes, *, path: str, key: str) -> BucketSummary:
    """Decode a summary's header (the table is checked when :meth:`BucketSummary.table` reads it).

    :raises CatalogError: naming the catalog and the bucket key.
    """
    if len(raw) < _HEADER.size:
        raise CatalogError(f"{path}: summary of bucket {key} is {len(raw)} bytes, shorter than its header",
                           path=path, key=key)
    version, ledger_id, size, count, n = _HEADER.unpack_from(raw)
    if version not in (1, SUMMARY_VERSION):
        raise CatalogError(f"{path}: summary of bucket {key} has version {version}, not 1 or {SUMMARY_VERSION}",
                           path=path, key=key)
    table_end = _HEADER.size + n * _SEGMENT.size
    k = next_ts = 0
    if version >= 2 and len(raw) >= table_end + _PREFIX.size:
        k, next_ts = _PREFIX.unpack_from(raw, table_end)
    expected = table_end + (_PREFIX.size + 3 * 8 * k if version >= 2 else 0)
    if len(raw) != expected:
        raise CatalogError(f"{path}: summary of bucket {key} says {n} segments and {k} prefix rows in "
                           f"{len(raw)} bytes", path=path, key=key)
    first_min, first_max, first_count = _SEGMENT.unpack_from(raw, _HEADER.size) if n else (0, 0, 0)
    if first_min > first_max:
        raise CatalogError(f"{path}: summary of bucket {key}: segment 1's min timestamp is after its max",
                           path=path, key=key)
    summary = BucketSummary(ledger_id, size, count, n, first_min, first_max, raw, path, key, k, next_ts)
    if k:
        ts = summary.prefix()[0].tolist()
        # The prefix must be segment 1's head: in order, starting at its min, before the next
        # row's time, within it. (Rows against the file are checked when segment 1 is read.)
        if k >= first_count or ts[0] != first_min or next_ts > first_max or ts[-1] > next_ts \
                or ts != sorted(ts):
            raise CatalogError(f"{path}: summary of bucket {key}: its {k} prefix rows are not the head of "
                               f"segment 1 ({first_count} rows in [{first_min}, {first_max}])", path=path, key=key)
    return summary


def summary_mismatch(summary: BucketSummary, meta: BucketMetadata, size: int) -> str | None:
    """Why entry 0 (``meta``) and the file size disagree with the catalog summary, or None.

    :raises CatalogError: the summary's table is inconsistent in itself."""
    if size != summary.size:
        return f"the file is {size} bytes, the catalog summary says {summary.size}"
    if meta.count != summary.count or len(meta.segments) != summary.segments:
        return (f"entry 0 holds {meta.count} indexes in {len(meta.segments)} segments, the catalog summary "
                f"{summary.count} in {summary.segments}")
    min_ts, max_ts, counts = summary.table()
    for i, s in enumerate(meta.segments):
        if (s.min_timestamp, s.max_timestamp, s.count) != (int(min_ts[i]), int(max_ts[i]), int(counts[i])):
            return f"segment {i + 1} of entry 0 disagrees with the catalog summary"
    return None


def prefix_mismatch(summary: BucketSummary, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> str | None:
    """Why segment 1's rows (as decoded from the file) disagree with the summary's prefix, or None."""
    k = summary.prefix_rows
    if not k:
        return None
    if len(ts) <= k:
        return f"segment 1 holds {len(ts)} rows, the catalog summary keeps its first {k} and more"
    want = summary.prefix()
    if not all(np.array_equal(have[:k], w) for have, w in zip((ts, ledgers, entries), want)) \
            or int(ts[k]) != summary.prefix_next:
        return f"segment 1's first {k} rows disagree with the catalog summary's prefix"
    return None
