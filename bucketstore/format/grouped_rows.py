"""A grouped segment's rows (snapshot version 6): ledger by ledger, each ledger's timestamps as steps.

``segment_codec`` stores a segment of several ledgers this way when that is smaller: a directory
of varints (base timestamp, number of groups, each group's ledger as a difference from the one
before, each group's rows but the last's), then the steps column, then the entry ids in delivery
order. This module turns delivery-order rows into the directory and the steps (for many segments
at once) and back; the columns themselves are ``segment_codec``'s. The byte-level specification
is ``formats/bucket_snapshot.md``, "Grouped segments".
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import varints

__all__ = ["Directory", "GroupedError", "Groups", "delivery_order", "group", "read_directory"]

_U64 = np.dtype("<u8")


class GroupedError(ValueError):
    """A grouped body is malformed; ``offset`` is in the body (the caller knows where that is)."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"offset {offset}: {reason}")


class Groups(NamedTuple):
    """Several segments grouped: each one's directory bytes, and all their steps, segment after
    segment (segment ``i`` holds ``steps[starts[i]:starts[i] + counts[i]]``)."""

    directories: list[bytes]
    steps: np.ndarray
    starts: np.ndarray
    counts: np.ndarray


class Directory(NamedTuple):
    """A grouped body's directory, read: the base timestamp, each group's ledger and rows."""

    base: int
    ledgers: np.ndarray
    counts: np.ndarray


def group(ts: np.ndarray, ledgers: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> Groups:
    """Group the segments of rows ``starts[i] .. starts[i] + counts[i] - 1`` of the delivery-order
    columns ``ts`` and ``ledgers``. The writer's base is each segment's first timestamp.

    All the segments at once (a sparse bucket's segments are many and small, where per-segment
    calls would cost more than the work): ``at`` are their rows, ``sid`` each row's segment.
    """
    seg_starts = np.cumsum(counts) - counts
    total = int(counts.sum())
    at = np.repeat(starts - seg_starts, counts) + np.arange(total, dtype=np.int64)
    sid = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    led = ledgers[at]
    order = _by_segment_then_ledger(sid, led)
    t, led = ts[at][order], led[order]
    new_group = np.ones(total, dtype=np.bool_)
    np.not_equal(led[1:], led[:-1], out=new_group[1:])
    new_group[seg_starts] = True
    firsts = np.flatnonzero(new_group)
    step = np.empty_like(t)
    step[0] = 0
    np.subtract(t[1:], t[:-1], out=step[1:])
    bases = ts[starts]  # each segment's first (smallest) timestamp
    step[firsts] = t[firsts] - bases[sid[firsts]]
    # The directories: per segment base, groups, each group's ledger (the first as it is, the
    # others as differences), each group's size but the last's.
    g_sid = sid[firsts]
    groups = np.bincount(g_sid, minlength=len(counts))
    g_first = np.ones(len(firsts), dtype=np.bool_)
    np.not_equal(g_sid[1:], g_sid[:-1], out=g_first[1:])
    g_ledgers = led[firsts]
    fields = g_ledgers.copy()
    fields[1:] -= g_ledgers[:-1]
    fields[g_first] = g_ledgers[g_first]
    sizes = np.diff(np.append(firsts, total)).astype(_U64)
    per = 2 * groups + 1
    d_start = np.cumsum(per) - per
    values = np.empty(int(per.sum()), dtype=_U64)
    values[d_start] = bases
    values[d_start + 1] = groups.astype(_U64)
    rank = np.arange(len(firsts)) - np.repeat(np.cumsum(groups) - groups, groups)
    values[d_start[g_sid] + 2 + rank] = fields
    last = np.append(g_first[1:], True)  # a segment's last group (its size is implied)
    values[(d_start[g_sid] + 2 + groups[g_sid] + rank)[~last]] = sizes[~last]
    blob, lengths = varints.encode_array(values)
    byte_ends = np.cumsum(lengths)[d_start + per - 1].tolist()
    byte_starts = [0, *byte_ends[:-1]]
    return Groups([blob[a:b] for a, b in zip(byte_starts, byte_ends)], step, seg_starts, counts)


def _by_segment_then_ledger(sid: np.ndarray, led: np.ndarray) -> np.ndarray:
    """The permutation that orders rows by (segment, ledger, position): stable by ledger within
    each segment, so a ledger's rows keep their (timestamp, entry) order."""
    n = len(sid)
    low = led.min()
    spread = int(led.max() - low)
    pbits, lbits, sbits = (n - 1).bit_length(), spread.bit_length(), int(sid[-1]).bit_length()
    if pbits + lbits + sbits > 64:
        return np.lexsort((led, sid))  # (stable: ties keep their positions)
    # One key a row, sorted by numpy's (vectorised) sort; the position in its low bits breaks ties.
    key = (sid.astype(_U64) << np.uint64(lbits + pbits)) | ((led - low) << np.uint64(pbits))
    key |= np.arange(n, dtype=_U64)
    key.sort()
    return (key & np.uint64((1 << pbits) - 1)).astype(np.int64)


def read_directory(body: bytes | memoryview, n: int) -> tuple[Directory, int]:
    """Read the directory at the start of a grouped body of ``n`` rows; return it and where the
    steps column starts.

    :raises GroupedError: truncated, overlong or too large varints (at the varint), a number of
        groups outside ``1 .. n`` (at it), ledgers not strictly ascending or sizes leaving no row
        for the last group (at the first ledger).
    """
    try:
        base, at = varints.decode_one(body, 0)
        groups, pos = varints.decode_one(body, at)
        if not 1 <= groups <= n:
            raise GroupedError(at, f"{groups} groups in a segment of {n} rows")
        at = pos
        small = _small_directory(body, pos, base, groups, n)
        if small is not None:
            return small
        directory, pos = varints.decode(body, pos, 2 * groups - 1)
    except varints.VarintError as exc:
        raise GroupedError(exc.offset, f"segment directory: {exc.reason}") from None
    ledgers = np.cumsum(directory[:groups], dtype=_U64)  # wraps modulo 2**64; a wrap breaks the ascent
    if groups > 1 and not (ledgers[1:] > ledgers[:-1]).all():
        raise GroupedError(at, "the groups' ledgers are not strictly ascending")
    sizes = directory[groups:]
    # (The float sum first: the uint64 one could wrap.)
    if groups > 1 and (not sizes.all() or float(sizes.sum(dtype=np.float64)) >= n or int(sizes.sum()) >= n):
        raise GroupedError(at, f"the groups' sizes leave no row of the {n} for the last group")
    counts = np.append(sizes, np.uint64(n - int(sizes.sum()))).astype(np.int64)
    return Directory(base, ledgers, counts), pos


def _small_directory(body: bytes | memoryview, pos: int, base: int, groups: int,
                     n: int) -> tuple[Directory, int] | None:
    """:func:`read_directory`'s answer from ``pos`` (its first ledger) when every varint after the
    first ledger is one byte (below 128: neighbouring ledgers, groups of a few rows, as a sparse
    bucket's mostly are) and the directory is sound: read as the bytes they are, with fewer
    checks to make (no difference of 0 and no wrap, which the bytes bound). None otherwise, and
    then the general reading decodes it or reports its fault."""
    try:
        first, at = varints.decode_one(body, pos)
    except varints.VarintError:
        return None
    k = 2 * groups - 2
    if len(body) - at < k or first + 127 * (groups - 1) >= 1 << 64:
        return None
    rest = np.frombuffer(body, dtype=np.uint8, count=k, offset=at)
    if k and (rest.min() == 0 or rest.max() >= 0x80):
        return None  # a difference or size of 0 (the general reading reports it), or a longer varint
    total = int(rest[groups - 1:].sum())
    if total >= n:
        return None
    ledgers = np.empty(groups, dtype=_U64)
    ledgers[0] = first
    np.cumsum(rest[:groups - 1], dtype=_U64, out=ledgers[1:])
    ledgers[1:] += np.uint64(first)
    counts = np.empty(groups, dtype=np.int64)
    counts[:-1] = rest[groups - 1:]
    counts[-1] = n - total
    return Directory(base, ledgers, counts), at + k


def delivery_order(directory: Directory, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The timestamps and ledgers of a grouped body's rows in delivery order, from its directory
    and steps.

    :raises GroupedError: a timestamp before the one before it in its ledger (a step that wraps),
        at offset 0 (the caller reports the steps column).
    """
    counts = directory.counts
    firsts = np.cumsum(counts) - counts
    # Each group's running sum of steps, from the base: sums wrap like the encoder's differences.
    sums = np.cumsum(steps, dtype=_U64)
    ts = sums - np.repeat(sums[firsts] - steps[firsts], counts) + np.uint64(directory.base)
    ok = ts[1:] >= ts[:-1]
    ok[firsts[1:] - 1] = True  # a group's first row follows another ledger's rows
    if not ok.all():
        raise GroupedError(0, f"timestamp {int(np.argmin(ok)) + 1} of the grouped body is before the one "
                              "before it in its ledger (a step wraps)")
    g = len(counts)
    if g == 1:
        return ts, np.repeat(directory.ledgers, counts)
    # (timestamp, ledger) pairs in (ledger, timestamp) order, to be put in delivery order, which
    # the entry ids are stored in. The pairs usually fit one 64-bit key (timestamp offset, group):
    # numpy's vectorised sort of the keys, then shifts and masks (measured: a third of a stable
    # argsort's time and its gathers).
    low = ts.min()
    gbits = (g - 1).bit_length()
    if int(ts.max() - low).bit_length() + gbits <= 64:
        key = (ts - low) << np.uint64(gbits)
        key |= np.repeat(np.arange(g, dtype=_U64), counts)
        key.sort()
        return (key >> np.uint64(gbits)) + low, directory.ledgers[(key & np.uint64((1 << gbits) - 1)).astype(np.intp)]
    # A stable sort by timestamp keeps equal timestamps in ledger order.
    order = np.argsort(ts, kind="stable")
    return ts[order], np.repeat(directory.ledgers, counts)[order]
