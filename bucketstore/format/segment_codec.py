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

**Grouped segments** (snapshot version 6, flag bit 2): a segment of several ledgers may store its rows
ledger by ledger instead of in delivery order, each ledger's timestamps as steps from the one
before (the first from a base), so the segment needs no ledger column: which ledger comes next
in delivery order is implied by the timestamps. Under random delays a merged bucket's segments
interleave a few ledgers row by row, and a ledger column spends about 1.9 bits a row on that
interleave, which narrower timestamp differences pay back only up to what a byte-wise entropy
coder loses (``tools/bench/bench_merge_bytes.py``); grouped, a merged segment costs what its
sources' segments cost. The writer encodes a segment of several ledgers both ways and keeps the
smaller: which wins depends on the byte widths the steps need (each ledger's own gaps are wider
than the delivery-order differences) and on whether the delivery-order columns are constant.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import grouped_rows
from .compression import MIN_FRAME, ZLIB, ZSTD, CompressionError, Compressor, decompress_exact

__all__ = [
    "FLAG_GROUPED",
    "GROUPED_VERSION",
    "Segment",
    "SegmentCodecError",
    "MAX_SEGMENT_INDEXES",
    "encode_segment",
    "encode_segments",
    "decode_segment",
    "SegmentBody",
    "open_body",
    "skip_column",
    "check_sorted",
    "encode_column",
    "decode_column",
]

#: The format's hard cap on indexes per segment (2**24). Segmentation always cuts
#: at this size, even when ``max_indexes_per_segment`` is -1, so a decoder can
#: refuse any larger count without allocating for it.
MAX_SEGMENT_INDEXES = 1 << 24

FLAG_ZLIB = 0x01
#: Format version 2: the body is one zstd frame (never together with FLAG_ZLIB).
FLAG_ZSTD = 0x02
#: Snapshot version 6: the body is grouped by ledger (:func:`_grouped_pieces`), with either compression.
FLAG_GROUPED = 0x04
#: The first snapshot version whose segments may be grouped.
GROUPED_VERSION = 6
_CODEC_FLAG = {ZLIB: FLAG_ZLIB, ZSTD: FLAG_ZSTD}
KIND_ARITH = 0
KIND_DELTA_U = 1
KIND_DELTA_Z = 2
#: Version 2: each value stored as its offset from the column's minimum (frame of reference).
KIND_FRAME = 3
#: Version 2: offsets from the minimum below 16, bit-packed 1, 2 or 4 bits a value.
KIND_PACKED = 4
_PACK_BITS = (1, 2, 4)
#: Columns stored as differences (compressed looking for longer matches only: compression._ZSTD_MIN_MATCH).
_DIFFERENCE_KINDS = (KIND_DELTA_U, KIND_DELTA_Z)
_V2_KINDS = (KIND_FRAME, KIND_PACKED)

_PREFIX = struct.Struct("<BI")  # flags, count
_RAW_LEN = struct.Struct("<I")
_ARITH = struct.Struct("<BQQ")  # kind, first, step
_DELTA = struct.Struct("<BQB")  # kind, first, width
_WIDTH_DTYPE = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_U64 = np.dtype("<u8")
_TOP = np.uint64((1 << 64) - 1)


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


class _Columns:
    """The writer's choices for one column of many segments, made with array operations.

    Segment ``i`` is rows ``starts[i] .. starts[i] + counts[i] - 1``. Every choice is
    the one a segment encoded alone would get (``formats/bucket_snapshot.md``, "The
    writer's choices"): ARITH when all differences are equal, DELTA_U when the column
    never decreases, else FRAME / PACKED when the offsets from the minimum are no
    wider than the zigzagged differences (version 2), else DELTA_Z; the narrowest width.
    """

    def __init__(self, values: np.ndarray, starts: np.ndarray, counts: np.ndarray, frame: bool) -> None:
        n, ends = len(values), starts + counts
        # diff[j] = v[j+1] - v[j] (wrapping), one slot longer than np.diff so that slot
        # ends[i] - 1, the difference *between* segments i and i+1 (or past the end), can
        # be set to a neutral value for each reduction over [starts[i], ends[i]).
        diff = np.zeros(n, dtype=_U64)
        np.subtract(values[1:], values[:-1], out=diff[:-1])
        seams = ends - 1
        diff[seams] = 0
        dmax = np.maximum.reduceat(diff, starts)
        # Equal differences: max == min. The seam slots would spoil the minimum: fill them with the top.
        diff[seams] = _TOP
        dmin = np.minimum.reduceat(diff, starts)
        diff[seams] = 0
        self.arith = (counts == 1) | (dmax == dmin)
        self.step = np.where(counts == 1, np.uint64(0), diff[starts])
        self.first = values[starts]
        self.values, self.starts, self.counts = values, starts, counts
        if self.arith.all():  # fixed-delay traffic: nothing else to choose
            zigzag = np.zeros(len(starts), dtype=np.bool_)
        else:
            decreases = np.zeros(n, dtype=np.bool_)
            np.less(values[1:], values[:-1], out=decreases[:-1])
            decreases[seams] = False
            zigzag = np.logical_or.reduceat(decreases, starts) & ~self.arith
        self.kind = np.where(self.arith, KIND_ARITH, np.where(zigzag, KIND_DELTA_Z, KIND_DELTA_U)).astype(np.uint8)
        self.base = self.first.copy()
        stored = diff
        if zigzag.any():
            signed = diff.view(np.int64)
            zz = ((signed << 1) ^ (signed >> 63)).view(np.uint64)  # the seams stay 0
            stored = zz if zigzag.all() else np.where(np.repeat(zigzag, counts), zz, diff)
            top = np.where(zigzag, np.maximum.reduceat(zz, starts), dmax)
        else:
            top = dmax
        self.width = _widths(top)
        self.stored = stored
        self.offsets: np.ndarray | None = None
        if frame and zigzag.any():
            low = np.minimum.reduceat(values, starts)
            spread = np.maximum.reduceat(values, starts) - low
            # Measured (bench_codec, merged buckets): offsets beat zigzag differences
            # whenever they are no wider, because they carry about one bit less.
            framed = zigzag & (_widths(spread) <= self.width)
            if framed.any():
                # A handful of distinct values (the ledgers of a merged bucket): zstd's
                # Huffman stage spends at least one bit a byte, so pack them first.
                packed = framed & (spread < 16)
                self.kind[framed] = KIND_FRAME
                self.kind[packed] = KIND_PACKED
                self.width = np.where(framed, _widths(spread), self.width)
                self.width[packed] = np.where(spread[packed] < 2, 1, np.where(spread[packed] < 4, 2, 4))
                self.base = np.where(framed, low, self.base)
                self.offsets = values - np.repeat(low, counts)

    def pieces(self) -> list[list[bytes]]:
        """Per segment: the column's header, then its byte planes (or its packed bits)."""
        kinds, widths = self.kind.tolist(), self.width.tolist()
        firsts, steps, bases = self.first.tolist(), self.step.tolist(), self.base.tolist()
        starts, counts = self.starts.tolist(), self.counts.tolist()
        delta_planes = self._planes(self.stored, (KIND_DELTA_U, KIND_DELTA_Z))
        frame_planes = self._planes(self.offsets, (KIND_FRAME,))
        packed = self._packed()
        out = []
        for i, kind in enumerate(kinds):
            if kind == KIND_ARITH:
                out.append([_ARITH.pack(KIND_ARITH, firsts[i], steps[i])])
                continue
            lo, width = starts[i], widths[i]
            if kind == KIND_PACKED:
                out.append([_DELTA.pack(KIND_PACKED, bases[i], width), packed[i]])
            elif kind == KIND_FRAME:
                hi = lo + counts[i]
                out.append([_DELTA.pack(KIND_FRAME, bases[i], width), *[p[lo:hi] for p in frame_planes[:width]]])
            else:
                hi = lo + counts[i] - 1
                out.append([_DELTA.pack(kind, firsts[i], width), *[p[lo:hi] for p in delta_planes[:width]]])
        return out

    def _planes(self, stored: np.ndarray | None, kinds: tuple[int, ...]) -> list[bytes]:
        """Byte plane k of every stored value, for k below the widest of these kinds' widths."""
        chosen = self.kind == kinds[0]
        for kind in kinds[1:]:
            chosen |= self.kind == kind
        if stored is None or not chosen.any():
            return []
        top = int(self.width[chosen].max())
        # Little-endian uint64: byte k of each value is plane k of any width above k.
        as_bytes = stored.view(np.uint8).reshape(-1, 8)
        return [as_bytes[:, k].tobytes() for k in range(top)]

    def _packed(self) -> dict[int, bytes]:
        """Segment index -> its bit-packed offsets, for the PACKED segments."""
        out: dict[int, bytes] = {}
        for bits in _PACK_BITS:
            chosen = np.flatnonzero((self.kind == KIND_PACKED) & (self.width == bits))
            if not len(chosen):
                continue
            assert self.offsets is not None
            per = 8 // bits
            counts, starts = self.counts[chosen], self.starts[chosen]
            # Each segment's values are padded with zeros to whole bytes, all segments in one buffer.
            padded = -(-counts // per) * per
            dest_start = np.cumsum(padded) - padded
            rows = np.arange(int(counts.sum()), dtype=np.int64)
            into = np.repeat(dest_start - (np.cumsum(counts) - counts), counts) + rows
            src = np.repeat(starts - (np.cumsum(counts) - counts), counts) + rows
            lanes = np.zeros(int(padded.sum()), dtype=np.uint8)
            lanes[into] = self.offsets[src]
            lanes = lanes.reshape(-1, per)
            packed = lanes[:, 0].copy()
            for k in range(1, per):
                packed |= lanes[:, k] << np.uint8(k * bits)
            blob = packed.tobytes()
            for i, a, size in zip(chosen.tolist(), (dest_start // per).tolist(), (padded // per).tolist()):
                out[i] = blob[a:a + size]
        return out


_WIDTH_LIMITS = np.array([(1 << 8) - 1, (1 << 16) - 1, (1 << 32) - 1], dtype=_U64)
_WIDTH_OF = np.array([1, 2, 4, 8], dtype=np.uint8)


def _widths(top: np.ndarray) -> np.ndarray:
    """The narrowest byte width (1, 2, 4, 8) of each value."""
    return _WIDTH_OF[np.searchsorted(_WIDTH_LIMITS, top, side="left")]


def _unpack_bits(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    lanes = np.empty((len(packed), per), dtype=np.uint8)
    for k in range(per):
        lanes[:, k] = (packed >> np.uint8(k * bits)) & mask
    return lanes.reshape(-1)[:n]


def encode_segment(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, *, compress: bool = True,
                   codec: str = ZSTD, grouped: bool = True) -> bytes:
    """Encode a sorted, non-empty run of indexes as a segment payload.

    :param ts: timestamps (uint64-compatible), sorted with ``ledgers`` and ``entries``
        by (timestamp, ledger, entry), no duplicates.
    :param compress: try compressing and keep it when it is smaller (golden files
        and benchmarks can turn it off).
    :param codec: ``"zstd"`` (format version 2, the default) or ``"zlib"`` (what a
        version-1 writer produced).
    :param grouped: a segment of several ledgers may be stored grouped by ledger
        (snapshot version 6) when that is smaller; False writes what versions 2 to 5 read.
        Never with zlib.
    :raises ValueError: empty input, mismatched lengths, more than
        :data:`MAX_SEGMENT_INDEXES` rows, or rows out of order.
    """
    ts = np.ascontiguousarray(ts, dtype=_U64)
    if len(ts) == 0:
        raise ValueError("a segment needs at least one index and three columns of equal length")
    if len(ts) > MAX_SEGMENT_INDEXES:
        raise ValueError(f"a segment holds at most {MAX_SEGMENT_INDEXES} indexes, not {len(ts)}")
    return encode_segments(ts, ledgers, entries, np.zeros(1, dtype=np.int64), compress=compress, codec=codec,
                           grouped=grouped)[0]


def encode_segments(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, starts: np.ndarray, *,
                    compress: bool = True, codec: str = ZSTD, check: bool = True, grouped: bool = True) -> list[bytes]:
    """Encode consecutive slices of sorted columns as segment payloads, all in one pass.

    Segment ``i`` holds rows ``starts[i]`` up to (not including) ``starts[i + 1]``, the
    last one up to the end; ``starts[0]`` must be 0. Each payload is byte for byte what
    :func:`encode_segment` makes of its rows alone: the per-segment choices are made
    with array operations over all segments (a bucket of small segments would
    otherwise spend most of its time in per-call overhead), and one compressor
    serves every frame.

    :param check: verify that the rows are strictly increasing (callers that have
        already checked the whole run pass ``False``).
    :param grouped: as for :func:`encode_segment`.
    :raises ValueError: mismatched lengths, bad ``starts``, a segment of more than
        :data:`MAX_SEGMENT_INDEXES` rows, or rows out of order.
    """
    ts = np.ascontiguousarray(ts, dtype=_U64)
    ledgers = np.ascontiguousarray(ledgers, dtype=_U64)
    entries = np.ascontiguousarray(entries, dtype=_U64)
    n = len(ts)
    if len(ledgers) != n or len(entries) != n:
        raise ValueError("the three columns differ in length")
    starts = np.asarray(starts, dtype=np.int64)
    if n == 0:
        if len(starts):
            raise ValueError("segments of no rows")
        return []
    counts = np.diff(starts, append=n)
    if not len(starts) or starts[0] != 0 or (counts < 1).any():
        raise ValueError("segment starts must begin at 0 and increase strictly, below the row count")
    if int(counts.max()) > MAX_SEGMENT_INDEXES:
        raise ValueError(f"a segment holds at most {MAX_SEGMENT_INDEXES} indexes, not {int(counts.max())}")
    if check:
        bad = check_sorted(ts, ledgers, entries)
        if bad >= 0:
            raise ValueError(f"segment rows are not strictly increasing at row {bad}")
    # Version 1 (zlib) segments never hold FRAME columns: a version-1 reader would refuse them.
    frame = codec != ZLIB
    grouped = grouped and codec != ZLIB
    squeeze = Compressor(codec) if compress else None
    flag = _CODEC_FLAG[codec] if compress else 0
    out = []
    for first, last in _blocks(starts, n):
        lo = int(starts[first])
        hi = int(starts[last]) if last < len(starts) else n
        block_starts, block_counts = starts[first:last] - lo, counts[first:last]
        cols = [_Columns(col[lo:hi], block_starts, block_counts, frame) for col in (ts, ledgers, entries)]
        alternatives = _grouped_pieces(ts[lo:hi], ledgers[lo:hi], block_starts, block_counts,
                                       cols[1]) if grouped else {}
        for i, (count, t_pieces, l_pieces, e_pieces) in enumerate(zip(block_counts.tolist(),
                                                                      *[c.pieces() for c in cols])):
            # Each column's first piece is its header, whose first byte is its kind.
            e_differences = [e_pieces[0][0] in _DIFFERENCE_KINDS] * len(e_pieces)
            head = [*t_pieces, *l_pieces]
            head_differences = [c[0][0] in _DIFFERENCE_KINDS for c in (t_pieces, l_pieces) for _ in c]
            other = alternatives.get(i)
            if other is None:
                out.append(_payload(head, head_differences, e_pieces, e_differences, count, squeeze, flag, 0))
                continue
            # The steps are timestamp differences, whatever kind stores them: compressed as a DELTA_U column's are.
            other_differences = [False, *[True] * (len(other) - 1)]
            # Both bodies end with the same entry-id pieces: compressed once, when both heads end a frame.
            tail = squeeze.compress(e_pieces, e_differences) if squeeze is not None and \
                _ends_frame(head) and _ends_frame(other) else None
            payload = _payload(head, head_differences, e_pieces, e_differences, count, squeeze, flag, 0, tail)
            alternative = _payload(other, other_differences, e_pieces, e_differences, count, squeeze, flag,
                                   FLAG_GROUPED, tail)
            out.append(alternative if len(alternative) < len(payload) else payload)
    return out


def _ends_frame(pieces: list[bytes]) -> bool:
    """Whether :meth:`Compressor.compress` closes a frame at the last of ``pieces`` (so what follows
    them starts a frame of its own, compressed alike after any head that ends a frame)."""
    pending = 0
    for piece in pieces:
        pending += len(piece)
        if pending >= MIN_FRAME:
            pending = 0
    return pending == 0


def _payload(head: list[bytes], head_differences: list[bool], tail: list[bytes], tail_differences: list[bool],
             count: int, squeeze: Compressor | None, flag: int, layout: int, packed_tail: bytes | None = None) -> bytes:
    """A segment's payload from its body's pieces: compressed when that is smaller. ``packed_tail``:
    the tail's pieces compressed alone, given when the head ends a frame."""
    body = b"".join([*head, *tail])
    if squeeze is not None and len(body) > 64:
        if packed_tail is not None:
            packed = squeeze.compress(head, head_differences) + packed_tail
        else:
            packed = squeeze.compress([*head, *tail], head_differences + tail_differences)
        if len(packed) + _RAW_LEN.size < len(body):
            return _PREFIX.pack(flag | layout, count) + _RAW_LEN.pack(len(body)) + packed
    return _PREFIX.pack(layout, count) + body


def _grouped_pieces(ts: np.ndarray, ledgers: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                    ledger_column: _Columns) -> dict[int, list[bytes]]:
    """Segment index -> the pieces of its grouped body up to its entry ids (the directory, then the
    steps column), for each segment of several ledgers (:mod:`.grouped_rows` groups them)."""
    several = np.flatnonzero(~(ledger_column.arith & (ledger_column.step == 0)))
    if not len(several):
        return {}
    groups = grouped_rows.group(ts, ledgers, starts[several], counts[several])
    step_pieces = _Columns(groups.steps, groups.starts, groups.counts, True).pieces()
    return {i: [directory, *s_pieces]
            for i, directory, s_pieces in zip(several.tolist(), groups.directories, step_pieces)}


#: Rows encoded together (whole segments; a bigger segment is a block of its own). Measured:
#: temporaries of a few hundred kB are reused by the allocator, where whole-bucket ones are
#: fresh pages every time, and on a VM the page faults cost more than the arithmetic.
_BLOCK_ROWS = 1 << 15


def _blocks(starts: np.ndarray, n: int) -> list[tuple[int, int]]:
    """``(first, last)`` segment index ranges of consecutive segments holding about ``_BLOCK_ROWS`` rows."""
    if n <= _BLOCK_ROWS:
        return [(0, len(starts))]
    out = []
    first = 0
    while first < len(starts):
        last = int(np.searchsorted(starts, int(starts[first]) + _BLOCK_ROWS, side="left"))
        last = max(last, first + 1)
        out.append((first, last))
        first = last
    return out


def _max_body_size(n: int) -> int:
    return 3 * (_DELTA.size + 8 * n) + 3 * _ARITH.size


def _column_extent(body: memoryview, pos: int, n: int, base: int) -> tuple[int, int, int, int, int]:
    """The column of ``n`` values at ``pos``: its kind, first value, step (constant-step columns)
    or width, and where its data starts and ends; checked to fit ``body``."""
    if pos >= len(body):
        raise SegmentCodecError(base + pos, "segment ends before all three columns")
    kind = body[pos]
    if kind == KIND_ARITH:
        if pos + _ARITH.size > len(body):
            raise SegmentCodecError(base + pos, "truncated constant-step column")
        _, first, step = _ARITH.unpack_from(body, pos)
        return kind, first, step, pos + _ARITH.size, pos + _ARITH.size
    if kind not in (KIND_DELTA_U, KIND_DELTA_Z, KIND_FRAME, KIND_PACKED):
        raise SegmentCodecError(base + pos, f"unknown column kind {kind}")
    if pos + _DELTA.size > len(body):
        raise SegmentCodecError(base + pos, "truncated delta column header")
    _, first, width = _DELTA.unpack_from(body, pos)
    start = pos + _DELTA.size
    if kind == KIND_PACKED:
        if width not in _PACK_BITS:
            raise SegmentCodecError(base + pos + 9, f"packed column of {width} bits a value is not 1, 2 or 4")
        size = -(-n * width // 8)
        if start + size > len(body):
            raise SegmentCodecError(base + start, f"column of {n} values at {width} bits does not fit the segment")
        return kind, first, width, start, start + size
    if width not in _WIDTH_DTYPE:
        raise SegmentCodecError(base + pos + 9, f"column width {width} is not 1, 2, 4 or 8")
    size = width * (n if kind == KIND_FRAME else n - 1)
    if start + size > len(body):
        raise SegmentCodecError(base + start, f"column of {n} values at width {width} does not fit the segment")
    return kind, first, width, start, start + size


def _from_planes(raw: np.ndarray, width: int, count: int) -> np.ndarray:
    """``count`` values of ``width`` bytes stored byte-planar in ``raw`` (every value's low byte,
    then every second byte, ...), as an array of that width: each plane copied into its byte of
    the values (measured: 2.5 times a transposing copy's speed for 2-byte values, as fast for 8).
    """
    if width == 1:
        return raw
    col = np.empty(count, dtype=_WIDTH_DTYPE[width])
    spread = col.view(np.uint8)
    for b in range(width):
        spread[b::width] = raw[b * count:(b + 1) * count]
    return col


def _decode_column(body: memoryview, pos: int, n: int, base: int) -> tuple[np.ndarray, int]:
    kind, first, width, start, end = _column_extent(body, pos, n, base)
    if kind == KIND_ARITH:  # (``width`` is the step)
        # Wrapping uint64 arithmetic reproduces exactly what the encoder's np.diff produced.
        col = np.uint64(first) + np.arange(n, dtype=_U64) * np.uint64(width)
        return col, end
    raw = np.frombuffer(body, dtype=np.uint8, count=end - start, offset=start)
    if kind == KIND_PACKED:
        col = _unpack_bits(raw, width, n).astype(_U64)
        col += np.uint64(first)
        return col, end
    if kind == KIND_FRAME:
        col = _from_planes(raw, width, n).astype(_U64)
        col += np.uint64(first)  # wraps like the encoder's subtraction
        return col, end
    stored = _from_planes(raw, width, n - 1).astype(_U64)
    if kind == KIND_DELTA_Z:
        stored = (stored >> np.uint64(1)) ^ (np.uint64(0) - (stored & np.uint64(1)))
    col = np.empty(n, dtype=_U64)
    col[0] = first
    col[1:] = stored
    np.cumsum(col, out=col)  # wraps modulo 2**64, undoing the encoder's wrapping differences
    return col, end


def skip_column(body: bytes | memoryview, pos: int, n: int) -> int:
    """The position after the column of ``n`` values at ``pos`` of ``body``, found from its header
    and checked to fit (a reader that does not need its values).

    :raises SegmentCodecError: as :func:`decode_column` for a missing, truncated or unknown column.
    """
    return _column_extent(memoryview(body), pos, n, 0)[4]


def encode_column(values: np.ndarray) -> tuple[list[bytes], list[bool]]:
    """One column of a segment's body for ``values`` (at least one), as the writer chooses it for a
    segment: its pieces (header, then byte planes or packed bits) and, per piece, whether it is a
    plane of differences (see :meth:`~bucketstore.format.compression.Compressor.compress`).

    Entry 0 (snapshot version 4) stores its per-ledger entry-id lists as such columns."""
    values = np.ascontiguousarray(values, dtype=_U64)
    if not len(values):
        raise ValueError("a column holds at least one value")
    pieces = _Columns(values, np.zeros(1, dtype=np.int64), np.array([len(values)], dtype=np.int64), True).pieces()[0]
    difference = pieces[0][0] in _DIFFERENCE_KINDS
    return pieces, [difference] * len(pieces)


def decode_column(body: bytes | memoryview, pos: int, n: int) -> tuple[np.ndarray, int]:
    """Decode the column of ``n`` values (at least one) starting at ``pos`` of ``body``; return the
    values and the position after the column.

    :raises SegmentCodecError: a missing, truncated or unknown column, at its offset in ``body``.
    """
    return _decode_column(memoryview(body), pos, n, 0)


class SegmentBody(NamedTuple):
    """A segment payload's body, inflated when it is compressed (:func:`open_body`)."""

    #: The rows it holds, checked against the cap and the expected count.
    count: int
    #: Whether its rows are grouped by ledger (snapshot version 6).
    grouped: bool
    body: memoryview
    #: What to add to an offset in ``body`` to make it the payload's: 0 for an inflated body,
    #: whose offsets mean nothing in the file (:meth:`in_payload` reports the stream's start).
    base: int
    #: The compressed stream's offset in the payload; -1 when the body is stored as it is.
    stream_at: int

    def in_payload(self, exc: SegmentCodecError) -> SegmentCodecError:
        """``exc``, raised at an offset of the body (plus ``base``), as an error of the payload."""
        if self.stream_at < 0:
            return exc
        return SegmentCodecError(self.stream_at, f"{exc.reason} (at byte {exc.offset} of the inflated body)")


def open_body(payload: bytes | memoryview, expected_count: int | None = None, *,
              snapshot_version: int | None = None) -> SegmentBody:
    """Check a segment payload's prefix (flags, count) and inflate its body: the first step of
    :func:`decode_segment` (whose parameters these are), for readers that decode some columns only.

    :raises SegmentCodecError: unknown flags, a flag or compression the version lacks, a count
        outside the cap or unlike ``expected_count``, a damaged or impossible compressed stream.
    """
    view = memoryview(payload)
    if len(view) < _PREFIX.size:
        raise SegmentCodecError(0, "segment payload is shorter than its 5-byte prefix")
    flags, n = _PREFIX.unpack_from(view)
    if flags & ~(FLAG_ZLIB | FLAG_ZSTD | FLAG_GROUPED) or flags & (FLAG_ZLIB | FLAG_ZSTD) == FLAG_ZLIB | FLAG_ZSTD:
        raise SegmentCodecError(0, f"unknown segment flags 0x{flags:02x}")
    if flags & FLAG_ZSTD and snapshot_version == 1:
        raise SegmentCodecError(0, "zstd segment in a version-1 bucket (zstd came with version 2)")
    grouped = bool(flags & FLAG_GROUPED)
    if grouped and snapshot_version is not None and snapshot_version < GROUPED_VERSION:
        raise SegmentCodecError(0, f"grouped segment in a version-{snapshot_version} bucket (grouped segments came "
                                   f"with version {GROUPED_VERSION})")
    compression = flags & (FLAG_ZLIB | FLAG_ZSTD)
    if n == 0 or n > MAX_SEGMENT_INDEXES:
        raise SegmentCodecError(1, f"segment count {n} is outside 1..{MAX_SEGMENT_INDEXES}")
    if expected_count is not None and n != expected_count:
        raise SegmentCodecError(1, f"segment holds {n} indexes but its metadata says {expected_count}")
    base = _PREFIX.size
    if compression:
        if len(view) < base + _RAW_LEN.size:
            raise SegmentCodecError(base, "truncated compressed-size field")
        (raw_len,) = _RAW_LEN.unpack_from(view, base)
        if raw_len > (_max_grouped_body_size(n) if grouped else _max_body_size(n)):
            raise SegmentCodecError(base, f"uncompressed size {raw_len} is impossible for {n} indexes")
        try:
            body_bytes = decompress_exact(view[base + _RAW_LEN.size:], raw_len, ZSTD if flags & FLAG_ZSTD else ZLIB)
        except CompressionError as exc:
            raise SegmentCodecError(base + _RAW_LEN.size, str(exc)) from None
        return SegmentBody(n, grouped, memoryview(body_bytes), 0, base + _RAW_LEN.size)
    return SegmentBody(n, grouped, view[base:], base, -1)


def decode_segment(payload: bytes | memoryview, expected_count: int | None = None, *,
                   check_order: bool = True, snapshot_version: int | None = None) -> Segment:
    """Decode a segment payload made by :func:`encode_segment`.

    :param expected_count: the count entry 0 records for this segment; a
        different count in the payload is damage.
    :param check_order: verify that rows are strictly increasing (cheap; on by default
        because the shared queue's correctness rests on it).
    :param snapshot_version: the bucket's snapshot version when known (entry 0's):
        version 1 knows neither zstd nor the FRAME and PACKED columns, so a
        version-1 file using them is damage. None (a reader holding only the
        catalog's summary) accepts every kind.
    :raises SegmentCodecError: on any malformation, with the offset in the payload.
    """
    opened = open_body(payload, expected_count, snapshot_version=snapshot_version)
    body, n = opened.body, opened.count
    try:
        if opened.grouped:
            columns, pos = _decode_grouped(body, n, opened.base)
        else:
            columns, pos = _decode_columns(body, n, opened.base, snapshot_version)
        if pos != len(body):
            raise SegmentCodecError(opened.base + pos, f"{len(body) - pos} unexpected bytes after the columns")
    except SegmentCodecError as exc:
        raise opened.in_payload(exc) from None
    segment = Segment(*columns)
    if check_order:
        bad = check_sorted(segment.timestamps, segment.ledger_ids, segment.entry_ids)
        if bad >= 0:
            raise SegmentCodecError(0, f"segment rows are out of (timestamp, ledger, entry) order at row {bad}")
    return segment


def _decode_columns(body: memoryview, n: int, base: int, snapshot_version: int | None) -> tuple[list[np.ndarray], int]:
    """A body in delivery order: the three columns, and the position after them."""
    pos = 0
    columns = []
    for _ in range(3):
        if snapshot_version == 1 and pos < len(body) and body[pos] in _V2_KINDS:
            raise SegmentCodecError(base + pos, f"column kind {body[pos]} in a version-1 bucket (it came with "
                                                "version 2)")
        col, pos = _decode_column(body, pos, n, base)
        columns.append(col)
    return columns, pos


def _max_grouped_body_size(n: int) -> int:
    """Two varints, at most ``2n - 1`` more (10 bytes each at most), and two columns."""
    return 10 * (2 * n + 1) + 2 * (_DELTA.size + 8 * n)


def _decode_grouped(body: memoryview, n: int, base: int) -> tuple[list[np.ndarray], int]:
    """A grouped body: the three columns in delivery order, and the position after the body's columns."""
    try:
        directory, pos = grouped_rows.read_directory(body, n)
    except grouped_rows.GroupedError as exc:
        raise SegmentCodecError(base + exc.offset, exc.reason) from None
    data_at = pos
    steps, pos = _decode_column(body, pos, n, base)
    entries, pos = _decode_column(body, pos, n, base)
    try:
        ts, ledgers = grouped_rows.delivery_order(directory, steps)
    except grouped_rows.GroupedError as exc:
        raise SegmentCodecError(base + data_at, exc.reason) from None
    return [ts, ledgers, entries], pos
