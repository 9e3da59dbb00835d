"""Bucket snapshots: a sealed bucket as a ledger file.

Entry 0 holds the bucket metadata (:class:`BucketMetadata`): the ledger range,
the index count and, per segment, its min and max schedule timestamp, its
index count and its per-ledger delayed-index bitmaps (roaring bitmaps of entry
ids, keyed by ledger id), as PIP-195 keeps them. Entries 1..N hold the segments
in the compact encoding of :mod:`bucketstore.format.segment_codec`.

Segments are cut as Pulsar cuts them (reference §1.4): a segment opens at its
first index with timestamp ``t0`` and closes when the next index is later than
``t0 + time_step - 1`` or when it holds ``max_indexes`` indexes (-1: no cap but
the format's hard cap).

The byte-level specification is ``formats/bucket_snapshot.md``.
"""

from __future__ import annotations

import os
import struct
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Union

import msgpack
import numpy as np
from pyroaring import BitMap, BitMap64

from ..errors import CorruptLedgerError
from .fs import REAL_FS, FileSystem
from .ledger_file import LedgerReader, PropertyValue, write_ledger
from .segment_codec import (MAX_SEGMENT_INDEXES, Segment, SegmentCodecError, check_sorted, decode_segment,
                            encode_segment)

__all__ = [
    "SNAPSHOT_VERSION",
    "SegmentMetadata",
    "BucketMetadata",
    "EntryBitmap",
    "cut_segments",
    "segment_bitmaps",
    "encode_metadata",
    "decode_metadata",
    "MetadataCodecError",
    "build_bucket",
    "write_bucket",
    "BucketFile",
    "bucket_key",
    "parse_bucket_key",
    "BUCKET_KEY_PREFIX",
    "sort_indexes",
    "drop_repeats",
]

SNAPSHOT_VERSION = 1
BUCKET_KEY_PREFIX = "#pulsar.internal.delayed.bucket"
_U64 = np.dtype("<u8")
_FLAG_ZLIB = 0x01
_PREFIX = struct.Struct("<BI")  # flags, uncompressed msgpack length
_BITMAP32 = 32
_BITMAP64 = 64
_MAX_INFLATE_RATIO = 1032  # zlib's largest possible expansion; a bigger claim is damage

EntryBitmap = Union[BitMap, BitMap64]


class MetadataCodecError(ValueError):
    """Entry 0 is malformed; ``offset`` is relative to the payload start."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"offset {offset}: {reason}")


def bucket_key(start_ledger: int, end_ledger: int) -> str:
    """The cursor-property key of a bucket covering ledgers ``[start, end]`` (Pulsar's spelling)."""
    return f"{BUCKET_KEY_PREFIX}_{start_ledger}_{end_ledger}"


def parse_bucket_key(key: str) -> tuple[int, int]:
    """Return ``(start, end)`` of a bucket key; :class:`ValueError` if it is not one."""
    prefix = BUCKET_KEY_PREFIX + "_"
    if not key.startswith(prefix):
        raise ValueError(f"{key!r} is not a bucket key")
    parts = key[len(prefix):].split("_")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{key!r} is not a bucket key")
    start, end = int(parts[0]), int(parts[1])
    if start > end or end >= 1 << 64:
        raise ValueError(f"{key!r} has an invalid ledger range")
    return start, end


@dataclass(slots=True)
class SegmentMetadata:
    """What entry 0 records about one segment."""

    min_timestamp: int
    max_timestamp: int
    count: int
    #: ledger id -> roaring bitmap of the entry ids of that ledger in this segment.
    bitmaps: dict[int, EntryBitmap] = field(default_factory=dict)


@dataclass(slots=True)
class BucketMetadata:
    """Entry 0 of a bucket snapshot."""

    start_ledger: int
    end_ledger: int
    count: int
    segments: list[SegmentMetadata]
    version: int = SNAPSHOT_VERSION

    @property
    def key(self) -> str:
        return bucket_key(self.start_ledger, self.end_ledger)


def sort_indexes(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort three columns by (timestamp, ledger, entry) and drop duplicate rows."""
    ts = np.asarray(ts, dtype=_U64)
    ledgers = np.asarray(ledgers, dtype=_U64)
    entries = np.asarray(entries, dtype=_U64)
    order = np.lexsort((entries, ledgers, ts))
    return drop_repeats(ts[order], ledgers[order], entries[order])


def drop_repeats(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drop rows equal to the row before them (sorted input: drops every duplicate row)."""
    if len(ts) > 1:
        keep = np.ones(len(ts), dtype=bool)
        keep[1:] = (ts[1:] != ts[:-1]) | (ledgers[1:] != ledgers[:-1]) | (entries[1:] != entries[:-1])
        if not keep.all():
            ts, ledgers, entries = ts[keep], ledgers[keep], entries[keep]
    return ts, ledgers, entries


def cut_segments(ts: np.ndarray, time_step_ms: int, max_indexes: int) -> list[tuple[int, int]]:
    """Segment boundaries of sorted timestamps ``ts``, as ``[(lo, hi), ...]`` half-open slices.

    A segment opened at ``t0`` takes every following index with timestamp
    ``<= t0 + time_step_ms - 1``, up to ``max_indexes`` of them (-1: no cap, but
    never more than :data:`~bucketstore.format.segment_codec.MAX_SEGMENT_INDEXES`).
    """
    if time_step_ms < 1:
        raise ValueError("time_step_ms must be at least 1")
    cap = MAX_SEGMENT_INDEXES if max_indexes == -1 else min(max_indexes, MAX_SEGMENT_INDEXES)
    if cap < 1:
        raise ValueError("max_indexes must be -1 or at least 1")
    bounds = []
    lo, n = 0, len(ts)
    while lo < n:
        upper = int(ts[lo]) + time_step_ms - 1
        hi = n if upper >= 1 << 64 else int(np.searchsorted(ts, np.uint64(upper), side="right"))
        hi = min(hi, lo + cap)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _make_bitmap(entries: np.ndarray) -> EntryBitmap:
    if len(entries) and int(entries.max()) >= 1 << 32:
        bm: EntryBitmap = BitMap64(entries.tolist())
    else:
        # pyroaring builds fastest from array('I'); a numpy array takes its slow path.
        bm = BitMap(array("I", entries.astype(np.uint32).tobytes()))
    bm.run_optimize()
    bm.shrink_to_fit()
    return bm


def segment_bitmaps(ledgers: np.ndarray, entries: np.ndarray) -> dict[int, EntryBitmap]:
    """Per-ledger bitmaps of entry ids for one segment's columns."""
    order = np.lexsort((entries, ledgers))
    sl, se = ledgers[order], entries[order]
    cuts = np.flatnonzero(sl[1:] != sl[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(sl)]))
    return {int(sl[a]): _make_bitmap(se[a:b]) for a, b in zip(starts.tolist(), ends.tolist())}


def encode_metadata(meta: BucketMetadata, *, compress: bool = True) -> bytes:
    """Encode entry 0.

    Layout: ``flags u8, msgpack_length u32`` then the msgpack body (zlib-compressed
    when flag bit 0 is set and that is smaller). The body is the array
    ``[version, start_ledger, end_ledger, count, segments]`` where each segment is
    ``[min_ts, max_ts, count, bitmaps]`` and ``bitmaps`` is a flat array
    ``[ledger_id, width, bytes, ledger_id, width, bytes, ...]`` in ascending ledger
    order, ``width`` 32 (portable 32-bit roaring) or 64 (portable 64-bit roaring).
    """
    segments = []
    for seg in meta.segments:
        flat: list[object] = []
        for ledger in sorted(seg.bitmaps):
            bm = seg.bitmaps[ledger]
            flat += [ledger, _BITMAP64 if isinstance(bm, BitMap64) else _BITMAP32, bm.serialize()]
        segments.append([seg.min_timestamp, seg.max_timestamp, seg.count, flat])
    body = msgpack.packb([meta.version, meta.start_ledger, meta.end_ledger, meta.count, segments],
                         use_bin_type=True)
    if compress and len(body) > 64:
        packed = zlib.compress(body, 1)
        if len(packed) < len(body):
            return _PREFIX.pack(_FLAG_ZLIB, len(body)) + packed
    return _PREFIX.pack(0, len(body)) + body


def _is_u64(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def decode_metadata(payload: bytes | memoryview) -> BucketMetadata:
    """Decode and validate entry 0. Raises :class:`MetadataCodecError` on any damage."""
    view = memoryview(payload)
    if len(view) < _PREFIX.size:
        raise MetadataCodecError(0, "metadata payload is shorter than its 5-byte prefix")
    flags, raw_len = _PREFIX.unpack_from(view)
    if flags & ~_FLAG_ZLIB:
        raise MetadataCodecError(0, f"unknown metadata flags 0x{flags:02x}")
    body: bytes | memoryview
    if flags & _FLAG_ZLIB:
        stream = view[_PREFIX.size:]
        if raw_len > _MAX_INFLATE_RATIO * len(stream):
            raise MetadataCodecError(1, f"uncompressed size {raw_len} is impossible for {len(stream)} compressed bytes")
        inflater = zlib.decompressobj()
        try:
            body = inflater.decompress(stream, raw_len)
        except zlib.error as exc:
            raise MetadataCodecError(_PREFIX.size, f"zlib stream is damaged: {exc}") from None
        if len(body) != raw_len or not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
            raise MetadataCodecError(_PREFIX.size, "zlib stream does not hold exactly the recorded size")
    else:
        body = view[_PREFIX.size:]
        if len(body) != raw_len:
            raise MetadataCodecError(1, f"recorded length {raw_len} disagrees with the payload ({len(body)})")
    try:
        # msgpack bounds every container and string by the buffer's own length.
        doc = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise MetadataCodecError(_PREFIX.size, f"metadata is not valid msgpack: {exc}") from None
    return _validate_metadata(doc)


def _validate_metadata(doc: object) -> BucketMetadata:
    at = _PREFIX.size  # structural errors are reported at the body's start
    if not isinstance(doc, list) or len(doc) != 5:
        raise MetadataCodecError(at, "metadata is not a 5-element array")
    version, start, end, count, segments = doc
    # ``type(v) is int``: msgpack decodes true as True and 1.0 as a float, both
    # of which compare equal to 1 but are not what any writer produces.
    if type(version) is not int or version != SNAPSHOT_VERSION:
        raise MetadataCodecError(at, f"snapshot version {version!r} is not supported (this reader knows {SNAPSHOT_VERSION})")
    if not (_is_u64(start) and _is_u64(end) and _is_u64(count)) or start > end:
        raise MetadataCodecError(at, "ledger range or count is not a valid unsigned range")
    if not isinstance(segments, list):
        raise MetadataCodecError(at, "segment list is not an array")
    out: list[SegmentMetadata] = []
    total = 0
    prev_max = -1
    for i, seg in enumerate(segments, start=1):
        if not (isinstance(seg, list) and len(seg) == 4 and all(_is_u64(v) for v in seg[:3])
                and isinstance(seg[3], list) and len(seg[3]) % 3 == 0):
            raise MetadataCodecError(at, f"segment {i} metadata is malformed")
        lo, hi, n, flat = seg
        if lo > hi or not 1 <= n <= MAX_SEGMENT_INDEXES or lo < prev_max:
            raise MetadataCodecError(at, f"segment {i} has bounds [{lo}, {hi}] and count {n}, which are inconsistent")
        prev_max = hi
        bitmaps: dict[int, EntryBitmap] = {}
        card = 0
        for j in range(0, len(flat), 3):
            ledger, width, blob = flat[j:j + 3]
            if not _is_u64(ledger) or not start <= ledger <= end or ledger in bitmaps \
                    or type(width) is not int or width not in (_BITMAP32, _BITMAP64) \
                    or not isinstance(blob, bytes):
                raise MetadataCodecError(at, f"segment {i} has a malformed bitmap entry for ledger {ledger!r}")
            try:
                bm = (BitMap64 if width == _BITMAP64 else BitMap).deserialize(blob)
            except (ValueError, IndexError, OverflowError) as exc:
                raise MetadataCodecError(at, f"segment {i} ledger {ledger}: bitmap does not deserialize: {exc}") from None
            bitmaps[ledger] = bm
            card += len(bm)
        if card != n:
            raise MetadataCodecError(at, f"segment {i} bitmaps hold {card} entries but the segment count is {n}")
        total += n
        out.append(SegmentMetadata(lo, hi, n, bitmaps))
    if total != count:
        raise MetadataCodecError(at, f"segments hold {total} indexes but the bucket count is {count}")
    return BucketMetadata(start, end, count, out, version)


def build_bucket(start_ledger: int, end_ledger: int, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, *,
                 time_step_ms: int, max_indexes_per_segment: int, compress: bool = True
                 ) -> tuple[BucketMetadata, list[bytes]]:
    """Cut sorted columns into segments and encode them.

    Returns the metadata (entry 0, not yet encoded) and the encoded segment
    payloads (entries 1..N). Columns must be sorted by (timestamp, ledger, entry)
    without duplicates, every ledger must lie in ``[start_ledger, end_ledger]``,
    and a position ``(ledger, entry)`` may appear only once (a repeat within one
    segment raises :class:`ValueError`; across segments it is the caller's
    invariant, which ``bucketstore verify`` checks).
    """
    ts = np.ascontiguousarray(ts, dtype=_U64)
    ledgers = np.ascontiguousarray(ledgers, dtype=_U64)
    entries = np.ascontiguousarray(entries, dtype=_U64)
    if not len(ts) == len(ledgers) == len(entries):
        raise ValueError("columns differ in length")
    if not 0 <= start_ledger <= end_ledger < 1 << 64:
        raise ValueError(f"invalid ledger range [{start_ledger}, {end_ledger}]")
    if len(ts):
        if int(ledgers.min()) < start_ledger or int(ledgers.max()) > end_ledger:
            raise ValueError(f"an index lies outside the bucket's ledger range [{start_ledger}, {end_ledger}]")
        if check_sorted(ts, ledgers, entries) >= 0:
            raise ValueError("indexes are not sorted by (timestamp, ledger, entry) without duplicates")
    metas, payloads = [], []
    for lo, hi in cut_segments(ts, time_step_ms, max_indexes_per_segment):
        t, l, e = ts[lo:hi], ledgers[lo:hi], entries[lo:hi]
        bitmaps = segment_bitmaps(l, e)
        # A position has one delivery time, so it appears once: entry 0's bitmap
        # cardinalities must add up to the segment's count, and a reader rejects
        # a file where they do not. Refuse here rather than write such a file.
        if sum(len(bm) for bm in bitmaps.values()) != hi - lo:
            raise ValueError(f"a position (ledger, entry) appears more than once among indexes {lo}..{hi - 1}")
        metas.append(SegmentMetadata(int(t[0]), int(t[-1]), hi - lo, bitmaps))
        payloads.append(encode_segment(t, l, e, compress=compress))
    return BucketMetadata(start_ledger, end_ledger, len(ts), metas), payloads


def write_bucket(directory: str | os.PathLike[str], ledger_id: int, meta: BucketMetadata, segments: list[bytes],
                 properties: dict[str, PropertyValue] | None = None, *, fs: FileSystem = REAL_FS,
                 compress: bool = True) -> str:
    """Write a bucket snapshot as a sealed, durable ledger file; return its path.

    The header properties always carry ``kind=bucket``, the bucket key and the
    ledger range, plus whatever ``properties`` adds (e.g. the tracker name).
    """
    props: dict[str, PropertyValue] = dict(properties or {})
    props.update(kind="bucket", bucket_key=meta.key, start_ledger=meta.start_ledger, end_ledger=meta.end_ledger)
    return write_ledger(directory, ledger_id, props, [encode_metadata(meta, compress=compress), *segments], fs=fs)


class BucketFile:
    """A sealed bucket snapshot opened for reading.

    Opening reads and validates the ledger header, trailer and entry 0; segments
    are read on demand with :meth:`read_segment`. All damage is raised as
    :class:`~bucketstore.CorruptLedgerError` naming the file and offset.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.ledger = LedgerReader(path)
        try:
            self.path = self.ledger.path
            self.ledger_id = self.ledger.ledger_id
            if self.ledger.properties.get("kind") != "bucket":
                raise CorruptLedgerError(self.path, 24, f"ledger kind is {self.ledger.properties.get('kind')!r}, "
                                                        "not 'bucket'")
            if self.ledger.entry_count < 1:
                raise CorruptLedgerError(self.path, self.ledger.trailer_offset, "bucket ledger has no metadata entry")
            payload = self.ledger.read_entry(0)
            try:
                self.metadata = decode_metadata(payload)
            except MetadataCodecError as exc:
                raise CorruptLedgerError(self.path, self.ledger.entry_payload_offset(0) + exc.offset,
                                         f"entry 0: {exc.reason}") from None
            meta = self.metadata
            if len(meta.segments) != self.ledger.entry_count - 1:
                raise CorruptLedgerError(self.path, self.ledger.entry_payload_offset(0),
                                         f"entry 0 lists {len(meta.segments)} segments but the ledger holds "
                                         f"{self.ledger.entry_count - 1}")
            props = self.ledger.properties
            if (props.get("start_ledger"), props.get("end_ledger")) != (meta.start_ledger, meta.end_ledger):
                raise CorruptLedgerError(self.path, 24, "header ledger range disagrees with entry 0")
            self.metadata_size = len(payload)
        except BaseException:
            self.ledger.close()
            raise

    @property
    def segment_count(self) -> int:
        return len(self.metadata.segments)

    @property
    def size(self) -> int:
        return self.ledger.size

    def read_segment(self, number: int) -> Segment:
        """Read and decode segment ``number`` (1-based, as ledger entry ``number``)."""
        if not 1 <= number <= self.segment_count:
            raise IndexError(f"{self.path}: segment {number} out of range 1..{self.segment_count}")
        meta = self.metadata.segments[number - 1]
        payload = self.ledger.read_entry(number)
        at = self.ledger.entry_payload_offset(number)
        try:
            seg = decode_segment(payload, meta.count)
        except SegmentCodecError as exc:
            raise CorruptLedgerError(self.path, at + exc.offset, f"segment {number}: {exc.reason}") from None
        if int(seg.timestamps[0]) != meta.min_timestamp or int(seg.timestamps[-1]) != meta.max_timestamp:
            raise CorruptLedgerError(self.path, at, f"segment {number}: timestamps [{int(seg.timestamps[0])}, "
                                                    f"{int(seg.timestamps[-1])}] disagree with entry 0 "
                                                    f"[{meta.min_timestamp}, {meta.max_timestamp}]")
        return seg

    def close(self) -> None:
        self.ledger.close()

    def __enter__(self) -> "BucketFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
