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
    """A decoded summary: the segment table as three arrays."""

    ledger_id: int
    size: int
    count: int
    min_ts: np.ndarray
    max_ts: np.ndarray
    counts: np.ndarray


def encode_summary(meta: BucketMetadata, ledger_id: int, size: int) -> bytes:
    """The summary of a bucket whose entry 0 is ``meta``, stored as ledger ``ledger_id`` of ``size`` bytes."""
    table = np.array([(s.min_timestamp, s.max_timestamp, s.count) for s in meta.segments], dtype=_U64)
    return _HEADER.pack(SUMMARY_VERSION, ledger_id, size, meta.count, len(meta.segments)) + table.tobytes()


def decode_summary(raw: bytes, *, path: str, key: str) -> BucketSummary:
    """Decode a summary; a malformed one is catalog damage.

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
    table = np.frombuffer(raw, dtype=_U64, offset=_HEADER.size).reshape(n, 3)
    counts = table[:, 2].astype(np.int64)
    if int(counts.sum()) != count or bool((table[:, 0] > table[:, 1]).any()):
        raise CatalogError(f"{path}: summary of bucket {key} is inconsistent (counts do not add up to {count}, "
                           "or a segment's min timestamp is after its max)", path=path, key=key)
    return BucketSummary(ledger_id, size, count, table[:, 0], table[:, 1], counts)


def summary_mismatch(summary: BucketSummary, meta: BucketMetadata, size: int) -> str | None:
    """Why entry 0 (``meta``) and the file size disagree with the catalog summary, or None."""
    if size != summary.size:
        return f"the file is {size} bytes, the catalog summary says {summary.size}"
    if meta.count != summary.count or len(meta.segments) != len(summary.counts):
        return (f"entry 0 holds {meta.count} indexes in {len(meta.segments)} segments, the catalog summary "
                f"{summary.count} in {len(summary.counts)}")
    for i, s in enumerate(meta.segments):
        if (s.min_timestamp, s.max_timestamp, s.count) != \
                (int(summary.min_ts[i]), int(summary.max_ts[i]), int(summary.counts[i])):
            return f"segment {i + 1} of entry 0 disagrees with the catalog summary"
    return None
