"""Entry 0's entry-id lists (snapshot version 4): a sparse bucket's per-ledger entry ids as columns.

A ledger of a sparse bucket holds a few hundred entry ids out of thousands, which a roaring
bitmap serializes as array containers: a 16-bit value per id plus a header of 8 bytes a
container and 8 a bitmap. From version 4 entry 0 stores those ledgers instead as three
segment columns (``segment_codec``'s kinds, byte-planar, one zstd frame a plane): the
ledger ids, each one's number of entry ids, and the entry ids as *gaps*, each ledger's first
id then each id minus the one before it minus 1. At 1 % of the ids of 10,000-entry ledgers a
gap is a geometric variable of mean about 100, one byte mostly; measured on a 500,000-index
bucket, entry 0 goes from 1.37 to 1.08 bytes an index (the gaps' zero-order entropy is 1.01).
The byte-level specification is ``formats/bucket_snapshot.md``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .segment_codec import SegmentCodecError, decode_column, encode_column

__all__ = ["EntryLists", "ListsError", "decode_lists", "encode_lists"]

_U64 = np.dtype("<u8")
_ID_LIMIT = np.uint64(1 << 32)
#: Entry ids the lists may hold: fewer than 2**32, so that their running sum (below) never wraps.
_MAX_IDS = (1 << 32) - 1


class EntryLists(NamedTuple):
    """Ledgers whose entry ids entry 0 stores as lists: ascending ledger ids, each one's number of
    entry ids (at least 1), and all the entry ids, each ledger's ascending, ledger after ledger
    (every one below 2**32)."""

    ledgers: np.ndarray
    counts: np.ndarray
    entries: np.ndarray


class ListsError(ValueError):
    """The lists are malformed: ``offset`` is in the lists' bytes."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"offset {offset}: {reason}")


def _firsts(counts: np.ndarray) -> np.ndarray:
    """The index of each ledger's first entry id in the concatenation."""
    ends = np.cumsum(counts.astype(np.int64))
    return ends - counts.astype(np.int64)


def encode_lists(lists: EntryLists) -> tuple[list[bytes], list[bool]]:
    """The three columns of ``lists`` (at least one ledger): their pieces and, per piece, whether
    it is a plane of differences (for :meth:`~bucketstore.format.compression.Compressor.compress`)."""
    entries = np.ascontiguousarray(lists.entries, dtype=_U64)
    gaps = np.empty_like(entries)
    gaps[0] = entries[0]
    np.subtract(entries[1:], entries[:-1], out=gaps[1:])
    gaps[1:] -= np.uint64(1)
    firsts = _firsts(lists.counts)
    gaps[firsts] = entries[firsts]  # each ledger starts afresh
    pieces: list[bytes] = []
    differences: list[bool] = []
    for values in (lists.ledgers, lists.counts, gaps):
        p, d = encode_column(values)
        pieces += p
        differences += d
    return pieces, differences


def decode_lists(data: bytes, ledgers: int, count: int) -> EntryLists:
    """Decode ``ledgers`` (at least 1) ledgers' lists from ``data``, the bucket holding ``count``
    positions in all (a bound on the entry ids before they are allocated).

    Checks: the columns are complete and end exactly at the end of ``data``; ledger ids strictly
    ascending; every ledger's number of ids at least 1, their sum at most ``count``; every entry
    id below 2**32 (so each ledger's ids are strictly ascending by construction). The caller
    checks the ledgers' range and the total.

    :raises ListsError: on any of these, with the offset in ``data``.
    """
    if ledgers > count:
        raise ListsError(0, f"{ledgers} ledgers of entry ids for {count} positions")
    try:
        ids, pos = decode_column(data, 0, ledgers)
        if ledgers > 1 and not (ids[1:] > ids[:-1]).all():
            raise ListsError(0, "the ledger ids of the entry-id lists are not strictly ascending")
        at = pos
        counts, pos = decode_column(data, pos, ledgers)
        if not counts.all() or int(counts.max()) > count:
            raise ListsError(at, f"a ledger's number of entry ids is 0 or above the bucket's {count}")
        # (The float sum first: the uint64 one could wrap.)
        if float(counts.sum(dtype=np.float64)) > min(count, _MAX_IDS) or int(counts.sum()) > min(count, _MAX_IDS):
            raise ListsError(at, f"the lists hold more entry ids than the bucket's {count} positions")
        total = int(counts.sum())
        at = pos
        gaps, pos = decode_column(data, pos, total) if total else (np.zeros(0, dtype=_U64), pos)
    except SegmentCodecError as exc:
        raise ListsError(exc.offset, exc.reason) from None
    if pos != len(data):
        raise ListsError(pos, f"{len(data) - pos} unexpected bytes after the entry-id lists")
    if (gaps >= _ID_LIMIT).any():
        raise ListsError(at, "an entry-id gap is 2**32 or more")
    # Each id is the one before it plus its gap plus 1, from each ledger's first; with gaps below
    # 2**32 and fewer than 2**32 of them (_MAX_IDS) the running sum cannot wrap.
    steps = gaps + np.uint64(1)
    firsts = _firsts(counts)
    steps[firsts] = gaps[firsts]
    entries = np.cumsum(steps, dtype=_U64)
    entries -= np.repeat(entries[firsts] - steps[firsts], counts.astype(np.int64))
    if len(entries) and (entries >= _ID_LIMIT).any():
        raise ListsError(at, "an entry id of the lists is 2**32 or more")
    return EntryLists(ids, counts, entries)
