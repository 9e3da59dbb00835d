"""A topic's sealed run: an immutable file of rows in delivery order (``formats/topic_runs.md``).

A topic's rows older than its mutable level are sealed into runs (``docs/topics.md``, "Sealed
runs"). A run holds ``(deliver_at, ledger, entry, seq)`` rows sorted by those four numbers, in
segments of at most :data:`SEGMENT_ROWS` rows, each its own compressed body, so that a
delivery reads only the segments covering its windows; and per ledger the roaring bitmap of
the entry ids it holds (as a bucket snapshot's entry 0 keeps them), so that "is this position
here" is answered without reading a segment.

It is not a bucket snapshot (``formats/bucket_snapshot.md``): a topic's row carries a ``seq``,
which a snapshot's segments have no column for. What it shares with one is the column coding
(byte planes of each column, a zstd frame per plane, :mod:`~bucketstore.format.compression`),
the bitmaps (:mod:`~bucketstore.format.bucket_bitmaps`) and the masked CRC32C of the ledger
files (:func:`~bucketstore.format.ledger_file.masked_crc32c`).

Every decoding error is a :class:`TopicRunError` (a ``ValueError``) naming the byte offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap, BitMap64

from .bucket_bitmaps import BITMAP64, serialized_bitmaps
from .compression import ZSTD, CompressionError, Compressor, decompress_exact
from .ledger_file import masked_crc32c

__all__ = ["TopicRunError", "SEGMENT_ROWS", "RUN_MAGIC", "SegmentEntry", "RunDirectory", "encode_run",
           "decode_header", "decode_trailer", "decode_directory", "decode_segment", "decode_bitmaps",
           "run_file_name", "HEADER", "TRAILER"]

RUN_MAGIC = b"BSTRUN\x00\x01"
END_MAGIC = b"BSTRUNE\x01"
#: magic, topic id, reserved (0), run id, rows
HEADER = struct.Struct("<8sIIQQ")
#: directory offset, directory length, segment count, directory crc, end magic
TRAILER = struct.Struct("<QIII8s")
#: offset, stored length, rows, crc, first deliver_at, last deliver_at
_SEGMENT = struct.Struct("<QIIIQQ")
#: bitmaps offset, bitmaps length, bitmaps crc
_BITMAPS = struct.Struct("<QII")
_LEDGER = struct.Struct("<QBI")  # ledger, width (32 or 64), serialized length
#: Rows per segment: a segment decodes to 32 bytes a row (256 KB), and a delivery reads a
#: 4.096 s window at a time, which at most rates spans one or two segments.
SEGMENT_ROWS = 8192
_COLUMNS = 4
_U64 = np.dtype("<u8")


class TopicRunError(ValueError):
    """A run file's bytes do not decode as ``formats/topic_runs.md`` says."""


def run_file_name(topic_id: int, run_id: int) -> str:
    """A run's file name: names sort by topic, then by run."""
    return f"{topic_id:010d}-{run_id:020d}.run"


@dataclass(frozen=True)
class SegmentEntry:
    offset: int
    length: int
    rows: int
    crc: int
    first_ts: int
    last_ts: int


@dataclass(frozen=True)
class RunDirectory:
    """A run's segments and where its bitmaps are: its footer, read once per open run."""

    topic_id: int
    run_id: int
    rows: int
    segments: tuple[SegmentEntry, ...]
    bitmaps: tuple[int, int, int]  # offset, length, crc


def _planes(columns: list[np.ndarray]) -> list[bytes]:
    """Each column's eight byte planes, least significant first: the high planes of small
    numbers are zeros and cost a few bytes each."""
    out = []
    for col in columns:
        raw = np.ascontiguousarray(col, dtype=_U64).view(np.uint8).reshape(-1, 8)
        out.extend(raw[:, b].tobytes() for b in range(8))
    return out


def _segment_body(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, seqs: np.ndarray,
                  compressor: Compressor) -> bytes:
    # deliver_at as differences from the segment's first (sorted: small, non-negative); seq less
    # its entry id, which is nearly constant per ledger when positions are added in order.
    delta = np.diff(ts, prepend=ts[:1]).astype(np.uint64)
    return compressor.compress(_planes([delta, ledgers, entries, seqs - entries]),
                               [True] * 8 + [False] * 24)


def encode_run(topic_id: int, run_id: int, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray,
               seqs: np.ndarray) -> bytes:
    """The file of a run of these rows, which must be sorted by (deliver_at, ledger, entry, seq)."""
    n = len(ts)
    if n == 0:
        raise ValueError("a run holds at least one row")
    ts, ledgers, entries, seqs = (np.asarray(c, dtype=np.uint64) for c in (ts, ledgers, entries, seqs))
    keys = np.ascontiguousarray(np.stack([ts, ledgers, entries, seqs], axis=1).astype(">u8")).view("S32").ravel()
    if n > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        raise ValueError("a run's rows must be sorted by (deliver_at, ledger, entry, seq), without repeats")
    parts = [HEADER.pack(RUN_MAGIC, topic_id, 0, run_id, n)]
    at = HEADER.size
    compressor = Compressor(ZSTD)
    directory = []
    for lo in range(0, n, SEGMENT_ROWS):
        hi = min(n, lo + SEGMENT_ROWS)
        body = _segment_body(ts[lo:hi], ledgers[lo:hi], entries[lo:hi], seqs[lo:hi], compressor)
        directory.append(_SEGMENT.pack(at, len(body), hi - lo, masked_crc32c(body), int(ts[lo]), int(ts[hi - 1])))
        parts.append(body)
        at += len(body)
    flat = serialized_bitmaps(ledgers, entries).flat()
    bitmaps = [struct.pack("<I", len(flat) // 3)]
    for j in range(0, len(flat), 3):
        blob = flat[j + 2]
        bitmaps.append(_LEDGER.pack(flat[j], flat[j + 1], len(blob)) + blob)  # type: ignore[arg-type]
    blob = b"".join(bitmaps)
    parts.append(blob)
    directory.append(_BITMAPS.pack(at, len(blob), masked_crc32c(blob)))
    at += len(blob)
    listing = b"".join(directory)
    parts.append(listing)
    parts.append(TRAILER.pack(at, len(listing), len(directory) - 1, masked_crc32c(listing), END_MAGIC))
    return b"".join(parts)


def decode_header(raw: bytes) -> tuple[int, int, int]:
    """(topic id, run id, rows) of a run file's first :data:`HEADER` bytes."""
    if len(raw) < HEADER.size:
        raise TopicRunError(f"at offset 0: {len(raw)} bytes, shorter than the {HEADER.size}-byte header")
    magic, tid, reserved, run_id, rows = HEADER.unpack_from(raw)
    if magic != RUN_MAGIC:
        raise TopicRunError(f"at offset 0: magic {magic!r} is not a topic run's {RUN_MAGIC!r}")
    if reserved or rows == 0:
        raise TopicRunError(f"at offset 8: header with reserved {reserved}, rows {rows}")
    return tid, run_id, rows


def decode_trailer(raw: bytes, size: int) -> tuple[int, int, int, int]:
    """(directory offset, length, segments, crc) of the file's last :data:`TRAILER` bytes."""
    at = size - TRAILER.size
    if len(raw) != TRAILER.size or at < HEADER.size:
        raise TopicRunError(f"at offset {max(at, 0)}: the file is too short for a trailer ({size} bytes)")
    offset, length, count, crc, magic = TRAILER.unpack(raw)
    if magic != END_MAGIC:
        raise TopicRunError(f"at offset {at + 20}: end magic {magic!r} is not {END_MAGIC!r} (torn or not a run)")
    if offset < HEADER.size or offset + length != at or length != count * _SEGMENT.size + _BITMAPS.size:
        raise TopicRunError(f"at offset {at}: directory at {offset}, {length} bytes, {count} segments does not fit")
    return offset, length, count, crc


def decode_directory(header: bytes, listing: bytes, trailer: tuple[int, int, int, int]) -> RunDirectory:
    """The run's :class:`RunDirectory`, checked against its header and trailer."""
    tid, run_id, rows = decode_header(header)
    offset, length, count, crc = trailer
    if masked_crc32c(listing) != crc:
        raise TopicRunError(f"at offset {offset}: the directory's checksum does not match")
    segments, at, total, last_ts = [], HEADER.size, 0, -1
    for i in range(count):
        entry = SegmentEntry(*_SEGMENT.unpack_from(listing, i * _SEGMENT.size))
        if entry.offset != at or entry.rows == 0 or entry.rows > SEGMENT_ROWS or entry.first_ts > entry.last_ts \
                or entry.first_ts < last_ts:
            raise TopicRunError(f"at offset {offset + i * _SEGMENT.size}: segment {i} entry {entry} is out of order")
        segments.append(entry)
        at += entry.length
        total += entry.rows
        last_ts = entry.last_ts
    bitmaps = _BITMAPS.unpack_from(listing, count * _SEGMENT.size)
    if bitmaps[0] != at or bitmaps[0] + bitmaps[1] != offset:
        raise TopicRunError(f"at offset {offset + count * _SEGMENT.size}: bitmaps at {bitmaps[0]} do not follow "
                            f"the segments (end {at})")
    if total != rows:
        raise TopicRunError(f"at offset {offset}: the segments hold {total} rows, the header says {rows}")
    return RunDirectory(tid, run_id, rows, tuple(segments), bitmaps)


def decode_segment(stored: bytes, entry: SegmentEntry) -> np.ndarray:
    """A segment's rows as an (n, 4) uint64 array: deliver_at, ledger, entry, seq."""
    if len(stored) != entry.length or masked_crc32c(stored) != entry.crc:
        raise TopicRunError(f"at offset {entry.offset}: segment of {len(stored)} bytes fails its checksum")
    n = entry.rows
    try:
        body = decompress_exact(stored, n * 8 * _COLUMNS, ZSTD)
    except CompressionError as exc:
        raise TopicRunError(f"at offset {entry.offset}: {exc}") from None
    planes = np.frombuffer(body, dtype=np.uint8).reshape(_COLUMNS, 8, n)
    cols = np.ascontiguousarray(planes.transpose(0, 2, 1)).view(_U64).reshape(_COLUMNS, n)
    out = np.empty((n, 4), dtype=np.uint64)
    out[:, 0] = np.cumsum(cols[0], dtype=np.uint64) + np.uint64(entry.first_ts)
    out[:, 1], out[:, 2] = cols[1], cols[2]
    out[:, 3] = cols[3] + cols[2]
    if out[-1, 0] != entry.last_ts:
        raise TopicRunError(f"at offset {entry.offset}: segment ends at deliver_at {int(out[-1, 0])}, "
                            f"its entry says {entry.last_ts}")
    return out


def decode_bitmaps(stored: bytes, offset: int, crc: int) -> dict[int, BitMap | BitMap64]:
    """Ledger -> roaring bitmap of the entry ids the run holds."""
    if masked_crc32c(stored) != crc:
        raise TopicRunError(f"at offset {offset}: the bitmaps fail their checksum")
    if len(stored) < 4:
        raise TopicRunError(f"at offset {offset}: bitmaps section of {len(stored)} bytes")
    (count,), at, out = struct.unpack_from("<I", stored), 4, {}
    for _ in range(count):
        if at + _LEDGER.size > len(stored):
            raise TopicRunError(f"at offset {offset + at}: the bitmaps section ends inside a ledger's header")
        ledger, width, length = _LEDGER.unpack_from(stored, at)
        at += _LEDGER.size
        if at + length > len(stored):
            raise TopicRunError(f"at offset {offset + at}: ledger {ledger}'s bitmap overruns the section")
        try:
            out[ledger] = (BitMap64 if width == BITMAP64 else BitMap).deserialize(stored[at:at + length])
        except Exception as exc:  # pyroaring raises ValueError or its own errors on bad bytes
            raise TopicRunError(f"at offset {offset + at}: ledger {ledger}'s bitmap does not decode: {exc}") from None
        at += length
    if at != len(stored):
        raise TopicRunError(f"at offset {offset + at}: {len(stored) - at} bytes after the last bitmap")
    return out
