"""The compact encoding of one segment: a sorted run of delayed indexes.

A segment is three parallel uint64 columns (timestamp, ledger id, entry id),
sorted by (timestamp, ledger, entry). Each column is stored as its first value
plus the differences between neighbours, because sorted timestamps and
consecutive entry ids make those differences small or constant:

* ``ARITH``: every difference is the same (fixed-delay traffic: ts +1 ms, entry +1);
  the column costs 17 bytes whatever its length.
* ``DELTA_U``: the column never decreases; differences stored unsigned.
* ``DELTA_Z``: differences zigzag-encoded (small negatives stay small).
* ``FRAME`` (version 2): every value as its offset from the column's minimum,
  for columns that jump about within a narrow range (the ledger and entry ids
  of a bucket with random delays, above all a merged one): a difference of two
  such values needs a bit more than the value itself.

Differences are stored at the narrowest byte width that fits them all (1, 2, 4
or 8) and *byte-planar* (all low bytes, then all second bytes, ...), which lets
the compressor find the long runs of zero high bytes. The whole body is compressed
when that makes it smaller: one zstd frame (format version 2), or a zlib stream
(version 1 files, which readers keep accepting). ``formats/bucket_snapshot.md`` specifies
the bytes; tools/bench/bench_codec.py measures the choice against alternatives.

Decoding never trusts a length: the count is checked against a hard cap and the
expected count the caller knows (from entry 0), and decompression is bounded by
the size the columns can legitimately take.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .compression import ZLIB, ZSTD, CompressionError, compress as _compress, decompress_exact

__all__ = [
    "Segment",
    "SegmentCodecError",
    "MAX_SEGMENT_INDEXES",
    "encode_segment",
    "decode_segment",
    "check_sorted",
]

#: The format's hard cap on indexes per segment (2**24). Segmentation always cuts
#: at this size, even when ``max_indexes_per_segment`` is -1, so a decoder can
#: refuse any larger count without allocating for it.
MAX_SEGMENT_INDEXES = 1 << 24

FLAG_ZLIB = 0x01
#: Format version 2: the body is one zstd frame (never together with FLAG_ZLIB).
FLAG_ZSTD = 0x02
_CODEC_FLAG = {ZLIB: FLAG_ZLIB, ZSTD: FLAG_ZSTD}
KIND_ARITH = 0
KIND_DELTA_U = 1
KIND_DELTA_Z = 2
#: Version 2: each value stored as its offset from the column's minimum (frame of reference).
KIND_FRAME = 3
#: Version 2: offsets from the minimum below 16, bit-packed 1, 2 or 4 bits a value.
KIND_PACKED = 4
_PACK_BITS = (1, 2, 4)

_PREFIX = struct.Struct("<BI")  # flags, count
_RAW_LEN = struct.Struct("<I")
_ARITH = struct.Struct("<BQQ")  # kind, first, step
_DELTA = struct.Struct("<BQB")  # kind, first, width
_WIDTH_DTYPE = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_U64 = np.dtype("<u8")


class SegmentCodecError(ValueError):
    """A segment payload is malformed; ``offset`` is relative to the payload start."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"offset {offset}: {reason}")


@dataclass(frozen=True, slots=True)
class Segment:
    """One decoded segment: three equal-length uint64 numpy columns in index order."""

    timestamps: np.ndarray
    ledger_ids: np.ndarray
    entry_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.timestamps)


def check_sorted(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> int:
    """Return the first position ``i`` (>= 1) where row ``i`` is not strictly after row ``i-1``
    in (timestamp, ledger, entry) order, or -1 when the rows are strictly increasing."""
    if len(ts) < 2:
        return -1
    t0, t1 = ts[:-1], ts[1:]
    l0, l1 = ledgers[:-1], ledgers[1:]
    ok = (t1 > t0) | ((t1 == t0) & ((l1 > l0) | ((l1 == l0) & (entries[1:] > entries[:-1]))))
    if ok.all():
        return -1
    return int(np.argmin(ok)) + 1


def _encode_column(values: np.ndarray, frame: bool = True) -> list[bytes]:
    """One column as its pieces: the header, then each byte plane (see ``compression``)."""
    first = int(values[0])
    if len(values) == 1:
        return [_ARITH.pack(KIND_ARITH, first, 0)]
    # uint64 subtraction wraps, so differences are exact modulo 2**64 for any input.
    diffs = np.diff(values)
    step = int(diffs[0])
    if (diffs == diffs[0]).all():
        return [_ARITH.pack(KIND_ARITH, first, step)]
    if (values[1:] >= values[:-1]).all():
        kind, stored = KIND_DELTA_U, diffs
    else:
        signed = diffs.view(np.int64)
        stored = ((signed << 1) ^ (signed >> 63)).view(np.uint64)
        kind = KIND_DELTA_Z
    width = _width(int(stored.max()))
    if kind == KIND_DELTA_Z and frame:
        low = values.min()
        frame_width = _width(int(values.max() - low))
        # Measured (bench_codec, merged buckets): offsets beat zigzag differences
        # whenever they are no wider, because they carry about one bit less.
        if frame_width <= width:
            offsets = values - low
            top = int(offsets.max())
            if top < 16:
                # A handful of distinct values (the ledgers of a merged bucket): zstd's
                # Huffman stage spends at least one bit a byte, so pack them first.
                bits = next(b for b in _PACK_BITS if top < 1 << b)
                return [_DELTA.pack(KIND_PACKED, int(low), bits), _pack_bits(offsets, bits)]
            return [_DELTA.pack(KIND_FRAME, int(low), frame_width), *_planes(offsets, frame_width)]
    return [_DELTA.pack(kind, first, width), *_planes(stored, width)]


def _pack_bits(offsets: np.ndarray, bits: int) -> bytes:
    """Values < 2**bits, ``8 // bits`` to a byte, the first value in the lowest bits."""
    per = 8 // bits
    padded = np.zeros(-(-len(offsets) // per) * per, dtype=np.uint8)
    padded[:len(offsets)] = offsets
    lanes = padded.reshape(-1, per)
    packed = lanes[:, 0].copy()
    for k in range(1, per):
        packed |= lanes[:, k] << np.uint8(k * bits)
    return packed.tobytes()


def _unpack_bits(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    lanes = np.empty((len(packed), per), dtype=np.uint8)
    for k in range(per):
        lanes[:, k] = (packed >> np.uint8(k * bits)) & mask
    return lanes.reshape(-1)[:n]


def _width(top: int) -> int:
    return 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4 if top < 1 << 32 else 8


def _planes(stored: np.ndarray, width: int) -> list[bytes]:
    narrow = stored.astype(_WIDTH_DTYPE[width])
    if width == 1:
        return [narrow.tobytes()]
    planes = narrow.view(np.uint8).reshape(-1, width).T
    return [plane.tobytes() for plane in planes]


def encode_segment(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, *, compress: bool = True,
                   codec: str = ZSTD) -> bytes:
    """Encode a sorted, non-empty run of indexes as a segment payload.

    :param ts: timestamps (uint64-compatible), sorted with ``ledgers`` and ``entries``
        by (timestamp, ledger, entry), no duplicates.
    :param compress: try compressing and keep it when it is smaller (golden files
        and benchmarks can turn it off).
    :param codec: ``"zstd"`` (format version 2, the default) or ``"zlib"`` (what a
        version-1 writer produced).
    :raises ValueError: empty input, mismatched lengths, more than
        :data:`MAX_SEGMENT_INDEXES` rows, or rows out of order.
    """
    ts = np.ascontiguousarray(ts, dtype=_U64)
    ledgers = np.ascontiguousarray(ledgers, dtype=_U64)
    entries = np.ascontiguousarray(entries, dtype=_U64)
    n = len(ts)
    if n == 0 or len(ledgers) != n or len(entries) != n:
        raise ValueError("a segment needs at least one index and three columns of equal length")
    if n > MAX_SEGMENT_INDEXES:
        raise ValueError(f"a segment holds at most {MAX_SEGMENT_INDEXES} indexes, not {n}")
    bad = check_sorted(ts, ledgers, entries)
    if bad >= 0:
        raise ValueError(f"segment rows are not strictly increasing at row {bad}")
    # Version 1 (zlib) segments never hold FRAME columns: a version-1 reader would refuse them.
    frame = codec != ZLIB
    pieces = [*_encode_column(ts, frame), *_encode_column(ledgers, frame), *_encode_column(entries, frame)]
    body = b"".join(pieces)
    if compress and len(body) > 64:
        packed = _compress(pieces, codec)
        if len(packed) + _RAW_LEN.size < len(body):
            return _PREFIX.pack(_CODEC_FLAG[codec], n) + _RAW_LEN.pack(len(body)) + packed
    return _PREFIX.pack(0, n) + body


def _max_body_size(n: int) -> int:
    return 3 * (_DELTA.size + 8 * n) + 3 * _ARITH.size


def _decode_column(body: memoryview, pos: int, n: int, base: int) -> tuple[np.ndarray, int]:
    if pos >= len(body):
        raise SegmentCodecError(base + pos, "segment ends before all three columns")
    kind = body[pos]
    if kind == KIND_ARITH:
        if pos + _ARITH.size > len(body):
            raise SegmentCodecError(base + pos, "truncated constant-step column")
        _, first, step = _ARITH.unpack_from(body, pos)
        # Wrapping uint64 arithmetic reproduces exactly what the encoder's np.diff produced.
        col = np.uint64(first) + np.arange(n, dtype=_U64) * np.uint64(step)
        return col, pos + _ARITH.size
    if kind not in (KIND_DELTA_U, KIND_DELTA_Z, KIND_FRAME, KIND_PACKED):
        raise SegmentCodecError(base + pos, f"unknown column kind {kind}")
    if pos + _DELTA.size > len(body):
        raise SegmentCodecError(base + pos, "truncated delta column header")
    _, first, width = _DELTA.unpack_from(body, pos)
    if kind == KIND_PACKED:
        if width not in _PACK_BITS:
            raise SegmentCodecError(base + pos + 9, f"packed column of {width} bits a value is not 1, 2 or 4")
        start = pos + _DELTA.size
        size = -(-n * width // 8)
        if start + size > len(body):
            raise SegmentCodecError(base + start, f"column of {n} values at {width} bits does not fit the segment")
        packed = np.frombuffer(body, dtype=np.uint8, count=size, offset=start)
        col = _unpack_bits(packed, width, n).astype(_U64)
        col += np.uint64(first)
        return col, start + size
    if width not in _WIDTH_DTYPE:
        raise SegmentCodecError(base + pos + 9, f"column width {width} is not 1, 2, 4 or 8")
    start = pos + _DELTA.size
    if kind == KIND_FRAME:
        size = width * n
        if start + size > len(body):
            raise SegmentCodecError(base + start, f"column of {n} values at width {width} does not fit the segment")
        raw = np.frombuffer(body, dtype=np.uint8, count=size, offset=start)
        if width > 1:
            raw = raw.reshape(width, n).T.copy()
        col = raw.view(_WIDTH_DTYPE[width]).reshape(-1).astype(_U64)
        col += np.uint64(first)  # wraps like the encoder's subtraction
        return col, start + size
    size = width * (n - 1)
    if start + size > len(body):
        raise SegmentCodecError(base + start, f"column of {n} values at width {width} does not fit the segment")
    raw = np.frombuffer(body, dtype=np.uint8, count=size, offset=start)
    if width > 1:
        raw = raw.reshape(width, n - 1).T.copy()
    stored = raw.view(_WIDTH_DTYPE[width]).reshape(-1).astype(_U64)
    if kind == KIND_DELTA_Z:
        stored = (stored >> np.uint64(1)) ^ (np.uint64(0) - (stored & np.uint64(1)))
    col = np.empty(n, dtype=_U64)
    col[0] = first
    col[1:] = stored
    np.cumsum(col, out=col)  # wraps modulo 2**64, undoing the encoder's wrapping differences
    return col, start + size


def decode_segment(payload: bytes | memoryview, expected_count: int | None = None, *,
                   check_order: bool = True) -> Segment:
    """Decode a segment payload made by :func:`encode_segment`.

    :param expected_count: the count entry 0 records for this segment; a
        different count in the payload is damage.
    :param check_order: verify that rows are strictly increasing (cheap; on by default
        because the shared queue's correctness rests on it).
    :raises SegmentCodecError: on any malformation, with the offset in the payload.
    """
    view = memoryview(payload)
    if len(view) < _PREFIX.size:
        raise SegmentCodecError(0, "segment payload is shorter than its 5-byte prefix")
    flags, n = _PREFIX.unpack_from(view)
    if flags & ~(FLAG_ZLIB | FLAG_ZSTD) or flags == FLAG_ZLIB | FLAG_ZSTD:
        raise SegmentCodecError(0, f"unknown segment flags 0x{flags:02x}")
    if n == 0 or n > MAX_SEGMENT_INDEXES:
        raise SegmentCodecError(1, f"segment count {n} is outside 1..{MAX_SEGMENT_INDEXES}")
    if expected_count is not None and n != expected_count:
        raise SegmentCodecError(1, f"segment holds {n} indexes but its metadata says {expected_count}")
    base = _PREFIX.size
    if flags:
        if len(view) < base + _RAW_LEN.size:
            raise SegmentCodecError(base, "truncated compressed-size field")
        (raw_len,) = _RAW_LEN.unpack_from(view, base)
        if raw_len > _max_body_size(n):
            raise SegmentCodecError(base, f"uncompressed size {raw_len} is impossible for {n} indexes")
        try:
            body_bytes = decompress_exact(view[base + _RAW_LEN.size:], raw_len, ZSTD if flags & FLAG_ZSTD else ZLIB)
        except CompressionError as exc:
            raise SegmentCodecError(base + _RAW_LEN.size, str(exc)) from None
        body, inflated = memoryview(body_bytes), True
        stream_at = base + _RAW_LEN.size
    else:
        body, inflated = view[base:], False
    try:
        pos = 0
        columns = []
        for _ in range(3):
            col, pos = _decode_column(body, pos, n, 0 if inflated else base)
            columns.append(col)
        if pos != len(body):
            raise SegmentCodecError(pos if inflated else base + pos, f"{len(body) - pos} unexpected bytes after the columns")
    except SegmentCodecError as exc:
        if inflated:
            # Positions inside the inflated body mean nothing in the file: report the stream's start.
            raise SegmentCodecError(stream_at, f"{exc.reason} (at byte {exc.offset} of the inflated body)") from None
        raise
    segment = Segment(*columns)
    if check_order:
        bad = check_sorted(segment.timestamps, segment.ledger_ids, segment.entry_ids)
        if bad >= 0:
            raise SegmentCodecError(0, f"segment rows are out of (timestamp, ledger, entry) order at row {bad}")
    return segment
