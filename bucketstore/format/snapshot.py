"""Bucket snapshots: a sealed bucket as a ledger file.

Entry 0 holds the bucket metadata (:class:`BucketMetadata`): the ledger range,
the index count, per segment its min and max schedule timestamp and index
count, and the delayed-index bitmaps (roaring bitmaps of entry ids, keyed by
ledger id). Entries 1..N hold the segments in the compact encoding of
:mod:`bucketstore.format.segment_codec`.

Version 2 (what this module writes) keeps *one* bitmap per ledger for the
whole bucket: the segments already say which segment holds which position, so
version 1's per-segment bitmaps (PIP-195's layout, still read) stored every
position twice. The engine needs only bucket-wide membership at recovery; the
positions of one segment, when needed, come from decoding it
(:meth:`BucketFile.segment_positions`).

Segments are cut as Pulsar cuts them (reference §1.4): a segment opens at its
first index with timestamp ``t0`` and closes when the next index is later than
``t0 + time_step - 1`` or when it holds ``max_indexes`` indexes (-1: no cap but
the format's hard cap).

The byte-level specification is ``formats/bucket_snapshot.md``.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Union

import msgpack
import numpy as np
from pyroaring import BitMap, BitMap64

from ..errors import CorruptLedgerError
from .compression import ZLIB, ZSTD, CompressionError, compress as _compress, decompress_exact
from .fs import REAL_FS, FileSystem
from .ledger_file import LedgerReader, PropertyValue, write_ledger
from .row_sort import sort_rows
from .segment_codec import (_BLOCK_ROWS, MAX_SEGMENT_INDEXES, Segment, SegmentCodecError, check_sorted, decode_segment,
                            encode_segments)

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
    "bucket_key",
    "parse_bucket_key",
    "BUCKET_KEY_PREFIX",
    "sort_indexes",
    "drop_repeats",
]

#: The version this module writes.
SNAPSHOT_VERSION = 2
#: The versions it reads.
READABLE_VERSIONS = (1, 2)
BUCKET_KEY_PREFIX = "#pulsar.internal.delayed.bucket"
_U64 = np.dtype("<u8")
_FLAG_ZLIB = 0x01
_FLAG_ZSTD = 0x02  # version 2 only
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
    #: Version 1 only: ledger id -> roaring bitmap of the entry ids of that ledger in
    #: this segment. Empty in version 2, whose bitmaps are the bucket's (:attr:`BucketMetadata.bitmaps`).
    bitmaps: dict[int, EntryBitmap] = field(default_factory=dict)


@dataclass(slots=True)
class BucketMetadata:
    """Entry 0 of a bucket snapshot."""

    start_ledger: int
    end_ledger: int
    count: int
    segments: list[SegmentMetadata]
    version: int = SNAPSHOT_VERSION
    #: ledger id -> bitmap of every entry id of that ledger in the bucket. Stored in
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


def ledger_bitmaps(ledgers: np.ndarray, entries: np.ndarray) -> dict[int, EntryBitmap]:
    """Per-ledger bitmaps of the entry ids of unsorted columns (a whole bucket's).

    The ids are sorted by (ledger, entry) first: pyroaring, which holds the GIL, builds a
    bitmap about four times faster from sorted ids (bench_maintenance ``steps``), and
    numpy's sort releases the GIL, so the maintenance thread leaves more of it to adders.
    """
    if not len(ledgers):
        return {}
    first = ledgers[0]
    if (ledgers == first).all():
        return {int(first): _make_bitmap(np.sort(entries))}
    lo = int(ledgers.min())
    shift = 64 - (int(ledgers.max()) - lo).bit_length()
    if int(entries.max()) < 1 << shift:
        # One uint64 key per position, (ledger - lo) above the entry id: one vectorised sort.
        key = ledgers - np.uint64(lo)
        key <<= np.uint64(shift)
        key |= entries
        key.sort()
        sl = (key >> np.uint64(shift)) + np.uint64(lo)
        se = key & np.uint64((1 << shift) - 1)
    else:
        order = np.lexsort((entries, ledgers))
        sl, se = ledgers[order], entries[order]
    cuts = np.flatnonzero(sl[1:] != sl[:-1]) + 1
    starts = [0, *cuts.tolist()]
    ends = [*cuts.tolist(), len(sl)]
    return {int(sl[a]): _make_bitmap(se[a:b]) for a, b in zip(starts, ends)}


class LedgerBitmaps(Mapping[int, EntryBitmap]):
    """Ledger id -> roaring bitmap of entry ids, held as entry 0's serialized bitmaps.

    A seal writes a bucket's bitmaps and never reads them back (the tracker-wide
    index has the positions already), so :func:`serialized_bitmaps` makes their
    portable serializations directly; the bitmap objects are deserialized only
    if someone reads this mapping.
    """

    __slots__ = ("_ledgers", "_flat", "_loaded", "cardinality")

    def __init__(self, flat: list[object], cardinality: int) -> None:
        #: ``[ledger_id, width, blob, ...]`` in ascending ledger order: entry 0's bitmap list.
        self._flat = flat
        self._ledgers = flat[0::3]
        self._loaded: dict[int, EntryBitmap] | None = None
        #: The number of positions, the sum of the bitmaps' cardinalities.
        self.cardinality = cardinality

    def flat(self) -> list[object]:
        """Entry 0's bitmap list, ``[ledger_id, width, blob, ...]``."""
        return self._flat

    def _load(self) -> dict[int, EntryBitmap]:
        if self._loaded is None:
            flat = self._flat
            self._loaded = {flat[j]: (BitMap64 if flat[j + 1] == _BITMAP64 else BitMap).deserialize(flat[j + 2])
                            for j in range(0, len(flat), 3)}
        return self._loaded

    def __getitem__(self, ledger: int) -> EntryBitmap:
        return self._load()[ledger]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ledgers)

    def __len__(self) -> int:
        return len(self._ledgers)


# The portable 32-bit roaring serialization (RoaringFormatSpec), for the ledgers made
# by serialized_bitmaps' fast path: every container an array container.
_COOKIE_NO_RUNS = 12346
_ARRAY_MAX = 4096  # CRoaring keeps up to 4096 values in an array container, more in a bitset


def serialized_bitmaps(ledgers: np.ndarray, entries: np.ndarray) -> LedgerBitmaps:
    """Per-ledger bitmaps of the positions in these columns (any order), serialized as
    entry 0 stores them: each exactly what ``_make_bitmap(...).serialize()`` gives.

    The common ledger of a sparse bucket (a few hundred entry ids, few of them
    consecutive) is a roaring bitmap of array containers only; those are laid out
    for all ledgers at once with array operations. A ledger whose bitmap has a run
    or a bitset container after run optimization, or an entry id of 2**32 or more,
    is built by pyroaring, as before. Repeated positions count once.
    """
    ledgers = np.ascontiguousarray(ledgers, dtype=_U64)
    entries = np.ascontiguousarray(entries, dtype=_U64)
    if not len(ledgers):
        return LedgerBitmaps([], 0)
    if (int(ledgers.max()) - int(ledgers.min()) + 1) * _ARRAY_MAX < len(ledgers):
        # Few ledgers, thousands of positions each (a dense bucket): their containers are
        # runs or bitsets, pyroaring's to make, and sorting every position would cost more.
        bitmaps = ledger_bitmaps(ledgers, entries)
        flat = _flat_bitmaps(bitmaps)
        out = LedgerBitmaps(flat, sum(len(bm) for bm in bitmaps.values()))
        out._loaded = bitmaps
        return out
    sl, se = _positions_in_order(ledgers, entries)
    flat: list[object] = []
    total, lo, n = 0, 0, len(sl)
    # Blocks of whole ledgers (see segment_codec._BLOCK_ROWS: temporaries the allocator reuses).
    while lo < n:
        hi = n if n - lo <= _BLOCK_ROWS else int(np.searchsorted(sl, sl[lo + _BLOCK_ROWS], side="left"))
        if hi == lo:  # one ledger of more than _BLOCK_ROWS positions
            hi = int(np.searchsorted(sl, sl[lo], side="right"))
        total += _bitmap_block(sl[lo:hi], se[lo:hi], flat)
        lo = hi
    return LedgerBitmaps(flat, total)


def _bitmap_block(sl: np.ndarray, se: np.ndarray, flat: list[object]) -> int:
    """Append ``[ledger, width, blob, ...]`` for whole ledgers' sorted positions; return their count."""
    n = len(sl)
    if n > 1:  # drop repeated positions: a bitmap is a set
        fresh = np.ones(n, dtype=np.bool_)
        fresh[1:] = (sl[1:] != sl[:-1]) | (se[1:] != se[:-1])
        if not fresh.all():
            sl, se = sl[fresh], se[fresh]
            n = len(sl)
    new_ledger = np.ones(n, dtype=np.bool_)
    np.not_equal(sl[1:], sl[:-1], out=new_ledger[1:])
    first_row = np.flatnonzero(new_ledger)
    per_ledger = np.diff(first_row, append=n)
    ledger_ids = sl[first_row]
    high = se >> np.uint64(16)
    new_container = new_ledger.copy()
    new_container[1:] |= high[1:] != high[:-1]
    first_in_container = np.flatnonzero(new_container)
    cards = np.diff(first_in_container, append=n)
    # A run starts wherever an entry id does not follow the one before it in its container.
    run_start = new_container.copy()
    run_start[1:] |= se[1:] != se[:-1] + np.uint64(1)
    runs = np.add.reduceat(run_start.astype(np.int64), first_in_container)
    # run_optimize keeps an array container unless runs are smaller: 2 + 4 runs < 2 + 2 card.
    array_like = (cards <= _ARRAY_MAX) & (2 * runs >= cards)
    container_ledger = np.cumsum(new_ledger)[first_in_container] - 1
    fast = np.logical_and.reduceat(array_like, np.flatnonzero(new_ledger[first_in_container]))
    wide = np.maximum.reduceat(se, first_row) >= np.uint64(1 << 32)
    fast &= ~wide
    blobs: list[bytes] = [b""] * len(ledger_ids)
    if fast.any():
        _array_only_blobs(blobs, fast, se, first_row, per_ledger, first_in_container, cards, container_ledger, high)
    for j in np.flatnonzero(~fast).tolist():
        lo = int(first_row[j])
        blobs[j] = _make_bitmap(se[lo:lo + int(per_ledger[j])]).serialize()
    for ledger, is_wide, blob in zip(ledger_ids.tolist(), wide.tolist(), blobs):
        flat += [ledger, _BITMAP64 if is_wide else _BITMAP32, blob]
    return n


def _positions_in_order(ledgers: np.ndarray, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The columns sorted by (ledger, entry): one sort of packed keys when the ranges fit 64 bits."""
    l0, e0 = ledgers.min(), entries.min()
    lb = (int(ledgers.max()) - int(l0)).bit_length()
    eb = (int(entries.max()) - int(e0)).bit_length()
    if lb + eb > 64:
        order = np.lexsort((entries, ledgers))
        return ledgers[order], entries[order]
    if lb == 0:
        return ledgers.copy(), np.sort(entries)
    # Two buffers in all (fresh pages are dear on a VM): the key, sorted in place, becomes
    # the entry column, and the scratch buffer the ledger column.
    key = np.subtract(ledgers, l0)
    scratch = np.empty_like(key)
    if eb:
        key <<= np.uint64(eb)
        key |= np.subtract(entries, e0, out=scratch)
    key.sort()
    sl = np.right_shift(key, np.uint64(eb), out=scratch)
    sl += l0
    if eb:
        key &= np.uint64((1 << eb) - 1)
        key += e0
        return sl, key
    return sl, np.full(len(key), e0, dtype=_U64)


def _array_only_blobs(blobs: list[bytes], fast: np.ndarray, se: np.ndarray, first_row: np.ndarray,
                      per_ledger: np.ndarray, first_in_container: np.ndarray, cards: np.ndarray,
                      container_ledger: np.ndarray, high: np.ndarray) -> None:
    """Fill ``blobs[j]`` for the ``fast`` ledgers: portable roaring bitmaps of array containers only.

    Layout (no run containers): cookie u32 = 12346, container count u32, per container
    its key u16 and cardinality - 1 u16, per container its byte offset u32, then each
    container's sorted low 16 bits as u16. Every field is a whole number of u16, so
    all the ledgers are written into one u16 buffer and sliced.
    """
    chosen = np.flatnonzero(fast)
    containers = np.bincount(container_ledger, minlength=len(fast))
    c = containers[chosen].astype(np.int64)
    size16 = 4 + 4 * c + per_ledger[chosen]
    base = np.cumsum(size16) - size16
    buf = np.zeros(int(size16.sum()), dtype="<u2")
    buf[base] = _COOKIE_NO_RUNS
    buf[base + 2] = c & 0xFFFF
    buf[base + 3] = c >> 16
    # Containers of the chosen ledgers, in order; q = the container's index in its ledger.
    where = np.full(len(fast), -1, dtype=np.int64)
    where[chosen] = np.arange(len(chosen))
    slot = where[container_ledger]
    keep = slot >= 0
    k_slot = slot[keep]
    k_first = first_in_container[keep]
    k_card = cards[keep]
    k_ledger_first_container = np.cumsum(containers) - containers  # global container index of each ledger's first
    q = np.flatnonzero(keep) - k_ledger_first_container[container_ledger[keep]]
    k_base, k_c = base[k_slot], c[k_slot]
    header = k_base + 4 + 2 * q
    buf[header] = high[k_first].astype(np.uint16)
    buf[header + 1] = (k_card - 1).astype(np.uint16)
    # Byte offset of each container: after the 8-byte preamble and 8 bytes of header per container,
    # plus the values of the ledger's earlier containers (first row of the container - first row of the ledger).
    offset = 8 + 8 * k_c + 2 * (k_first - first_row[container_ledger[keep]])
    at = k_base + 4 + 2 * k_c + 2 * q
    buf[at] = offset & 0xFFFF
    buf[at + 1] = offset >> 16
    # Values: the ledger's entry ids in order, low 16 bits, after its headers.
    rows_per = per_ledger[chosen]
    rows = np.repeat(first_row[chosen], rows_per) + (np.arange(int(rows_per.sum())) -
                                                      np.repeat(np.cumsum(rows_per) - rows_per, rows_per))
    dest = np.repeat(base + 4 + 4 * c - first_row[chosen], rows_per) + rows
    buf[dest] = (se[rows] & np.uint64(0xFFFF)).astype(np.uint16)
    blob = buf.tobytes()
    for j, a, b in zip(chosen.tolist(), (2 * base).tolist(), (2 * (base + size16)).tolist()):
        blobs[j] = blob[a:b]


def _flat_bitmaps(bitmaps: Mapping[int, EntryBitmap]) -> list[object]:
    if isinstance(bitmaps, LedgerBitmaps):
        return bitmaps.flat()
    flat: list[object] = []
    for ledger in sorted(bitmaps):
        bm = bitmaps[ledger]
        flat += [ledger, _BITMAP64 if isinstance(bm, BitMap64) else _BITMAP32, bm.serialize()]
    return flat


def encode_metadata(meta: BucketMetadata, *, compress: bool = True) -> bytes:
    """Encode entry 0 in ``meta.version``'s layout (2 unless a test asks for 1).

    Version 2: ``flags u8, body_length u32`` then the msgpack body, one zstd frame
    when flag bit 1 is set (used when smaller). The body is the array
    ``[2, start_ledger, end_ledger, count, segments, bitmaps]``, ``segments`` a flat
    array ``[min_ts, max_ts, count, ...]`` and ``bitmaps`` a flat array
    ``[ledger_id, width, bytes, ...]`` of the bucket's bitmaps in ascending ledger order.
    """
    if meta.version == 1:
        return _encode_metadata_v1(meta, compress=compress)
    if meta.version != SNAPSHOT_VERSION:
        raise ValueError(f"cannot write snapshot version {meta.version}")
    segments: list[int] = []
    for seg in meta.segments:
        segments += [seg.min_timestamp, seg.max_timestamp, seg.count]
    body = msgpack.packb([meta.version, meta.start_ledger, meta.end_ledger, meta.count, segments,
                          _flat_bitmaps(meta.bitmaps)], use_bin_type=True)
    if compress and len(body) > 64:
        packed = _compress(body, ZSTD)
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
    segments = [[seg.min_timestamp, seg.max_timestamp, seg.count, _flat_bitmaps(seg.bitmaps)]
                for seg in meta.segments]
    body = msgpack.packb([1, meta.start_ledger, meta.end_ledger, meta.count, segments], use_bin_type=True)
    if compress and len(body) > 64:
        packed = _compress(body, ZLIB)
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
    meta = _validate_metadata(doc)
    if meta.version == 1 and flags == _FLAG_ZSTD:
        raise MetadataCodecError(0, "version-1 metadata compressed with zstd (zstd came with version 2)")
    return meta


def _validate_metadata(doc: object) -> BucketMetadata:
    at = _PREFIX.size  # structural errors are reported at the body's start
    if not isinstance(doc, list) or len(doc) not in (5, 6):
        raise MetadataCodecError(at, "metadata is not a 5- or 6-element array")
    version = doc[0]
    # ``type(v) is int``: msgpack decodes true as True and 1.0 as a float, both
    # of which compare equal to 1 but are not what any writer produces.
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise MetadataCodecError(at, f"snapshot version {version!r} is not supported (this reader knows "
                                     f"{', '.join(map(str, READABLE_VERSIONS))})")
    if len(doc) != (5 if version == 1 else 6):
        raise MetadataCodecError(at, f"version {version} metadata has {len(doc)} elements")
    start, end, count, segments = doc[1:5]
    if not (_is_u64(start) and _is_u64(end) and _is_u64(count)) or start > end:
        raise MetadataCodecError(at, "ledger range or count is not a valid unsigned range")
    if not isinstance(segments, list):
        raise MetadataCodecError(at, "segment list is not an array")
    if version == 1:
        out = _validate_segments_v1(segments, start, end, at)
        bitmaps = union_bitmaps(seg.bitmaps for seg in out)
    else:
        out = _validate_segments_v2(segments, at)
        bitmaps = _validate_bitmaps(doc[5], start, end, at, "bucket")
        card = sum(len(bm) for bm in bitmaps.values())
        if card != count:
            raise MetadataCodecError(at, f"the bucket's bitmaps hold {card} entries but its count is {count}")
    total = sum(seg.count for seg in out)
    if total != count:
        raise MetadataCodecError(at, f"segments hold {total} indexes but the bucket count is {count}")
    return BucketMetadata(start, end, count, out, version, bitmaps)


def _validate_bitmaps(flat: object, start: int, end: int, at: int, where: str) -> dict[int, EntryBitmap]:
    if not isinstance(flat, list) or len(flat) % 3:
        raise MetadataCodecError(at, f"{where}: the bitmap list is malformed")
    bitmaps: dict[int, EntryBitmap] = {}
    previous = -1
    for j in range(0, len(flat), 3):
        ledger, width, blob = flat[j:j + 3]
        if not _is_u64(ledger) or not start <= ledger <= end or ledger <= previous \
                or type(width) is not int or width not in (_BITMAP32, _BITMAP64) \
                or not isinstance(blob, bytes):
            raise MetadataCodecError(at, f"{where} has a malformed bitmap entry for ledger {ledger!r}")
        previous = ledger
        try:
            bm = (BitMap64 if width == _BITMAP64 else BitMap).deserialize(blob)
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


def union_bitmaps(parts: Iterable[Mapping[int, EntryBitmap]]) -> dict[int, EntryBitmap]:
    """The per-ledger union of several ``ledger -> bitmap`` maps (new bitmaps; 64-bit where
    any part is)."""
    union: dict[int, EntryBitmap] = {}
    for bitmaps in parts:
        for ledger, bm in bitmaps.items():
            have = union.get(ledger)
            if have is None:
                union[ledger] = bm.copy()
            elif type(have) is type(bm):
                have |= bm
            else:
                union[ledger] = BitMap64(have) | BitMap64(bm)
    return union


def build_bucket(start_ledger: int, end_ledger: int, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, *,
                 time_step_ms: int, max_indexes_per_segment: int, compress: bool = True,
                 version: int = SNAPSHOT_VERSION) -> tuple[BucketMetadata, list[bytes]]:
    """Cut sorted columns into segments and encode them.

    Returns the metadata (entry 0, not yet encoded) and the encoded segment
    payloads (entries 1..N). Columns must be sorted by (timestamp, ledger, entry)
    without duplicates, every ledger must lie in ``[start_ledger, end_ledger]``,
    and a position ``(ledger, entry)`` may appear only once in the bucket (a
    repeat raises :class:`ValueError`). ``version=1`` writes the old layout
    (per-segment bitmaps, zlib), for tests and golden files.
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
    codec = ZLIB if version == 1 else ZSTD
    bounds = cut_segments(ts, time_step_ms, max_indexes_per_segment)
    starts = np.fromiter((lo for lo, _ in bounds), dtype=np.int64, count=len(bounds))
    # All segments in one pass (the rows were checked above): a bucket's segments are often
    # small (a day of random delays cut every 5 minutes: ~170 rows), where per-segment calls
    # would cost more than the encoding itself.
    payloads = encode_segments(ts, ledgers, entries, starts, compress=compress, codec=codec, check=False)
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
        bitmaps = serialized_bitmaps(ledgers, entries)
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

        Version 1 records them in entry 0; version 2 implies them, so the segment is read.
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
        payload = self.ledger.read_entry(number)
        at = self.ledger.entry_payload_offset(number)
        try:
            seg = decode_segment(payload, meta.count, snapshot_version=self.metadata.version)
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
