"""The two block compressors of bucket snapshots, and bounded, exact decompression.

Version 1 bodies are zlib streams (RFC 1950); version 2 writers use Zstandard
frames (RFC 8878), which ``tools/bench/bench_codec.py`` measured at about six
times zlib level 1's encode rate and twice its decode rate for a slightly
smaller output. Readers accept both.

Decompression never trusts the input: the caller gives the exact size the body
must have (already bounded by what the container can legitimately hold), the
output buffer is never larger than that, and the compressed stream must end
exactly at the end of its payload. Every failure is a :class:`CompressionError`
carrying a human-readable reason; the caller adds the file and offset.
"""

from __future__ import annotations

import zlib

import zstandard

__all__ = ["CompressionError", "ZLIB", "ZSTD", "compress", "decompress_exact"]

ZLIB = "zlib"
ZSTD = "zstd"

#: zstd level 3 is the library default; bench_codec compares 1, 3 and 6.
_ZSTD_LEVEL = 3
_ZLIB_LEVEL = 1
_ZSTD_MAGIC = 0xFD2FB528
_BLOCK_RAW, _BLOCK_RLE, _BLOCK_COMPRESSED = 0, 1, 2

# Compressor objects are reusable but not thread-safe: one per thread would be
# the general answer; creating one per call costs ~2 us, which is negligible
# beside a segment's encode, so we keep it simple.


class CompressionError(ValueError):
    """A compressed body is damaged or does not inflate to exactly the recorded size."""


def compress(body: bytes, codec: str) -> bytes:
    """Compress ``body`` with ``codec`` (:data:`ZLIB` or :data:`ZSTD`)."""
    if codec == ZSTD:
        # write_content_size: the frame records the body's size, which the reader checks.
        return zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=True).compress(body)
    if codec == ZLIB:
        return zlib.compress(body, _ZLIB_LEVEL)
    raise ValueError(f"unknown codec {codec!r}")


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
        _check_zstd_frame(data, size)
        try:
            # The frame's content size equals ``size`` (checked above), and the one-shot
            # decoder allocates exactly that and fails if the blocks produce another size.
            body = zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
        except zstandard.ZstdError as exc:
            raise CompressionError(f"zstd frame is damaged: {exc}") from None
        if len(body) != size:
            raise CompressionError("zstd frame does not hold exactly the recorded size")
        return body
    raise ValueError(f"unknown codec {codec!r}")


def _check_zstd_frame(data: bytes, size: int) -> None:
    """One zstd frame recording ``size`` as its content size and ending at ``len(data)``.

    python-zstandard's one-shot decoder ignores bytes after the first frame and
    sizes its output from the frame header, so both are checked here, by walking
    the frame's block headers (RFC 8878 §3.1.1), before any output is allocated.
    """
    if len(data) < 6 or int.from_bytes(data[:4], "little") != _ZSTD_MAGIC:
        raise CompressionError("not a zstd frame")
    try:
        header = zstandard.frame_header_size(data)
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise CompressionError(f"zstd frame header is damaged: {exc}") from None
    if declared != size:
        raise CompressionError(f"zstd frame records {declared} bytes, not the expected {size}")
    checksum = 4 if data[4] & 0x04 else 0
    pos = header
    while True:
        if pos + 3 > len(data):
            raise CompressionError("zstd frame is truncated")
        word = int.from_bytes(data[pos:pos + 3], "little")
        last, kind, block = word & 1, (word >> 1) & 3, word >> 3
        pos += 3 + (1 if kind == _BLOCK_RLE else block)
        if kind not in (_BLOCK_RAW, _BLOCK_RLE, _BLOCK_COMPRESSED):
            raise CompressionError("zstd frame has a reserved block type")
        if last:
            break
    if pos + checksum != len(data):
        raise CompressionError(f"zstd frame ends at byte {pos + checksum}, not at the payload's end ({len(data)})")
