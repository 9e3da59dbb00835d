"""The two block compressors of bucket snapshots, and bounded, exact decompression.

Version 1 bodies are zlib streams (RFC 1950); version 2 writers use Zstandard
(RFC 8878), which ``tools/bench/bench_codec.py`` measured at about six times
zlib level 1's encode rate and twice its decode rate for a slightly smaller
output. Readers accept both.

A zstd body is a *sequence* of frames whose contents, concatenated, are the
body. The segment writer starts a new frame at every byte plane of every
column: each frame then gets its own entropy tables, fitted to one plane's
distribution (the random low bytes of an entry column, the nearly constant
high bytes of a timestamp column), which measured 6-8 % smaller than one
frame for the whole body at the same speed.

Decompression never trusts the input: the caller gives the exact size the body
must have (already bounded by what the container can legitimately hold), the
output buffer is never larger than that, and the compressed stream must end
exactly at the end of its payload. Every failure is a :class:`CompressionError`
carrying a human-readable reason; the caller adds the file and offset.
"""

from __future__ import annotations

import threading
import zlib

import zstandard

__all__ = ["CompressionError", "Compressor", "MIN_FRAME", "ZLIB", "ZSTD", "compress", "decompress_exact"]

ZLIB = "zlib"
ZSTD = "zstd"

#: With a frame per byte plane, level 1 is as small as 3 (and faster); bench_codec compares them.
_ZSTD_LEVEL = 1
#: Shortest match zstd looks for in a plane of differences (level 1 picks 5 for a plane of up to
#: 16 KiB, 6 up to 128 KiB; 7 is the longest setting), other parameters as level 1's for an input of
#: unknown size. Small differences (the timestamps of a merged bucket) hold short chance repeats that
#: cost more as matches than as Huffman-coded literals: measured (tools/bench/bench_merge_bytes.py)
#: 5 % off the timestamp planes of a random-delay merge, at the same speed. Not for offsets from a
#: minimum (an entry column climbing ledger by ledger: its high bytes repeat in short runs, 8 % larger
#: with it), nor for a whole body (entry 0's repeated 5-byte msgpack timestamps).
_ZSTD_MIN_MATCH = 7
#: Pieces shorter than this share a frame with the next (a frame costs 6-10 bytes of header).
MIN_FRAME = 64
_ZLIB_LEVEL = 1
_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_MAGIC_BYTES = _ZSTD_MAGIC.to_bytes(4, "little")
_BLOCK_RAW, _BLOCK_RLE, _BLOCK_COMPRESSED = 0, 1, 2


#: One zstd decompression context per thread: making one costs about what decoding a segment's
#: small plane does (a 500,000-row bucket's segments are about 4,000 frames), and a context
#: serves one thread at a time.
_DECOMPRESSORS = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_DECOMPRESSORS, "zstd", None)
    if d is None:
        d = _DECOMPRESSORS.zstd = zstandard.ZstdDecompressor()
    return d


class CompressionError(ValueError):
    """A compressed body is damaged or does not inflate to exactly the recorded size."""


class Compressor:
    """One codec context for compressing many bodies (a bucket's segments) in a row.

    Creating a zstd context costs about as much as compressing a small segment's
    plane, so a writer makes one per bucket. Not thread-safe: one per thread.
    """

    __slots__ = ("codec", "_zstd", "_differences")

    def __init__(self, codec: str) -> None:
        if codec not in (ZLIB, ZSTD):
            raise ValueError(f"unknown codec {codec!r}")
        self.codec = codec
        # write_content_size: every frame records its size, which the reader checks.
        self._zstd = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=True) if codec == ZSTD else None
        self._differences = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters.from_level(
            _ZSTD_LEVEL, min_match=_ZSTD_MIN_MATCH, write_content_size=True)) if codec == ZSTD else None

    def compress(self, body: bytes | list[bytes], differences: list[bool] | None = None) -> bytes:
        """Compress ``body``; given as its pieces (byte planes), zstd writes one frame per
        piece (short pieces joined to the next) and zlib compresses their concatenation.

        :param differences: per piece, whether it is a plane of differences (a DELTA_U or
            DELTA_Z column's): a frame closed by such a piece looks for matches of
            :data:`_ZSTD_MIN_MATCH` bytes or more only.
        """
        zstd = self._zstd
        if zstd is None:
            return zlib.compress(body if isinstance(body, bytes) else b"".join(body), _ZLIB_LEVEL)
        if isinstance(body, bytes):
            return zstd.compress(body)
        frames, pending = [], b""
        for i, piece in enumerate(body):
            pending += piece
            if len(pending) >= MIN_FRAME:
                frames.append((self._differences if differences and differences[i] else zstd).compress(pending))
                pending = b""
        if pending or not frames:
            frames.append(zstd.compress(pending))
        return b"".join(frames)


def compress(body: bytes | list[bytes], codec: str) -> bytes:
    """Compress ``body`` with ``codec`` (:data:`ZLIB` or :data:`ZSTD`), as :meth:`Compressor.compress`."""
    return Compressor(codec).compress(body)


def decompress_exact(stream: bytes | memoryview, size: int, codec: str) -> bytes:
    """Inflate ``stream`` to exactly ``size`` bytes, ending exactly at the stream's end.

    ``size`` must already be bounded by the caller; no more than ``size`` bytes are
    ever allocated for the output.
    """
    if codec == ZLIB:
        inflater = zlib.decompressobj()
        try:
            body = inflater.decompress(stream, size)
        except zlib.error as exc:
            raise CompressionError(f"zlib stream is damaged: {exc}") from None
        if len(body) != size or not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
            raise CompressionError("zlib stream does not hold exactly the recorded size")
        return body
    if codec == ZSTD:
        data = bytes(stream)
        view = memoryview(data)  # frames passed as views of it: no copy of each
        parts = []
        decompressor = _decompressor()
        for start, end, content in _zstd_frames(data, size):
            try:
                # The frame's content size was checked (and the sizes add up to ``size``);
                # the one-shot decoder allocates exactly that and fails on any other size.
                part = decompressor.decompress(view[start:end], max_output_size=content)
            except zstandard.ZstdError as exc:
                raise CompressionError(f"zstd frame at byte {start} is damaged: {exc}") from None
            if len(part) != content:
                raise CompressionError(f"zstd frame at byte {start} does not hold its recorded size")
            parts.append(part)
        return b"".join(parts) if len(parts) != 1 else parts[0]
    raise ValueError(f"unknown codec {codec!r}")


def _zstd_frames(data: bytes, size: int) -> list[tuple[int, int, int]]:
    """``(start, end, content_size)`` of each frame; the frames must fill ``data`` exactly
    and their content sizes add up to ``size``. Checked before anything is inflated."""
    frames = []
    pos, total = 0, 0
    while pos < len(data) or not frames:
        end, content = _check_zstd_frame(data, pos)
        total += content
        if total > size:
            raise CompressionError(f"zstd frames hold more than the recorded {size} bytes")
        frames.append((pos, end, content))
        pos = end
    if total != size:
        raise CompressionError(f"zstd frames hold {total} bytes, not the recorded {size}")
    return frames


def _check_zstd_frame(data: bytes, pos: int) -> tuple[int, int]:
    """The end and content size of the zstd frame starting at ``pos``.

    python-zstandard's one-shot decoder ignores bytes after the first frame and
    sizes its output from the frame header, so the frame's extent is found here
    by walking its block headers (RFC 8878 §3.1.1), and its header must record
    the content size.
    """
    size = len(data)
    if size - pos < 6 or data[pos:pos + 4] != _ZSTD_MAGIC_BYTES:
        raise CompressionError(f"no zstd frame at byte {pos}")
    frame = data[pos:pos + 18]  # the longest frame header
    try:
        header = zstandard.frame_header_size(frame)
        content = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise CompressionError(f"zstd frame header at byte {pos} is damaged: {exc}") from None
    if content < 0:
        raise CompressionError(f"zstd frame at byte {pos} does not record its size")
    checksum = 4 if data[pos + 4] & 0x04 else 0
    at = pos + header
    while True:  # (the block headers read byte by byte: a segment's body is a few frames of a few blocks)
        if at + 3 > size:
            raise CompressionError(f"zstd frame at byte {pos} is truncated")
        word = data[at] | data[at + 1] << 8 | data[at + 2] << 16
        kind = (word >> 1) & 3
        if kind not in (_BLOCK_RAW, _BLOCK_RLE, _BLOCK_COMPRESSED):
            raise CompressionError(f"zstd frame at byte {pos} has a reserved block type")
        at += 3 + (1 if kind == _BLOCK_RLE else word >> 3)
        if word & 1:
            break
    end = at + checksum
    if end > len(data):
        raise CompressionError(f"zstd frame at byte {pos} ends at byte {end}, past the payload's end ({len(data)})")
    return end, content
