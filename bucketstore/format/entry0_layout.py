"""Byte layouts of entry 0's bitmap bytes (snapshot versions 3 and 4): the shuffle of the
portable bitmaps laid end to end, and the msgpack bin headers written around pieces that are
compressed apart. The byte-level specification is ``formats/bucket_snapshot.md``.
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["SHUFFLE_FROM", "bin_header", "shuffle", "unshuffle"]

#: Version 3: bitmap bytes from this long are stored shuffled, their halves in zstd frames of their
#: own (each with its own entropy tables). Shorter (a dense bucket's few run containers, where
#: shuffling costs a few bytes and three frames' headers more than they save), they are stored as
#: they are, the body in one frame. The reader tells the two apart by the length alone.
SHUFFLE_FROM = 4096


def bin_header(size: int) -> bytes:
    """msgpack's shortest bin header for ``size`` bytes (bin 8, 16 or 32), as ``packb`` writes it."""
    if size < 1 << 8:
        return struct.pack(">BB", 0xC4, size)
    if size < 1 << 16:
        return struct.pack(">BH", 0xC5, size)
    return struct.pack(">BI", 0xC6, size)


def shuffle(data: bytes) -> tuple[bytes, bytes]:
    """``data``'s even bytes and its odd bytes (version 3's layout of entry 0's bitmaps).

    Portable roaring is made of 16- and 32-bit little-endian fields, above all a sparse
    ledger's array container of sorted 16-bit entry ids: its low bytes look random, its high
    bytes climb slowly. Interleaved, one entropy table must fit both; apart, the high bytes
    compress about 3.7:1 (a bitmap of odd length shifts the ones after it to the other half,
    which costs bytes, never correctness)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    return raw[0::2].tobytes(), raw[1::2].tobytes()


def unshuffle(shuffled: bytes) -> bytes:
    """The inverse of :func:`shuffle` on its two halves laid end to end."""
    raw = np.frombuffer(shuffled, dtype=np.uint8)
    half = (len(raw) + 1) // 2
    out = np.empty(len(raw), dtype=np.uint8)
    out[0::2] = raw[:half]
    out[1::2] = raw[half:]
    return out.tobytes()
