"""A bucket's listed ledgers' entry ids gathered from its segments, timestamps left aside where they
can be: what a membership question on a version-5 or version-6 bucket reads.

From version 5 entry 0 gives a sparse bucket's ledgers and their counts only; their entry ids are
the segments' rows (``formats/bucket_snapshot.md``, "Version 5's lists"). Decoding every segment
whole, as delivery does, and then sorting the rows by (ledger, entry id) cost about four times what
version 4's gaps did, most of it in work membership does not need: a plain segment's timestamps
(its ledger and entry columns pair up row by row), the rows' order checks, the per-segment
calls' overhead (a 50,000-index sparse bucket has about 20 segments of a few thousand rows) and
temporaries the size of the bucket (each one fresh pages, whose faults on a VM cost more than the
arithmetic on them).

So each segment is opened and its columns read (:func:`segment_rows`), the timestamp column of a
plain segment skipped by its header. A grouped segment (version 6) stores its entry ids in delivery
order but its ledgers by group, so which ledger a row's entry id belongs to depends on the
timestamps: its steps are decoded, and the rows of all the bucket's grouped segments are put back
in delivery order by one sort of one 64-bit key a row, ``(segment, timestamp, rank of the
ledger)``, made as one running sum of the steps (:func:`_delivery_keys`), as
:func:`~bucketstore.format.grouped_rows.delivery_order` does one segment at a time. Ledgers are
matched to the listed ones a group at a time, not a row at a time; in the same array each row
becomes ``(rank << 32) | entry id``, and one more sort gives every listed ledger's ids in order.
Rows of ledgers entry 0 keeps as bitmaps, wide ids and keys that do not fit a word take the
general way (:func:`_keys_of_rows`), a grouped segment at a time.

What is checked is what the answer rests on: each segment's frame (its CRC, by the caller's
reader), prefix, compressed stream, directory and column extents; each ledger's timestamps
ascending within a grouped segment (a step that wraps would pair entry ids with other ledgers);
and the gathered rows against entry 0's counts with no position twice. The rows' delivery order
and the segments' first and last timestamps are delivery's to check when it reads the segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import CorruptLedgerError
from .entry_lists import EntryLists, ListsError, lists_from_keys, ranks
from .fs import FileSystem
from .grouped_rows import Directory, GroupedError, delivery_order, read_directory
from .ledger_file import LedgerReader
from .segment_codec import SegmentCodecError, decode_column, open_body, skip_column

__all__ = ["RowsError", "SegmentRows", "listed_entries", "read_listed", "segment_rows"]

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
    except SegmentCodecError as exc:  # at an offset in the body: the payload's, or its stream's start
        raise opened.in_payload(SegmentCodecError(opened.base + exc.offset, exc.reason)) from None
    return rows


def read_listed(reader: LedgerReader, fs: FileSystem, version: int, segments: Sequence[Any], ledgers: np.ndarray,
                counts: np.ndarray) -> EntryLists:
    """Version 5: the listed ``ledgers``' entry ids from the segments' rows of a bucket file, its
    entries ``1..N`` (``segments``: entry 0's segment table, each with its ``count``), read from
    ``reader`` or, once that is closed, from the file opened again. (A function, not a method of
    the bucket file: entry 0's metadata holds it, and would hold the file in a cycle.)

    :raises CorruptLedgerError: a damaged segment, or rows that disagree with entry 0's counts.
    """
    opened = reader if not reader.closed else LedgerReader(reader.path, fs=fs)
    try:
        rows = []
        for number, m in enumerate(segments, start=1):
            try:
                rows.append(segment_rows(opened.read_entry(number), m.count, snapshot_version=version))
            except SegmentCodecError as exc:
                raise CorruptLedgerError(reader.path, opened.entry_payload_offset(number) + exc.offset,
                                         f"segment {number}: {exc.reason}") from None
        try:
            return listed_entries(rows, ledgers, counts)
        except RowsError as exc:
            if exc.segment is not None:
                raise CorruptLedgerError(reader.path, opened.entry_payload_offset(exc.segment + 1),
                                         f"segment {exc.segment + 1}: {exc.reason}") from None
            raise CorruptLedgerError(reader.path, opened.entry_payload_offset(0),
                                     f"entry 0's listed ledgers and the segments disagree: {exc.reason}") from None
    finally:
        if opened is not reader:
            opened.close()


def listed_entries(segments: Sequence[SegmentRows], ledgers: np.ndarray, counts: np.ndarray) -> EntryLists:
    """The listed ``ledgers``' entry ids (``counts[k]`` of ledger ``ledgers[k]``) from a bucket's
    segments' rows: each ledger's ids ascending, ledger after ledger, as
    :func:`~bucketstore.format.entry_lists.lists_from_rows` gives them from decoded segments. Rows
    of ledgers not listed are left out.

    :raises RowsError: a grouped segment whose ledger's timestamps go back (``segment`` set), or
        rows that disagree with the counts or repeat a position (``segment`` None).
    """
    ledgers = np.asarray(ledgers, dtype=_U64)
    key = _listed_keys(segments, ledgers) if len(ledgers) else None
    try:
        if key is None:
            key = _keys_of_rows(segments, ledgers)
        return lists_from_keys(key, ledgers, counts)
    except ListsError as exc:
        raise RowsError(None, exc.reason) from None


def _listed_keys(segments: Sequence[SegmentRows], ledgers: np.ndarray) -> np.ndarray | None:
    """Every row's ``(rank << 32) | entry id`` key when every row's ledger is listed, its entry id
    below 2**32 and the grouped segments' keys fit (:func:`_delivery_keys`); None otherwise.

    A sparse bucket's case, made with few temporaries the size of the bucket: each is an
    allocation of fresh pages (above the allocator's threshold for reusing freed memory), whose
    page faults on a VM cost more than the arithmetic. So the grouped rows' keys are made, sorted
    and turned into these in the one array their steps are gathered in."""
    for s in segments:
        if len(s.entries) and int(s.entries.max()) >= 1 << 32:
            return None
    parts = []
    grouped = [s for s in segments if s.directory is not None]
    if grouped:
        directories: list[Directory] = [s.directory for s in grouped]  # type: ignore[misc]
        rank = ranks(ledgers, np.concatenate([d.ledgers for d in directories]))
        if (rank < 0).any():
            return None
        sizes = np.concatenate([d.counts for d in directories])
        groups = np.fromiter((len(d.counts) for d in directories), dtype=np.int64, count=len(directories))
        rank_bits = _bits(len(ledgers))
        # (A ledger's rank orders a segment's groups as their ledgers do: it breaks ties as they would.)
        steps = np.concatenate([s.steps for s in grouped])  # type: ignore[misc]
        key = _delivery_keys(directories, groups, sizes, steps, rank.astype(_U64), rank_bits)
        if key is None:
            return None
        key.sort()
        key &= np.uint64((1 << rank_bits) - 1)  # each row's rank, in delivery order
        parts.append((key, grouped))
    plain = [s for s in segments if s.directory is None]
    if plain:
        rank = ranks(ledgers, np.concatenate([s.ledgers for s in plain]))  # type: ignore[misc]
        if (rank < 0).any():
            return None
        parts.append((rank.view(_U64), plain))
    for key, rows in parts:
        key <<= np.uint64(32)
        at = 0
        for s in rows:
            key[at:at + len(s.entries)] |= s.entries
            at += len(s.entries)
    return parts[0][0] if len(parts) == 1 else np.concatenate([key for key, _ in parts])


def _keys_of_rows(segments: Sequence[SegmentRows], ledgers: np.ndarray) -> np.ndarray:
    """:func:`_listed_keys` for any rows: rows of ledgers not listed left out, grouped segments
    whose keys do not fit put in delivery order one at a time.

    :raises ListsError: a listed ledger's row with an entry id of 2**32 or more.
    :raises RowsError: a grouped segment whose ledger's timestamps go back.
    """
    plain = [s for s in segments if s.directory is None]
    plain += [_in_delivery_order(s, number) for number, s in enumerate(segments) if s.directory is not None]
    if not plain:
        return np.zeros(0, dtype=_U64)
    rank = ranks(ledgers, np.concatenate([s.ledgers for s in plain])) if len(ledgers) else \
        np.full(sum(len(s.entries) for s in plain), -1, dtype=np.int64)
    entries = np.concatenate([s.entries for s in plain])
    listed = rank >= 0
    if not listed.all():  # rows of ledgers with a bitmap (or none of the lists'): left out
        rank, entries = rank[listed], entries[listed]
    if len(entries) and int(entries.max()) >= 1 << 32:
        raise ListsError(0, "a listed ledger's row has an entry id of 2**32 or more")
    return (rank.astype(_U64) << np.uint64(32)) | entries


def _in_delivery_order(rows: SegmentRows, number: int) -> SegmentRows:
    """A grouped segment's rows with each one's ledger, as a plain segment's."""
    try:
        _, ledgers = delivery_order(rows.directory, rows.steps)  # type: ignore[arg-type]
    except GroupedError as exc:
        raise RowsError(number, exc.reason) from None
    return SegmentRows(rows.entries, ledgers, None, None)


def _bits(count: int) -> int:
    """Bits to hold ``0 .. count - 1``."""
    return max(count - 1, 1).bit_length()


def _delivery_keys(directories: list[Directory], groups: np.ndarray, sizes: np.ndarray, steps: np.ndarray,
                   low: np.ndarray, low_bits: int) -> np.ndarray | None:
    """One key a row, in group order, whose sort is delivery order: ``(segment, timestamp - base,
    low)`` packed high to low, ``low`` being each group's value of ``low_bits`` bits, rising with
    the groups' ledgers within a segment (so it breaks ties of timestamps in ledger order; rows of
    one group that tie are the same ledger's). None when the fields do not fit 64 bits, or a
    timestamp could wrap (what delivery order rejects). Made in ``steps``' memory.

    The keys are one running sum: each row adds its step (shifted past the low bits), and a
    group's first row adds what takes the key from the previous group's last to its own."""
    firsts = np.cumsum(sizes) - sizes
    top_step = int(steps.max())
    if top_step and top_step.bit_length() + int(sizes.max()).bit_length() > 63:
        return None  # a group's sum of steps could wrap
    sums = np.add.reduceat(steps, firsts)  # each group's last timestamp over its segment's base
    bases = np.repeat(np.fromiter((d.base for d in directories), dtype=_U64, count=len(directories)), groups)
    if (sums > ~bases).any():  # (~base is 2**64 - 1 - base) a timestamp past 2**64 - 1 wraps
        return None
    seg_bits = _bits(len(directories))
    time_bits = int(sums.max()).bit_length()
    if low_bits + seg_bits + time_bits > 64:
        return None
    seg = np.repeat(np.arange(len(directories), dtype=_U64), groups) << np.uint64(time_bits + low_bits)
    first_keys = seg | (steps[firsts] << np.uint64(low_bits)) | low
    last_keys = seg | (sums << np.uint64(low_bits)) | low
    steps <<= np.uint64(low_bits)
    steps[firsts[1:]] = first_keys[1:] - last_keys[:-1]  # wraps: the running sum wraps back
    steps[0] = first_keys[0]
    return np.cumsum(steps, dtype=_U64, out=steps)
