"""A bucket's listed ledgers' entry ids gathered from its segments, timestamps left aside where they
can be: what a membership question on a version-5 or version-6 bucket reads.

From version 5 entry 0 gives a sparse bucket's ledgers and their counts only; their entry ids are
the segments' rows (``formats/bucket_snapshot.md``, "Version 5's lists"). Decoding every segment
whole, as delivery does, and then sorting the rows by (ledger, entry id) cost about four times what
version 4's gaps did, most of it in work membership does not need: a plain segment's timestamps
(its ledger and entry columns pair up row by row), the rows' order checks and the per-segment
calls' overhead (a 50,000-index sparse bucket has about 20 segments of a few thousand rows).

So each segment is opened and its columns read (:func:`segment_rows`), the timestamp column of a
plain segment skipped by its header. A grouped segment (version 6) stores its entry ids in delivery
order but its ledgers by group, so which ledger a row's entry id belongs to depends on the
timestamps: its steps are decoded, and the rows of all grouped segments of the bucket are put
back in delivery order by one sort of one 64-bit key a row (segment, timestamp, row in group
order), as :func:`~bucketstore.format.grouped_rows.delivery_order` does one segment at a time.
Ledgers are matched to the listed ones a group at a time, not a row at a time, and one sort of
``(rank << 32) | entry`` keys gives every listed ledger's ids in order.

What is checked is what the answer rests on: each segment's frame (its CRC, by the caller's
reader), prefix, compressed stream, directory and column extents; each ledger's timestamps
ascending within a grouped segment (a step that wraps would pair entry ids with other ledgers);
and the gathered rows against entry 0's counts with no position twice. The rows' delivery order
and the segments' first and last timestamps are delivery's to check when it reads the segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .entry_lists import EntryLists, ListsError, lists_from_keys, ranks
from .grouped_rows import Directory, GroupedError, delivery_order, read_directory
from .segment_codec import SegmentCodecError, decode_column, open_body, skip_column

__all__ = ["SegmentRows", "listed_entries", "segment_rows", "RowsError"]

_U64 = np.dtype("<u8")


class SegmentRows(NamedTuple):
    """One segment's entry ids in delivery order, and what gives each one its ledger: a plain
    segment's ledger column (``ledgers``), or a grouped one's directory and steps."""

    entries: np.ndarray
    ledgers: np.ndarray | None
    directory: Directory | None
    steps: np.ndarray | None


class RowsError(ValueError):
    """The segments' rows cannot be gathered: ``segment`` (0-based, in the list given) is the one
    at fault, or None when the rows disagree with entry 0's lists as a whole."""

    def __init__(self, segment: int | None, reason: str) -> None:
        self.segment = segment
        self.reason = reason
        super().__init__(reason if segment is None else f"segment {segment + 1}: {reason}")


def segment_rows(payload: bytes | memoryview, count: int, *, snapshot_version: int | None = None) -> SegmentRows:
    """Read a segment payload's entry ids and what pairs them with ledgers (see :class:`SegmentRows`).

    :raises SegmentCodecError: as :func:`~bucketstore.format.segment_codec.decode_segment` for a
        malformed prefix, stream, directory or column, with the offset in the payload.
    """
    opened = open_body(payload, count, snapshot_version=snapshot_version)
    body, n = opened.body, opened.count
    try:
        try:
            if opened.grouped:
                try:
                    directory, pos = read_directory(body, n)
                except GroupedError as exc:
                    raise SegmentCodecError(exc.offset, exc.reason) from None
                steps, pos = decode_column(body, pos, n)
                entries, pos = decode_column(body, pos, n)
                rows = SegmentRows(entries, None, directory, steps)
            else:
                pos = skip_column(body, 0, n)  # the timestamps: not needed to pair ledgers and entries
                ledgers, pos = decode_column(body, pos, n)
                entries, pos = decode_column(body, pos, n)
                rows = SegmentRows(entries, ledgers, None, None)
            if pos != len(body):
                raise SegmentCodecError(pos, f"{len(body) - pos} unexpected bytes after the columns")
        except SegmentCodecError as exc:  # offsets in the body: made the payload's
            raise SegmentCodecError(opened.base + exc.offset, exc.reason) from None
    except SegmentCodecError as exc:
        raise opened.in_payload(exc) from None
    return rows


def listed_entries(segments: Sequence[SegmentRows], ledgers: np.ndarray, counts: np.ndarray) -> EntryLists:
    """The listed ``ledgers``' entry ids (``counts[k]`` of ledger ``ledgers[k]``) from a bucket's
    segments' rows: each ledger's ids ascending, ledger after ledger, as
    :func:`~bucketstore.format.entry_lists.lists_from_rows` gives them from decoded segments. Rows
    of ledgers not listed are left out.

    :raises RowsError: a grouped segment whose ledger's timestamps go back (``segment`` set), or
        rows that disagree with the counts or repeat a position (``segment`` None).
    """
    ledgers = np.asarray(ledgers, dtype=_U64)
    numbers = [i for i, s in enumerate(segments) if s.directory is not None]
    grouped = [segments[i] for i in numbers]
    # Rows as (rank of the ledger, entry id) pairs: ``rank[index]`` (index None: every row's own).
    parts: list[tuple[np.ndarray, np.ndarray | None, np.ndarray]] = []
    plain = [s for s in segments if s.directory is None]
    if grouped:
        group_of = _delivery_groups(grouped)
        if group_of is None:  # fields too wide for one key, or a step that may wrap: segment by segment
            plain += [_in_delivery_order(s, number) for number, s in zip(numbers, grouped)]
        else:
            group_ledgers = np.concatenate([s.directory.ledgers for s in grouped])  # type: ignore[union-attr]
            parts.append((ranks(ledgers, group_ledgers), group_of, np.concatenate([s.entries for s in grouped])))
    if plain:
        parts.append((ranks(ledgers, np.concatenate([s.ledgers for s in plain])), None,  # type: ignore[misc]
                      np.concatenate([s.entries for s in plain])))
    keys = []
    try:
        for rank, index, entries in parts:
            if (rank < 0).any():  # rows of ledgers with a bitmap (or none of the lists'): left out
                listed = (rank if index is None else rank[index]) >= 0
                rank, index, entries = (rank[listed], None, entries[listed]) if index is None else \
                    (rank, index[listed], entries[listed])
            if len(entries) and int(entries.max()) >= 1 << 32:
                raise ListsError(0, "a listed ledger's row has an entry id of 2**32 or more")
            high = rank.astype(_U64) << np.uint64(32)
            keys.append((high if index is None else high[index]) | entries)
        key = np.concatenate(keys) if len(keys) != 1 else keys[0]
        return lists_from_keys(key if len(key) else np.zeros(0, dtype=_U64), ledgers, counts)
    except ListsError as exc:
        raise RowsError(None, exc.reason) from None


def _in_delivery_order(rows: SegmentRows, number: int) -> SegmentRows:
    """A grouped segment's rows with each one's ledger, as a plain segment's."""
    try:
        _, ledgers = delivery_order(rows.directory, rows.steps)  # type: ignore[arg-type]
    except GroupedError as exc:
        raise RowsError(number, exc.reason) from None
    return SegmentRows(rows.entries, ledgers, None, None)


def _delivery_groups(segments: list[SegmentRows]) -> np.ndarray | None:
    """Each row's group (numbered across the grouped ``segments``), for their rows in delivery
    order, segment after segment; None when :func:`_delivery_keys` cannot key them."""
    directories: list[Directory] = [s.directory for s in segments]  # type: ignore[misc]
    sizes = np.concatenate([d.counts for d in directories])
    groups = np.fromiter((len(d.counts) for d in directories), dtype=np.int64, count=len(directories))
    key = _delivery_keys(directories, groups, sizes, np.concatenate([s.steps for s in segments]))  # type: ignore[misc]
    if key is None:
        return None
    key.sort()
    return (key & np.uint64((1 << _bits(len(sizes))) - 1)).astype(np.intp)


def _bits(count: int) -> int:
    """Bits to hold ``0 .. count - 1``."""
    return max(count - 1, 1).bit_length()


def _delivery_keys(directories: list[Directory], groups: np.ndarray, sizes: np.ndarray,
                   steps: np.ndarray) -> np.ndarray | None:
    """One key a row, in group order, whose sort is delivery order: ``(segment, timestamp - base,
    group)`` packed high to low (the group, numbered across the segments, breaks ties of
    timestamps in ledger order; rows of one group that tie are the same ledger's). None when
    the fields do not fit 64 bits, or a timestamp could wrap (what delivery order rejects).

    The keys are one running sum: each row adds its step (shifted past the group bits), and a
    group's first row adds what takes the key from the previous group's last to its own."""
    n_groups = len(sizes)
    firsts = np.cumsum(sizes) - sizes
    top_step = int(steps.max())
    if top_step and top_step.bit_length() + int(sizes.max()).bit_length() > 63:
        return None  # a group's sum of steps could wrap
    sums = np.add.reduceat(steps, firsts)  # each group's last timestamp over its segment's base
    bases = np.repeat(np.fromiter((d.base for d in directories), dtype=_U64, count=len(directories)), groups)
    if (sums > ~bases).any():  # (~base is 2**64 - 1 - base) a timestamp past 2**64 - 1 wraps
        return None
    gbits, sbits = _bits(n_groups), _bits(len(directories))
    tbits = int(sums.max()).bit_length()
    if gbits + sbits + tbits > 64:
        return None
    seg = np.repeat(np.arange(len(directories), dtype=_U64), groups) << np.uint64(tbits + gbits)
    number = np.arange(n_groups, dtype=_U64)
    first_keys = seg | (steps[firsts] << np.uint64(gbits)) | number
    last_keys = seg | (sums << np.uint64(gbits)) | number
    adds = steps << np.uint64(gbits)
    adds[firsts[1:]] = first_keys[1:] - last_keys[:-1]  # wraps: cumsum wraps back
    adds[0] = first_keys[0]
    return np.cumsum(adds, dtype=_U64)
