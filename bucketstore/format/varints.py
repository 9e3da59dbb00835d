"""Unsigned LEB128 varints, as a grouped segment's directory stores them (snapshot version 6).

A value is written 7 bits a byte, least significant group first; every byte but the last has
its high bit set. The writer uses the shortest form; a reader accepts at most 10 bytes a value
and refuses one of 2**64 or more. Reading many at once is done with array operations, so a
damaged count costs no more than the bytes it can find.
"""

from __future__ import annotations

import numpy as np

__all__ = ["VarintError", "encode", "encode_array", "decode", "decode_one"]

_MAX_BYTES = 10
_U64 = np.dtype("<u8")


class VarintError(ValueError):
    """Varints are truncated, too long or too large; ``offset`` is in the buffer read."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"offset {offset}: {reason}")


def encode(values: list[int]) -> bytes:
    """The shortest LEB128 form of each of ``values`` (each in ``0 .. 2**64 - 1``), end to end."""
    out = bytearray()
    for v in values:
        if not 0 <= v < 1 << 64:
            raise ValueError(f"varint {v} is outside 0 .. 2**64 - 1")
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def encode_array(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """:func:`encode` of a uint64 array with array operations: the bytes, and each value's length."""
    values = np.ascontiguousarray(values, dtype=_U64)
    bits = np.zeros(len(values), dtype=np.int64)
    rest = values.copy()
    while rest.any():  # the number of 7-bit groups each value needs (at least 1)
        nonzero = rest != 0
        bits += nonzero
        rest >>= np.uint64(7)
    lengths = np.maximum(bits, 1)
    shifts = np.arange(_MAX_BYTES, dtype=_U64) * np.uint64(7)
    groups = ((values[:, None] >> shifts[None, :]) & np.uint64(0x7F)).astype(np.uint8)
    place = np.arange(_MAX_BYTES)[None, :]
    groups[place < lengths[:, None] - 1] |= 0x80
    return groups[place < lengths[:, None]].tobytes(), lengths


def decode_one(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Read one varint at ``pos``: :func:`decode` of one value without the array work."""
    value = 0
    for place in range(_MAX_BYTES):
        if pos + place >= len(buf):
            raise VarintError(pos, "1 of 1 varints are missing or truncated")
        byte = buf[pos + place]
        value |= (byte & 0x7F) << (7 * place)
        if byte < 0x80:
            if value >> 64:
                raise VarintError(pos, "a varint of 2**64 or more")
            return value, pos + place + 1
    if len(buf) - pos > _MAX_BYTES:
        raise VarintError(pos, f"a varint of more than {_MAX_BYTES} bytes")
    raise VarintError(pos, "1 of 1 varints are missing or truncated")


def decode(buf: bytes | memoryview, pos: int, k: int) -> tuple[np.ndarray, int]:
    """Read ``k`` varints from ``buf`` at ``pos``; return them (uint64) and the position after them.

    :raises VarintError: fewer than ``k`` complete varints follow, or one is longer than 10 bytes
        or 2**64 or more (at that varint's first byte).
    """
    if k == 0:
        return np.zeros(0, dtype=_U64), pos
    window = np.frombuffer(buf, dtype=np.uint8, count=min(len(buf) - pos, _MAX_BYTES * k), offset=pos) \
        if pos < len(buf) else np.zeros(0, dtype=np.uint8)
    ends = np.flatnonzero(window < 0x80)[:k]
    starts = np.zeros(len(ends), dtype=np.int64)
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if len(ends) and int(lengths.max()) > _MAX_BYTES:
        bad = int(np.argmax(lengths > _MAX_BYTES))
        raise VarintError(pos + int(starts[bad]), f"a varint of more than {_MAX_BYTES} bytes")
    if len(ends) < k:
        at = int(ends[-1]) + 1 if len(ends) else 0
        if len(buf) - pos - at > _MAX_BYTES:  # ten bytes follow, none of them the last of a varint
            raise VarintError(pos + at, f"a varint of more than {_MAX_BYTES} bytes")
        raise VarintError(pos + at, f"{k - len(ends)} of {k} varints are missing or truncated")
    used = window[:int(ends[-1]) + 1]
    # Each byte's place in its varint: its index minus its varint's first byte's.
    place = np.arange(len(used), dtype=np.int64) - np.repeat(starts, lengths)
    tenth = place == _MAX_BYTES - 1
    if (used[tenth] > 1).any():
        bad = int(np.flatnonzero(tenth)[np.argmax(used[tenth] > 1)] - (_MAX_BYTES - 1))
        raise VarintError(pos + bad, "a varint of 2**64 or more")
    parts = (used & 0x7F).astype(_U64) << (7 * place).astype(_U64)
    return np.add.reduceat(parts, starts), pos + len(used)
