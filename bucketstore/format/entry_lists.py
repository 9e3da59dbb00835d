"""Entry 0's entry-id lists (snapshot version 4): a sparse bucket's per-ledger entry ids as columns.

A ledger of a sparse bucket holds a few hundred entry ids out of thousands, which a roaring
bitmap serializes as array containers: a 16-bit value per id plus a header of 8 bytes a
container and 8 a bitmap. From version 4 entry 0 stores those ledgers instead as three
segment columns (``segment_codec``'s kinds, byte-planar, one zstd frame a plane): the
ledger ids, each one's number of entry ids, and the entry ids as *gaps*, each ledger's first
id then each id minus the one before it minus 1. At 1 % of the ids of 10,000-entry ledgers a
gap is a geometric variable of mean about 100, one byte mostly; measured on a 500,000-index
bucket, entry 0 goes from 1.37 to 1.08 bytes an index (the gaps' zero-order entropy is 1.01).
Version 5 keeps the first two columns only: a listed ledger's entry ids are the entry ids of
the segments' rows on that ledger (:func:`lists_from_rows` gathers them), which the segments
hold anyway. The gaps cost about 1.0 byte an index; without them entry 0 says which ledgers
and how many ids, enough for counts and for checking the file, and membership is read from the
segments when asked.
The byte-level specification is ``formats/bucket_snapshot.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .segment_codec import SegmentCodecError, decode_column, encode_column

__all__ = ["COUNTS_ONLY_VERSION", "EntryLists", "ListedRows", "ListsError", "decode_counts", "decode_lists",
           "encode_lists", "lists_from_keys", "lists_from_rows", "ranks"]

#: The snapshot version from which entry 0's lists hold the listed ledgers' counts only (no gaps).
COUNTS_ONLY_VERSION = 5

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


#: Version 5: given entry 0's version and segment table (its ``SegmentMetadata`` list), the listed
#: ledgers' ids and their counts, those ledgers' entry ids from the segments' rows.
ListedRows = Callable[[int, Sequence[Any], np.ndarray, np.ndarray], EntryLists]


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


def encode_lists(lists: EntryLists, *, gaps: bool = True) -> tuple[list[bytes], list[bool]]:
    """The three columns of ``lists`` (at least one ledger): their pieces and, per piece, whether
    it is a plane of differences (for :meth:`~bucketstore.format.compression.Compressor.compress`).
    ``gaps=False`` (version 5): the first two columns only, the ids being the segments' rows'."""
    columns = [lists.ledgers, lists.counts]
    if gaps:
        entries = np.ascontiguousarray(lists.entries, dtype=_U64)
        stored = np.empty_like(entries)
        stored[0] = entries[0]
        np.subtract(entries[1:], entries[:-1], out=stored[1:])
        stored[1:] -= np.uint64(1)
        firsts = _firsts(lists.counts)
        stored[firsts] = entries[firsts]  # each ledger starts afresh
        columns.append(stored)
    pieces: list[bytes] = []
    differences: list[bool] = []
    for values in columns:
        p, d = encode_column(values)
        pieces += p
        differences += d
    return pieces, differences


def _decode_heads(data: bytes, ledgers: int, count: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The ledger-id and count columns at the start of ``data``, checked; and where they end."""
    if ledgers > count:
        raise ListsError(0, f"{ledgers} ledgers of entry ids for {count} positions")
    try:
        ids, pos = decode_column(data, 0, ledgers)
        if ledgers > 1 and not (ids[1:] > ids[:-1]).all():
            raise ListsError(0, "the ledger ids of the entry-id lists are not strictly ascending")
        at = pos
        counts, pos = decode_column(data, pos, ledgers)
    except SegmentCodecError as exc:
        raise ListsError(exc.offset, exc.reason) from None
    if not counts.all() or int(counts.max()) > count:
        raise ListsError(at, f"a ledger's number of entry ids is 0 or above the bucket's {count}")
    # (The float sum first: the uint64 one could wrap.)
    if float(counts.sum(dtype=np.float64)) > min(count, _MAX_IDS) or int(counts.sum()) > min(count, _MAX_IDS):
        raise ListsError(at, f"the lists hold more entry ids than the bucket's {count} positions")
    return ids, counts, pos


def decode_counts(data: bytes, ledgers: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Version 5: decode ``ledgers`` (at least 1) ledgers' ids and counts from ``data`` (two
    columns, ending exactly at its end), the bucket holding ``count`` positions, with
    :func:`decode_lists`' checks of them.

    :raises ListsError: on damage, with the offset in ``data``.
    """
    ids, counts, pos = _decode_heads(data, ledgers, count)
    if pos != len(data):
        raise ListsError(pos, f"{len(data) - pos} unexpected bytes after the listed ledgers' counts")
    return ids, counts


def decode_lists(data: bytes, ledgers: int, count: int) -> EntryLists:
    """Decode ``ledgers`` (at least 1) ledgers' lists from ``data``, the bucket holding ``count``
    positions in all (a bound on the entry ids before they are allocated).

    Checks: the columns are complete and end exactly at the end of ``data``; ledger ids strictly
    ascending; every ledger's number of ids at least 1, their sum at most ``count``; every entry
    id below 2**32 (so each ledger's ids are strictly ascending by construction). The caller
    checks the ledgers' range and the total.

    :raises ListsError: on any of these, with the offset in ``data``.
    """
    ids, counts, pos = _decode_heads(data, ledgers, count)
    total = int(counts.sum())
    at = pos
    try:
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


def lists_from_rows(row_ledgers: np.ndarray, row_entries: np.ndarray, ledgers: np.ndarray,
                    counts: np.ndarray) -> EntryLists:
    """Version 5: the listed ``ledgers``' entry ids, gathered from a bucket's rows (its segments'
    ledger and entry columns, in any order), which must hold exactly ``counts[k]`` distinct
    positions of ``ledgers[k]``, every entry id below 2**32. Rows of other ledgers (entry 0's
    bitmaps') are left out.

    :raises ListsError: (offset 0) when the rows disagree with the counts or repeat a position.
    """
    ledgers = np.asarray(ledgers, dtype=_U64)
    rank = ranks(ledgers, np.asarray(row_ledgers, dtype=_U64))
    row_entries = np.asarray(row_entries, dtype=_U64)
    listed = rank >= 0
    if not listed.all():  # rows of ledgers with a bitmap (or none of the lists'): left out
        rank, row_entries = rank[listed], row_entries[listed]
    if len(row_entries) and int(row_entries.max()) >= 1 << 32:
        raise ListsError(0, "a listed ledger's row has an entry id of 2**32 or more")
    return lists_from_keys((rank.astype(_U64) << np.uint64(32)) | row_entries, ledgers, counts)


def lists_from_keys(key: np.ndarray, ledgers: np.ndarray, counts: np.ndarray) -> EntryLists:
    """:func:`lists_from_rows` given the listed rows as ``(rank << 32) | entry id`` keys (uint64,
    in any order), the rank being the ledger's index in ``ledgers``. The keys are sorted in place
    and become the entry ids returned (a bucket's rows: no second array of their size).

    :raises ListsError: (offset 0) when the rows disagree with the counts or repeat a position.
    """
    # One sort of (ledger rank, entry id) keys: fewer than 2**32 ledgers, ids below 2**32.
    key.sort()
    # Each ledger's rows are a stretch of the sorted keys: where each rank's stretch starts.
    found = np.diff(np.searchsorted(key, np.arange(len(ledgers) + 1, dtype=_U64) << np.uint64(32)))
    if not np.array_equal(found, counts.astype(np.int64)):
        wrong = int(np.flatnonzero(found != counts.astype(np.int64))[0])
        raise ListsError(0, f"ledger {int(ledgers[wrong])}: entry 0 lists {int(counts[wrong])} entry ids, "
                            f"the segments' rows hold {int(found[wrong])}")
    if len(key) > 1 and not (key[1:] > key[:-1]).all():
        raise ListsError(0, "a position of a listed ledger appears in more than one row")
    key &= np.uint64(0xFFFFFFFF)
    return EntryLists(ledgers, np.asarray(counts, dtype=_U64), key)


#: A lookup table of the ledgers' ranks is used when it has at most this many slots a row.
_TABLE_SLOTS_PER_ROW = 4


def ranks(ledgers: np.ndarray, row_ledgers: np.ndarray) -> np.ndarray:
    """Each row's ledger's index in ``ledgers`` (ascending), -1 for a ledger not among them.

    A sparse bucket's ledgers are nearly every ledger of its range: a table indexed by the
    ledger's offset from the first answers in one gather, where a binary search of each of
    the bucket's rows cost three times the segments' decoding."""
    lo, hi = int(ledgers[0]), int(ledgers[-1])
    if hi - lo < _TABLE_SLOTS_PER_ROW * max(len(row_ledgers), len(ledgers)):
        table = np.full(hi - lo + 1, -1, dtype=np.int64)
        table[(ledgers - np.uint64(lo)).astype(np.int64)] = np.arange(len(ledgers))
        inside = (row_ledgers >= np.uint64(lo)) & (row_ledgers <= np.uint64(hi))
        if inside.all():
            return table[(row_ledgers - np.uint64(lo)).astype(np.int64)]
        out = np.full(len(row_ledgers), -1, dtype=np.int64)
        out[inside] = table[(row_ledgers[inside] - np.uint64(lo)).astype(np.int64)]
        return out
    rank = np.searchsorted(ledgers, row_ledgers).astype(np.int64)
    hit = ledgers[np.minimum(rank, len(ledgers) - 1)] == row_ledgers
    rank[~hit] = -1
    return rank
