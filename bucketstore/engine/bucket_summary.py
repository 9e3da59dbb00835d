"""The catalog's summary of a sealed bucket: what opening a tracker needs without reading the file.

Recovery used to read entry 0 (bitmaps and segment table) of every bucket, so
opening cost grew with the store. The summary, committed in the same catalog
transaction as the bucket's key, holds the ledger id and file size (identity),
the index count and the segment table (per segment min/max timestamp and count):
enough to decide which leading segments recovery skips, to key the bucket in the
shared queue by its first live segment and to count its indexes exactly. The
bitmaps stay in the file until the bucket is first needed.

Byte layout (all little-endian; see ``formats/catalog.md``)::

    u8   version (1)
    u64  ledger id
    u64  ledger file size in bytes
    u64  index count (the sum of the segment counts)
    u32  segment count N
    N x (u64 min timestamp, u64 max timestamp, u64 count)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import CatalogError
from ..format.snapshot import BucketMetadata

__all__ = ["BucketSummary", "encode_summary", "decode_summary", "summary_mismatch", "SUMMARY_VERSION"]

SUMMARY_VERSION = 1
_HEADER = struct.Struct("<BQQQI")
_SEGMENT = struct.Struct("<QQQ")
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

    def table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The segment table as (min timestamps, max timestamps, counts).

        :raises CatalogError: the counts do not add up, or a segment's min is after its max.
        """
        table = np.frombuffer(self.raw, dtype=_U64, offset=_HEADER.size).reshape(self.segments, 3)
        counts = table[:, 2].astype(np.int64)
        if int(counts.sum()) != self.count or bool((table[:, 0] > table[:, 1]).any()):
            raise CatalogError(f"{self.path}: summary of bucket {self.key} is inconsistent (counts do not add up "
                               f"to {self.count}, or a segment's min timestamp is after its max)",
                               path=self.path, key=self.key)
        return table[:, 0], table[:, 1], counts


def encode_summary(meta: BucketMetadata, ledger_id: int, size: int) -> bytes:
    """The summary of a bucket whose entry 0 is ``meta``, stored as ledger ``ledger_id`` of ``size`` bytes."""
    table = np.array([(s.min_timestamp, s.max_timestamp, s.count) for s in meta.segments], dtype=_U64)
    return _HEADER.pack(SUMMARY_VERSION, ledger_id, size, meta.count, len(meta.segments)) + table.tobytes()


def decode_summary(raw: bytes, *, path: str, key: str) -> BucketSummary:
    """Decode a summary's header (the table is checked when :meth:`BucketSummary.table` reads it).

    :raises CatalogError: naming the catalog and the bucket key.
    """
    if len(raw) < _HEADER.size:
        raise CatalogError(f"{path}: summary of bucket {key} is {len(raw)} bytes, shorter than its header",
                           path=path, key=key)
    version, ledger_id, size, count, n = _HEADER.unpack_from(raw)
    if version != SUMMARY_VERSION:
        raise CatalogError(f"{path}: summary of bucket {key} has version {version}, not {SUMMARY_VERSION}",
                           path=path, key=key)
    if len(raw) != _HEADER.size + n * _SEGMENT.size:
        raise CatalogError(f"{path}: summary of bucket {key} says {n} segments in {len(raw)} bytes",
                           path=path, key=key)
    first_min, first_max, _ = _SEGMENT.unpack_from(raw, _HEADER.size) if n else (0, 0, 0)
    if first_min > first_max:
        raise CatalogError(f"{path}: summary of bucket {key}: segment 1's min timestamp is after its max",
                           path=path, key=key)
    return BucketSummary(ledger_id, size, count, n, first_min, first_max, raw, path, key)


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
