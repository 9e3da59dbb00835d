"""Bucket snapshots: a sealed bucket as a ledger file.

Entry 0 holds the bucket metadata (:class:`BucketMetadata`): the ledger range,
the index count, per segment its min and max schedule timestamp and index
count, and the delayed-index bitmaps (roaring bitmaps of entry ids, keyed by
ledger id). Entries 1..N hold the segments in the compact encoding of
:mod:`bucketstore.format.segment_codec`.

Version 2 keeps *one* bitmap per ledger for the whole bucket: the segments already say which
segment holds which position, so version 1's per-segment bitmaps (PIP-195's layout, still read)
stored every position twice. Version 3 lays the same bitmaps end to end, byte-shuffled from 4 KiB;
version 4 stores a sparse bucket's ledgers as entry-id lists instead; version 5 keeps only their
counts, the ids being the segments' rows (issue 28 item 2); version 6 (what this module writes) has
version 5's entry 0 and may store a segment grouped by ledger (issue 28 item 3). The engine needs
only bucket-wide membership at recovery; the positions of one segment, when needed, come from
decoding it (:meth:`BucketFile.segment_positions`). The bitmaps are built and serialized in
:mod:`~bucketstore.format.bucket_bitmaps`.

Segments are cut as Pulsar cuts them (reference §1.4): a segment opens at its
first index with timestamp ``t0`` and closes when the next index is later than
``t0 + time_step - 1`` or when it holds ``max_indexes`` indexes (-1: no cap but
the format's hard cap).

The byte-level specification is ``formats/bucket_snapshot.md``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate

import msgpack
import numpy as np
from pyroaring import BitMap, BitMap64

from ..errors import CorruptLedgerError
from .compression import ZLIB, ZSTD, CompressionError, Compressor, compress as _compress, decompress_exact
from .fs import REAL_FS, FileSystem
from .bucket_bitmaps import (BITMAP32, BITMAP64, EntryBitmap, LedgerBitmaps, bitmaps_with_lists, flat_bitmaps,
                             ledger_bitmaps, segment_bitmaps, serialized_bitmaps, split_counts, split_lists,
                             union_bitmaps)
from .bucket_key import BUCKET_KEY_PREFIX, bucket_key, parse_bucket_key
from .entry0_layout import SHUFFLE_FROM, bin_header as _bin_header, shuffle as _shuffle, unshuffle as _unshuffle
from .entry_lists import (COUNTS_ONLY_VERSION, EntryLists, ListedRows, ListsError, decode_counts, decode_lists,
                          encode_lists)
from .ledger_file import LedgerReader, PropertyValue, write_ledger
from .listed_rows import read_listed
from .row_sort import sort_rows
from .segment_codec import (GROUPED_VERSION, MAX_SEGMENT_INDEXES, Segment, SegmentCodecError, check_sorted,
                            decode_segment, encode_segments)
from .shared_work import RunBeside, encode_in_pieces

__all__ = [
    "SNAPSHOT_VERSION",
    "READABLE_VERSIONS",
    "ledger_bitmaps",
    "serialized_bitmaps",
    "LedgerBitmaps",
    "SegmentMetadata",
    "BucketMetadata",
    "EntryBitmap",
    "cut_segments",
    "segment_bitmaps",
    "union_bitmaps",
    "encode_metadata",
    "decode_metadata",
    "MetadataCodecError",
    "build_bucket",
    "write_bucket",
    "BucketFile",
    "read_segment_entry",
    "bucket_key",
    "parse_bucket_key",
    "BUCKET_KEY_PREFIX",
    "sort_indexes",
    "drop_repeats",
    "SHUFFLE_FROM",
]

#: The version this module writes.
SNAPSHOT_VERSION = 6
#: The versions it reads.
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)
#: Entry 0's msgpack array length in each version.
_BODY_LENGTH = {1: 5, 2: 6, 3: 7, 4: 9, 5: 9, 6: 9}
_U64 = np.dtype("<u8")
_FLAG_ZLIB = 0x01
_FLAG_ZSTD = 0x02  # from version 2
_PREFIX = struct.Struct("<BI")  # flags, uncompressed msgpack length
_MAX_INFLATE_RATIO = 1032  # zlib's largest possible expansion; a bigger claim is damage


class MetadataCodecError(ValueError):
    """Entry 0 is malformed; ``offset`` is relative to the payload start."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"offset {offset}: {reason}")


@dataclass(slots=True)
class SegmentMetadata:
    """What entry 0 records about one segment."""

    min_timestamp: int
    max_timestamp: int
    count: int
    #: Version 1 only: ledger id -> roaring bitmap of the entry ids of that ledger in
    #: this segment. Empty from version 2, whose bitmaps are the bucket's (:attr:`BucketMetadata.bitmaps`).
    bitmaps: dict[int, EntryBitmap] = field(default_factory=dict)


@dataclass(slots=True)
class BucketMetadata:
    """Entry 0 of a bucket snapshot."""

    start_ledger: int
    end_ledger: int
    count: int
    segments: list[SegmentMetadata]
    version: int = SNAPSHOT_VERSION
    #: ledger id -> bitmap of every entry id of that ledger in the bucket. Stored from
    #: version 2; for a version-1 file, the union of the segments' bitmaps. A bucket just
    #: built holds them serialized (:class:`LedgerBitmaps`).
    bitmaps: Mapping[int, EntryBitmap] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return bucket_key(self.start_ledger, self.end_ledger)


def sort_indexes(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort three columns by (timestamp, ledger, entry) and drop duplicate rows."""
    return drop_repeats(*sort_rows(ts, ledgers, entries))


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


def encode_metadata(meta: BucketMetadata, *, compress: bool = True) -> bytes:
    """Encode entry 0 in ``meta.version``'s layout (6 unless a test asks for 1 to 5).

    Versions 2 and 3: ``flags u8, body_length u32`` then the msgpack body, zstd frames
    when flag bit 1 is set (used when smaller). The version-2 body is the array
    ``[2, start_ledger, end_ledger, count, segments, bitmaps]``, ``segments`` a flat
    array ``[min_ts, max_ts, count, ...]`` and ``bitmaps`` a flat array
    ``[ledger_id, width, bytes, ...]`` of the bucket's bitmaps in ascending ledger order.
    Version 3's is ``[3, start_ledger, end_ledger, count, segments, table, data]``:
    ``table`` is ``[ledger_id, width, size, ...]`` and ``data`` the bitmaps' bytes laid end
    to end in table order, byte-shuffled (:func:`_shuffle`) when there are
    :data:`SHUFFLE_FROM` of them or more.
    """
    if meta.version == 1:
        return _encode_metadata_v1(meta, compress=compress)
    if meta.version not in (2, 3, 4, 5, 6):
        raise ValueError(f"cannot write snapshot version {meta.version}")
    segments: list[int] = []
    for seg in meta.segments:
        segments += [seg.min_timestamp, seg.max_timestamp, seg.count]
    if meta.version >= 4:
        return _encode_metadata_v4(meta, segments, compress=compress)
    flat = flat_bitmaps(meta.bitmaps)
    if meta.version == 2:
        body = msgpack.packb([2, meta.start_ledger, meta.end_ledger, meta.count, segments, flat], use_bin_type=True)
        pieces = [body]
    else:
        blobs = flat[2::3]
        table: list[object] = []
        for ledger, width, blob in zip(flat[0::3], flat[1::3], blobs):
            table += [ledger, width, len(blob)]  # type: ignore[arg-type]
        data = b"".join(blobs)  # type: ignore[arg-type]
        if len(data) < SHUFFLE_FROM:
            body = msgpack.packb([3, meta.start_ledger, meta.end_ledger, meta.count, segments, table, data],
                                 use_bin_type=True)
            pieces = [body]
        else:
            even, odd = _shuffle(data)
            body = msgpack.packb([3, meta.start_ledger, meta.end_ledger, meta.count, segments, table, even + odd],
                                 use_bin_type=True)
            # The shuffled bytes end the body: the msgpack before them, then each half, in frames of their own.
            pieces = [body[:len(body) - len(data)], even, odd]
    if compress and len(body) > 64:
        packed = _compress(pieces[0], ZSTD)
        if len(pieces) > 1:
            packed += Compressor(ZSTD).compress(pieces[1:])
        if len(packed) < len(body) and len(body) <= _MAX_INFLATE_RATIO * len(packed):
            return _PREFIX.pack(_FLAG_ZSTD, len(body)) + packed
    return _PREFIX.pack(0, len(body)) + body


def _encode_metadata_v4(meta: BucketMetadata, segments: list[int], *, compress: bool) -> bytes:
    """Version 4's entry 0: ``[4, start, end, count, segments, table, data, list_ledgers, lists]``,
    version 3's table and data for the ledgers whose bitmaps have a run or bitset container (or
    an entry id of 2**32 or more), and the others' entry ids as three columns
    (:mod:`~bucketstore.format.entry_lists`). Compressed as pieces: the msgpack up to the
    data, the data (each shuffled half), the msgpack between, then each column's planes, each
    in zstd frames of its own.

    Version 5's is the same array with ``5`` first and the lists' first two columns only (ledger
    ids and counts): the listed ledgers' entry ids are those of the segments' rows."""
    counts_only = meta.version >= COUNTS_ONLY_VERSION
    rest, lists = split_counts(meta.bitmaps) if counts_only else split_lists(meta.bitmaps)
    table: list[object] = []
    for ledger, width, blob in zip(rest[0::3], rest[1::3], rest[2::3]):
        table += [ledger, width, len(blob)]  # type: ignore[arg-type]
    data = b"".join(rest[2::3])  # type: ignore[arg-type]
    stored = [data] if len(data) < SHUFFLE_FROM else list(_shuffle(data))
    listed, differences = encode_lists(lists, gaps=not counts_only) if len(lists.ledgers) else ([], [])
    packer = msgpack.Packer(use_bin_type=True)
    # Packed element by element, the bytes are msgpack.packb of the whole array.
    head = packer.pack_array_header(9) + b"".join(
        packer.pack(v) for v in (meta.version, meta.start_ledger, meta.end_ledger, meta.count, segments, table))
    head += _bin_header(len(data))
    middle = packer.pack(len(lists.ledgers)) + _bin_header(sum(map(len, listed)))
    pieces = [head, *stored, middle, *listed]
    body = b"".join(pieces)
    if compress and len(body) > 64:
        packed = Compressor(ZSTD).compress(pieces, [False] * (len(pieces) - len(listed)) + differences)
        if len(packed) < len(body) and len(body) <= _MAX_INFLATE_RATIO * len(packed):
            return _PREFIX.pack(_FLAG_ZSTD, len(body)) + packed
    return _PREFIX.pack(0, len(body)) + body


def _encode_metadata_v1(meta: BucketMetadata, *, compress: bool = True) -> bytes:
    """Encode entry 0 in version 1's layout.

    Layout: ``flags u8, msgpack_length u32`` then the msgpack body (zlib-compressed
    when flag bit 0 is set and that is smaller). The body is the array
    ``[version, start_ledger, end_ledger, count, segments]`` where each segment is
    ``[min_ts, max_ts, count, bitmaps]`` and ``bitmaps`` is a flat array
    ``[ledger_id, width, bytes, ledger_id, width, bytes, ...]`` in ascending ledger
    order, ``width`` 32 (portable 32-bit roaring) or 64 (portable 64-bit roaring).
    """
    segments = [[seg.min_timestamp, seg.max_timestamp, seg.count, flat_bitmaps(seg.bitmaps)]
                for seg in meta.segments]
    body = msgpack.packb([1, meta.start_ledger, meta.end_ledger, meta.count, segments], use_bin_type=True)
    if compress and len(body) > 64:
        packed = _compress(body, ZLIB)
        if len(packed) < len(body):
            return _PREFIX.pack(_FLAG_ZLIB, len(body)) + packed
    return _PREFIX.pack(0, len(body)) + body


def _is_u64(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def decode_metadata(payload: bytes | memoryview, rows: ListedRows | None = None) -> BucketMetadata:
    """Decode and validate entry 0. Raises :class:`MetadataCodecError` on any damage.

    ``rows`` (version 5) gathers the listed ledgers' entry ids from the segments when the bitmaps
    are read (:class:`BucketFile` passes one); without it, reading them raises :class:`ValueError`:
    entry 0 alone holds the ledgers and their counts only."""
    view = memoryview(payload)
    if len(view) < _PREFIX.size:
        raise MetadataCodecError(0, "metadata payload is shorter than its 5-byte prefix")
    flags, raw_len = _PREFIX.unpack_from(view)
    if flags not in (0, _FLAG_ZLIB, _FLAG_ZSTD):
        raise MetadataCodecError(0, f"unknown metadata flags 0x{flags:02x}")
    body: bytes | memoryview
    if flags:
        stream = view[_PREFIX.size:]
        # zlib expands at most 1032-fold. zstd can expand far more, so its writer
        # stores a body uncompressed rather than exceed that ratio, and the one
        # bound holds for both: a damaged length never becomes a huge allocation.
        if raw_len > _MAX_INFLATE_RATIO * len(stream):
            raise MetadataCodecError(1, f"uncompressed size {raw_len} is impossible for {len(stream)} compressed bytes")
        try:
            body = decompress_exact(stream, raw_len, ZSTD if flags == _FLAG_ZSTD else ZLIB)
        except CompressionError as exc:
            raise MetadataCodecError(_PREFIX.size, str(exc)) from None
    else:
        body = view[_PREFIX.size:]
        if len(body) != raw_len:
            raise MetadataCodecError(1, f"recorded length {raw_len} disagrees with the payload ({len(body)})")
    try:
        # msgpack bounds every container and string by the buffer's own length.
        doc = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise MetadataCodecError(_PREFIX.size, f"metadata is not valid msgpack: {exc}") from None
    meta = _validate_metadata(doc, rows)
    if meta.version == 1 and flags == _FLAG_ZSTD:
        raise MetadataCodecError(0, "version-1 metadata compressed with zstd (zstd came with version 2)")
    return meta


def _validate_metadata(doc: object, rows: ListedRows | None = None) -> BucketMetadata:
    at = _PREFIX.size  # structural errors are reported at the body's start
    # The version is read before the length is checked: a later version's body may have another
    # length, and its reader must hear which version it met (a version-2 reader, which checked
    # the length first, calls a version-3 body "not a 5- or 6-element array").
    if not isinstance(doc, list) or not doc:
        raise MetadataCodecError(at, "metadata is not a non-empty array")
    version = doc[0]
    # ``type(v) is int``: msgpack decodes true as True and 1.0 as a float, both
    # of which compare equal to 1 but are not what any writer produces.
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise MetadataCodecError(at, f"snapshot version {version!r} is not supported (this reader knows "
                                     f"{', '.join(map(str, READABLE_VERSIONS))})")
    if len(doc) != _BODY_LENGTH[version]:
        raise MetadataCodecError(at, f"version {version} metadata has {len(doc)} elements")
    start, end, count, segments = doc[1:5]
    if not (_is_u64(start) and _is_u64(end) and _is_u64(count)) or start > end:
        raise MetadataCodecError(at, "ledger range or count is not a valid unsigned range")
    if not isinstance(segments, list):
        raise MetadataCodecError(at, "segment list is not an array")
    if version == 1:
        out = _validate_segments_v1(segments, start, end, at)
        bitmaps = union_bitmaps(seg.bitmaps for seg in out)
    elif version >= 4:  # version 6's entry 0 is version 5's
        out = _validate_segments_v2(segments, at)
        if sum(seg.count for seg in out) != count:  # (before the lists are allocated by count)
            raise MetadataCodecError(at, f"segments hold {sum(seg.count for seg in out)} indexes but the "
                                         f"bucket count is {count}")
        bitmaps = _validate_v4_bitmaps(doc, start, end, count, at, rows, out)
        card = bitmaps.cardinality
    else:
        out = _validate_segments_v2(segments, at)
        flat = doc[5] if version == 2 else _unshuffled_bitmaps(doc[5], doc[6], at)
        bitmaps = _validate_bitmaps(flat, start, end, at, "bucket")
        card = sum(len(bm) for bm in bitmaps.values())
    if version >= 2:
        if card != count:
            raise MetadataCodecError(at, f"the bucket's bitmaps hold {card} entries but its count is {count}")
    total = sum(seg.count for seg in out)
    if total != count:
        raise MetadataCodecError(at, f"segments hold {total} indexes but the bucket count is {count}")
    return BucketMetadata(start, end, count, out, version, bitmaps)


def _validate_v4_bitmaps(doc: list[object], start: int, end: int, count: int, at: int,
                         rows: ListedRows | None, segments: list[SegmentMetadata]) -> LedgerBitmaps:
    """Version 4's bitmaps: version 3's table and data, then the entry-id lists (checked as the
    spec says: ledgers in range, apart from the table's; the total is the caller's check).
    Version 5's: the same, the lists without their ids (``rows`` gathers them when asked)."""
    rest = _validate_bitmaps(_unshuffled_bitmaps(doc[5], doc[6], at), start, end, at, "bucket")
    ledgers, data = doc[7], doc[8]
    if not _is_u64(ledgers) or not isinstance(data, bytes) or (ledgers == 0) != (not data):
        raise MetadataCodecError(at, "bucket: the entry-id lists are malformed")
    if not ledgers:
        return bitmaps_with_lists(rest, EntryLists(*(np.zeros(0, dtype=_U64),) * 3))
    try:
        if doc[0] >= COUNTS_ONLY_VERSION:
            ids, counts = decode_counts(data, ledgers, count)  # type: ignore[arg-type]
        else:
            lists = decode_lists(data, ledgers, count)  # type: ignore[arg-type]
            ids = lists.ledgers
    except ListsError as exc:
        raise MetadataCodecError(at, f"bucket: entry-id lists, at byte {exc.offset} of them: {exc.reason}") from None
    if int(ids[0]) < start or int(ids[-1]) > end:
        raise MetadataCodecError(at, f"bucket: a ledger of the entry-id lists is outside [{start}, {end}]")
    if rest and np.isin(ids, np.fromiter(rest, dtype=_U64, count=len(rest))).any():
        raise MetadataCodecError(at, "bucket: a ledger has both a bitmap and an entry-id list")
    if doc[0] >= COUNTS_ONLY_VERSION:
        total = sum(len(bm) for bm in rest.values()) + int(counts.sum())
        return LedgerBitmaps(None, total, None, rest, unpack=partial(rows or _no_rows, doc[0], segments, ids, counts),
                             listed=ids.tolist(), counts=counts)
    # The arrays cost 8 to 16 bytes an index, the columns' bytes about 2: keep the bytes, decode again if asked.
    return bitmaps_with_lists(rest, lists, lambda: decode_lists(data, ledgers, count))  # type: ignore[arg-type]


def _no_rows(version: int, segments: object, ledgers: np.ndarray, counts: np.ndarray) -> EntryLists:
    raise ValueError("a version-5 entry 0 decoded alone: its listed ledgers' entry ids are the segments' "
                     "rows (open the file with BucketFile, or pass decode_metadata the rows)")


def _unshuffled_bitmaps(table: object, stored: object, at: int) -> list[object]:
    """Version 3's bitmap table and bytes as version 2's ``[ledger_id, width, bytes, ...]``
    (ledgers and widths are checked by :func:`_validate_bitmaps`)."""
    if not isinstance(table, list) or len(table) % 3 or not isinstance(stored, bytes):
        raise MetadataCodecError(at, "bucket: the bitmap table or its bytes are malformed")
    sizes = table[2::3]
    if not all(_is_u64(size) and size > 0 for size in sizes) or sum(sizes) != len(stored):
        raise MetadataCodecError(at, f"bucket: the bitmap sizes do not add up to the {len(stored)} bytes stored")
    data = stored if len(stored) < SHUFFLE_FROM else _unshuffle(stored)
    ends = list(accumulate(sizes))
    flat: list[object] = table.copy()
    flat[2::3] = [data[end - size:end] for end, size in zip(ends, sizes)]
    return flat


def _validate_bitmaps(flat: object, start: int, end: int, at: int, where: str) -> dict[int, EntryBitmap]:
    if not isinstance(flat, list) or len(flat) % 3:
        raise MetadataCodecError(at, f"{where}: the bitmap list is malformed")
    bitmaps: dict[int, EntryBitmap] = {}
    previous = -1
    for j in range(0, len(flat), 3):
        ledger, width, blob = flat[j:j + 3]
        if not _is_u64(ledger) or not start <= ledger <= end or ledger <= previous \
                or type(width) is not int or width not in (BITMAP32, BITMAP64) \
                or not isinstance(blob, bytes):
            raise MetadataCodecError(at, f"{where} has a malformed bitmap entry for ledger {ledger!r}")
        previous = ledger
        try:
            bm = (BitMap64 if width == BITMAP64 else BitMap).deserialize(blob)
        except (ValueError, IndexError, OverflowError) as exc:
            raise MetadataCodecError(at, f"{where} ledger {ledger}: bitmap does not deserialize: {exc}") from None
        bitmaps[ledger] = bm
    return bitmaps


def _validate_segments_v2(flat: list[object], at: int) -> list[SegmentMetadata]:
    if len(flat) % 3 or not all(_is_u64(v) for v in flat):
        raise MetadataCodecError(at, "the segment table is not a flat array of unsigned triples")
    out: list[SegmentMetadata] = []
    prev_max = -1
    for i in range(len(flat) // 3):
        lo, hi, n = flat[3 * i:3 * i + 3]
        if lo > hi or not 1 <= n <= MAX_SEGMENT_INDEXES or lo < prev_max:
            raise MetadataCodecError(at, f"segment {i + 1} has bounds [{lo}, {hi}] and count {n}, "
                                         "which are inconsistent")
        prev_max = hi
        out.append(SegmentMetadata(lo, hi, n))
    return out


def _validate_segments_v1(segments: list[object], start: int, end: int, at: int) -> list[SegmentMetadata]:
    out: list[SegmentMetadata] = []
    prev_max = -1
    for i, seg in enumerate(segments, start=1):
        if not (isinstance(seg, list) and len(seg) == 4 and all(_is_u64(v) for v in seg[:3])
                and isinstance(seg[3], list) and len(seg[3]) % 3 == 0):
            raise MetadataCodecError(at, f"segment {i} metadata is malformed")
        lo, hi, n, flat = seg
        if lo > hi or not 1 <= n <= MAX_SEGMENT_INDEXES or lo < prev_max:
            raise MetadataCodecError(at, f"segment {i} has bounds [{lo}, {hi}] and count {n}, which are inconsistent")
        prev_max = hi
        # Version 1 wrote ledgers ascending but did not say readers must check it.
        bitmaps = _validate_bitmaps(_sorted_flat(flat), start, end, at, f"segment {i}")
        card = sum(len(bm) for bm in bitmaps.values())
        if card != n:
            raise MetadataCodecError(at, f"segment {i} bitmaps hold {card} entries but the segment count is {n}")
        out.append(SegmentMetadata(lo, hi, n, bitmaps))
    return out


def _sorted_flat(flat: list[object]) -> list[object]:
    triples = [flat[j:j + 3] for j in range(0, len(flat), 3)]
    if all(_is_u64(t[0]) for t in triples):
        ledgers = [t[0] for t in triples]
        if len(set(ledgers)) == len(ledgers):
            triples.sort(key=lambda t: t[0])
    return [v for t in triples for v in t]


#: Rows from which :func:`build_bucket` given ``run_beside`` encodes its segments on two threads
#: (a merge of big buckets, not a seal: as ``row_sort.SPLIT_ROWS``).
SPLIT_ROWS = 2_000_000


def build_bucket(start_ledger: int, end_ledger: int, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, *,
                 time_step_ms: int, max_indexes_per_segment: int, compress: bool = True,
                 version: int = SNAPSHOT_VERSION,
                 run_beside: RunBeside | None = None
                 ) -> tuple[BucketMetadata, list[bytes]]:
    """Cut sorted columns into segments and encode them.

    Returns the metadata (entry 0, not yet encoded) and the encoded segment
    payloads (entries 1..N). Columns must be sorted by (timestamp, ledger, entry)
    without duplicates, every ledger must lie in ``[start_ledger, end_ledger]``,
    and a position ``(ledger, entry)`` may appear only once in the bucket (a
    repeat raises :class:`ValueError`). ``version=1`` writes the old layout
    (per-segment bitmaps, zlib), for tests and golden files.

    ``run_beside(fn)`` starts ``fn`` elsewhere and returns a callable that waits for its
    result: given one, a bucket of :data:`SPLIT_ROWS` rows or more has its segments encoded in
    pieces by the thread beside and this one, once it has made the bitmaps
    (:func:`~bucketstore.format.shared_work.encode_in_pieces`). Each segment's bytes depend on
    its rows alone, so the output is the same; numpy and zstd release the GIL, so on two cores
    the pieces overlap.
    """
    ts = np.ascontiguousarray(ts, dtype=_U64)
    ledgers = np.ascontiguousarray(ledgers, dtype=_U64)
    entries = np.ascontiguousarray(entries, dtype=_U64)
    if not len(ts) == len(ledgers) == len(entries):
        raise ValueError("columns differ in length")
    if not 0 <= start_ledger <= end_ledger < 1 << 64:
        raise ValueError(f"invalid ledger range [{start_ledger}, {end_ledger}]")
    if version not in READABLE_VERSIONS:
        raise ValueError(f"cannot write snapshot version {version}")
    if len(ts):
        if int(ledgers.min()) < start_ledger or int(ledgers.max()) > end_ledger:
            raise ValueError(f"an index lies outside the bucket's ledger range [{start_ledger}, {end_ledger}]")
        if check_sorted(ts, ledgers, entries) >= 0:
            raise ValueError("indexes are not sorted by (timestamp, ledger, entry) without duplicates")
    codec, grouped = (ZLIB if version == 1 else ZSTD), version >= GROUPED_VERSION
    bounds = cut_segments(ts, time_step_ms, max_indexes_per_segment)
    starts = np.fromiter((lo for lo, _ in bounds), dtype=np.int64, count=len(bounds))
    # All segments in one pass (the rows were checked above): a bucket's segments are often
    # small (a day of random delays cut every 5 minutes: ~170 rows), where per-segment calls
    # would cost more than the encoding itself.
    if run_beside is not None and len(ts) >= SPLIT_ROWS:
        held: list[LedgerBitmaps] = []  # entry 0's bitmaps, made on this thread as the one beside encodes
        payloads = encode_in_pieces(ts, ledgers, entries, starts, run_beside, compress=compress, codec=codec,
                                    grouped=grouped, first=(
            lambda: held.append(serialized_bitmaps(ledgers, entries))) if version != 1 else None)
        whole = held[0] if held else None
    else:
        payloads = encode_segments(ts, ledgers, entries, starts, compress=compress, codec=codec, check=False,
                                   grouped=grouped)
        whole = None
    metas = []
    if len(ts):
        lasts = np.append(starts[1:], len(ts)) - 1
        for (lo, hi), t_min, t_max in zip(bounds, ts[starts].tolist(), ts[lasts].tolist()):
            bitmaps = {}
            if version == 1:
                bitmaps = segment_bitmaps(ledgers[lo:hi], entries[lo:hi])
                # A position has one delivery time, so it appears once: entry 0's bitmap
                # cardinalities must add up to the count, and a reader rejects a file
                # where they do not. Refuse here rather than write such a file.
                if sum(len(bm) for bm in bitmaps.values()) != hi - lo:
                    raise ValueError(f"a position (ledger, entry) appears more than once among indexes {lo}..{hi - 1}")
            metas.append(SegmentMetadata(t_min, t_max, hi - lo, bitmaps))
    meta = BucketMetadata(start_ledger, end_ledger, len(ts), metas, version)
    if version == 1:
        meta.bitmaps = union_bitmaps(m.bitmaps for m in metas)
    else:
        bitmaps = whole if whole is not None else serialized_bitmaps(ledgers, entries)
        if bitmaps.cardinality != len(ts):
            raise ValueError("a position (ledger, entry) appears more than once in the bucket")
        meta.bitmaps = bitmaps
    return meta, payloads


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


def read_segment_entry(reader: LedgerReader, number: int, count: int, min_timestamp: int, max_timestamp: int,
                       *, snapshot_version: int | None = None) -> Segment:
    """Read ledger entry ``number`` of an open bucket file and decode it as a segment of ``count``
    indexes whose first and last timestamps entry 0 gives: the one segment decoder, behind
    :meth:`BucketFile.read_segment` and the engine's lazy segment loads.

    ``snapshot_version`` (the file's entry-0 version) refuses column kinds and compression the
    version lacks; None (a reader that has only the catalog summary) accepts every kind.

    :raises CorruptLedgerError: the entry is damaged, does not decode, or disagrees with entry 0,
        naming the file and the offset.
    """
    payload = reader.read_entry(number)
    at = reader.entry_payload_offset(number)
    try:
        seg = decode_segment(payload, count, snapshot_version=snapshot_version)
    except SegmentCodecError as exc:
        raise CorruptLedgerError(reader.path, at + exc.offset, f"segment {number}: {exc.reason}") from None
    if int(seg.timestamps[0]) != min_timestamp or int(seg.timestamps[-1]) != max_timestamp:
        raise CorruptLedgerError(reader.path, at, f"segment {number}: timestamps [{int(seg.timestamps[0])}, "
                                                  f"{int(seg.timestamps[-1])}] disagree with entry 0 "
                                                  f"[{min_timestamp}, {max_timestamp}]")
    return seg


class BucketFile:
    """A sealed bucket snapshot opened for reading.

    Opening reads and validates the ledger header, trailer and entry 0; segments
    are read on demand with :meth:`read_segment`. All damage is raised as
    :class:`~bucketstore.CorruptLedgerError` naming the file and offset.
    """

    def __init__(self, path: str | os.PathLike[str], *, fs: FileSystem = REAL_FS) -> None:
        self.ledger = LedgerReader(path, fs=fs)
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
                self.metadata = decode_metadata(payload, partial(read_listed, self.ledger, fs))
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
            if props.get("bucket_key") != meta.key:
                raise CorruptLedgerError(self.path, 24, f"header bucket_key {props.get('bucket_key')!r} is not "
                                                        f"{meta.key!r}, entry 0's range")
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

    def segment_positions(self, number: int) -> dict[int, EntryBitmap]:
        """Ledger id -> bitmap of the entry ids in segment ``number`` (1-based).

        Version 1 records them in entry 0; later versions imply them, so the segment is read.
        """
        meta = self.metadata.segments[number - 1]
        if self.metadata.version == 1:
            return meta.bitmaps
        seg = self.read_segment(number)
        return ledger_bitmaps(seg.ledger_ids, seg.entry_ids)

    def read_segment(self, number: int) -> Segment:
        """Read and decode segment ``number`` (1-based, as ledger entry ``number``)."""
        if not 1 <= number <= self.segment_count:
            raise IndexError(f"{self.path}: segment {number} out of range 1..{self.segment_count}")
        meta = self.metadata.segments[number - 1]
        return read_segment_entry(self.ledger, number, meta.count, meta.min_timestamp, meta.max_timestamp,
                                  snapshot_version=self.metadata.version)

    def close(self) -> None:
        self.ledger.close()

    def __enter__(self) -> "BucketFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
