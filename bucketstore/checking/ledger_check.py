"""Offline checking of ledger files: the engine's fsck for sealed buckets.

:func:`check_file` reads one ledger file completely and returns every problem
it finds as a :class:`Finding` (file, byte offset, message) instead of stopping
at the first one, so that an operator sees the full extent of the damage.
:func:`bucketstore.check` (``checking.report``) builds the public report from it.

What is checked, beyond what :class:`~bucketstore.format.snapshot.BucketFile` checks
when the engine opens a bucket:

* every entry's CRC (the engine reads only the segments it needs);
* for buckets: every segment decodes with the count entry 0 records, its rows
  are strictly increasing (timestamp, ledger, entry) and continue the previous
  segment's order, its min/max timestamps equal the data, every ledger lies in
  the bucket's range, and its per-ledger bitmaps hold exactly its entry ids;
  no position (ledger, entry) appears twice in the bucket.

Segments do *not* have to be cut as :func:`~bucketstore.format.snapshot.cut_segments`
would cut them: a merge may cut differently. Only their order is required.

Kinds of ledger other than ``bucket`` get the framing checks only, unless a
checker is registered for them in :data:`KIND_CHECKERS` (the store-level verify
adds its own there and appends catalog findings to the same list).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import numpy as np

from ..errors import CorruptLedgerError
from ..format.entry_lists import EntryLists, ListsError, lists_from_rows
from ..format.ledger_file import HEADER_FIXED_SIZE, LedgerReader
from ..format.segment_codec import SegmentCodecError, check_sorted, decode_segment
from ..format.snapshot import MetadataCodecError, decode_metadata
from ..memory.dedup import Deduplicator

__all__ = [
    "Finding",
    "FileReport",
    "KIND_CHECKERS",
    "FindingKind",
    "check_file",
    "ledger_files_under",
]

LEDGER_SUFFIX = ".ledger"

#: What a finding is: damage (``verify`` exits 1), or a warning (exit 0; the next ``open`` repairs it).
FindingKind = Literal["damage", "warning"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem: where it is and what is wrong.

    :ivar path: the damaged file (or, for store-level findings, the store path).
    :ivar offset: the byte offset in ``path`` of the structure that failed,
        or ``None`` when the problem has no place in a file (a missing file).
    :ivar message: one line, for an operator.
    :ivar warning: not damage: something the next ``open`` repairs by itself
        (a journal's torn tail, an orphan file a crash left); ``verify`` prints
        it and still exits 0.
    """

    path: str
    offset: int | None
    message: str
    warning: bool = False

    @property
    def kind(self) -> FindingKind:
        """``"damage"``, or ``"warning"`` for what the next ``open`` repairs by itself."""
        return "warning" if self.warning else "damage"

    def __str__(self) -> str:
        where = f"offset {self.offset}" if self.offset is not None else "-"
        return f"{'warning: ' if self.warning else ''}{self.path}: {where}: {self.message}"


@dataclass(slots=True)
class FileReport:
    """What :func:`check_file` learned about one file."""

    path: str
    entries: int = 0
    segments: int = 0
    indexes: int = 0
    findings: list[Finding] = field(default_factory=list)
    #: The file did not exist when opened (a live writer may have retired it).
    missing: bool = False
    #: A bucket's ledger range as its entry 0 records it, once decoded.
    range: tuple[int, int] | None = None

    def add(self, offset: int | None, message: str) -> None:
        self.findings.append(Finding(self.path, offset, message))


#: ledger kind (the ``kind`` header property) -> a function that checks the
#: entries of such a ledger. It receives the open reader, the payloads whose
#: CRC verified (``None`` for entries that failed) and the report to add to.
KindChecker = Callable[[LedgerReader, list["bytes | None"], FileReport], None]
KIND_CHECKERS: dict[str, KindChecker] = {}


def check_file(path: str | os.PathLike[str]) -> FileReport:
    """Check one ledger file end to end and report every problem found.

    Never raises for damage or I/O trouble: they become findings. The framing
    (header, trailer) must be intact to go further, because without it no
    entry can be located; after that, every entry is checked even when an
    earlier one failed.
    """
    report = FileReport(os.fspath(path))
    try:
        reader = LedgerReader(report.path)
    except FileNotFoundError:
        report.missing = True
        report.add(None, "ledger file is missing")
        return report
    except CorruptLedgerError as exc:
        report.add(exc.offset, exc.reason)
        return report
    except OSError as exc:
        report.add(None, f"cannot read: {exc.strerror or exc}")
        return report
    with reader:
        report.entries = reader.entry_count
        payloads: list[bytes | None] = []
        for entry_id in range(reader.entry_count):
            try:
                payloads.append(reader.read_entry(entry_id))
            except CorruptLedgerError as exc:
                report.add(exc.offset, exc.reason)
                payloads.append(None)
            except OSError as exc:
                report.add(reader.entry_offset(entry_id), f"entry {entry_id}: cannot read: {exc.strerror or exc}")
                payloads.append(None)
        kind = reader.properties.get("kind")
        checker = KIND_CHECKERS.get(str(kind))
        if checker is not None:
            checker(reader, payloads, report)
        else:
            # Every ledger bucketstore writes says what it is; one that does not
            # cannot be opened by any reader of the engine.
            report.add(HEADER_FIXED_SIZE, f"unknown ledger kind {kind!r} (known: {', '.join(sorted(KIND_CHECKERS))})")
    return report


def ledger_files_under(directory: str | os.PathLike[str]) -> list[str]:
    """Every ``*.ledger`` file below ``directory``, recursively, in sorted order."""
    found = []
    for root, dirs, files in os.walk(os.fspath(directory)):
        dirs.sort()
        found += [os.path.join(root, name) for name in sorted(files) if name.endswith(LEDGER_SUFFIX)]
    return found


# -- buckets ---------------------------------------------------------------------------------------
def _check_bucket(reader: LedgerReader, payloads: list[bytes | None], report: FileReport) -> None:
    if not payloads:
        report.add(reader.trailer_offset, "bucket ledger has no metadata entry")
        return
    if payloads[0] is None:
        return  # already reported; without entry 0 the segments cannot be judged
    meta_at = reader.entry_payload_offset(0)
    positions: list[np.ndarray] = []
    try:
        # Version 5: the listed ledgers' ids are the segments' rows, gathered below as they are read.
        meta = decode_metadata(payloads[0], partial(_listed_rows, positions))
    except MetadataCodecError as exc:
        report.add(meta_at + exc.offset, f"entry 0: {exc.reason}")
        return
    report.range = (meta.start_ledger, meta.end_ledger)
    props = reader.properties
    if (props.get("start_ledger"), props.get("end_ledger")) != (meta.start_ledger, meta.end_ledger):
        report.add(24, f"header ledger range [{props.get('start_ledger')}, {props.get('end_ledger')}] "
                       f"disagrees with entry 0 [{meta.start_ledger}, {meta.end_ledger}]")
    if props.get("bucket_key") != meta.key:
        report.add(24, f"header bucket_key {props.get('bucket_key')!r} is not {meta.key!r}, entry 0's range")
    if len(meta.segments) != len(payloads) - 1:
        report.add(meta_at, f"entry 0 lists {len(meta.segments)} segments but the ledger holds "
                            f"{len(payloads) - 1}")
    report.segments = len(meta.segments)
    report.indexes = meta.count
    previous_last: tuple[int, int, int] | None = None
    for number, seg_meta in enumerate(meta.segments, start=1):
        if number >= len(payloads):
            break
        payload = payloads[number]
        if payload is None:
            previous_last = None  # cannot compare across a segment we could not read
            continue
        at = reader.entry_payload_offset(number)
        try:
            seg = decode_segment(payload, seg_meta.count, check_order=False, snapshot_version=meta.version)
        except SegmentCodecError as exc:
            report.add(at + exc.offset, f"segment {number}: {exc.reason}")
            previous_last = None
            continue
        ts, ledgers, entries = seg.timestamps, seg.ledger_ids, seg.entry_ids
        bad = check_sorted(ts, ledgers, entries)
        if bad >= 0:
            report.add(at, f"segment {number}: rows out of (timestamp, ledger, entry) order at row {bad}")
        first = (int(ts[0]), int(ledgers[0]), int(entries[0]))
        if previous_last is not None and first <= previous_last:
            report.add(at, f"segment {number}: first index {first} does not follow the previous "
                           f"segment's last {previous_last}")
        previous_last = (int(ts[-1]), int(ledgers[-1]), int(entries[-1]))
        low, high = int(ts.min()), int(ts.max())
        if (low, high) != (seg_meta.min_timestamp, seg_meta.max_timestamp):
            report.add(at, f"segment {number}: timestamps span [{low}, {high}] but entry 0 records "
                           f"[{seg_meta.min_timestamp}, {seg_meta.max_timestamp}]")
        outside = (ledgers < np.uint64(meta.start_ledger)) | (ledgers > np.uint64(meta.end_ledger))
        if outside.any():
            report.add(at, f"segment {number}: ledger {int(ledgers[outside][0])} lies outside the bucket's "
                           f"range [{meta.start_ledger}, {meta.end_ledger}]")
        if meta.version == 1:
            _check_bitmaps(number, at, meta_at, ledgers, entries, seg_meta.bitmaps, report)
        positions.append(np.stack((ledgers, entries), axis=1))
    _check_unique_positions(positions, meta_at, report)
    if meta.version >= 2 and len(positions) == len(meta.segments):
        # Version 2's bitmaps are the bucket's: they must hold exactly the segments' positions.
        # (With a segment unreadable, its damage is reported and this comparison would only repeat it.)
        try:
            _check_bucket_bitmaps(positions, meta.bitmaps, meta_at, report)
        except ListsError as exc:  # version 5: entry 0's counts of its listed ledgers disagree with the rows
            report.add(meta_at, f"entry 0's listed ledgers and the segments disagree: {exc.reason}")


def _listed_rows(positions: list[np.ndarray], version: int, segments: object, ledgers: np.ndarray,
                 counts: np.ndarray) -> EntryLists:
    """Version 5's listed ledgers' entry ids, from the rows of the segments read (``positions``)."""
    pairs = np.concatenate(positions) if positions else np.zeros((0, 2), dtype=np.uint64)
    return lists_from_rows(pairs[:, 0], pairs[:, 1], ledgers, counts)


def _check_unique_positions(positions: list[np.ndarray], meta_at: int, report: FileReport) -> None:
    # A position has one delivery time, so it belongs to one index of the bucket.
    # Within a segment the bitmap check catches a repeat; across segments only this does.
    if not positions:
        return
    pairs = np.concatenate(positions)
    distinct = np.unique(pairs, axis=0)
    if len(distinct) != len(pairs):
        report.add(meta_at, f"{len(pairs) - len(distinct)} position(s) (ledger, entry) appear in more than one index")


def _check_bucket_bitmaps(positions: list[np.ndarray], bitmaps: dict, meta_at: int, report: FileReport) -> None:
    pairs = np.concatenate(positions) if positions else np.zeros((0, 2), dtype=np.uint64)
    ledgers, entries = pairs[:, 0], pairs[:, 1]
    order = np.lexsort((entries, ledgers))
    sorted_ledgers, sorted_entries = ledgers[order], entries[order]
    present = np.unique(sorted_ledgers).tolist()
    for ledger in sorted(set(bitmaps) - set(present)):
        report.add(meta_at, f"entry 0 has a bitmap for ledger {ledger}, which has no index in any segment")
    for ledger in present:
        lo = np.searchsorted(sorted_ledgers, np.uint64(ledger), side="left")
        hi = np.searchsorted(sorted_ledgers, np.uint64(ledger), side="right")
        actual = np.unique(sorted_entries[lo:hi])
        bitmap = bitmaps.get(ledger)
        recorded = np.zeros(0, np.uint64) if bitmap is None else np.asarray(bitmap.to_array(), dtype=np.uint64)
        if len(recorded) != len(actual) or not np.array_equal(recorded, actual):
            report.add(meta_at, f"ledger {ledger}: entry 0's bitmap ({len(recorded)} entries) differs from "
                                f"the {len(actual)} entry ids the segments hold")


def _check_bitmaps(number: int, at: int, meta_at: int, ledgers: np.ndarray, entries: np.ndarray,
                   bitmaps: dict, report: FileReport) -> None:
    order = np.lexsort((entries, ledgers))
    sorted_ledgers, sorted_entries = ledgers[order], entries[order]
    present = np.unique(sorted_ledgers).tolist()
    for ledger in sorted(set(bitmaps) - set(present)):
        report.add(meta_at, f"segment {number}: entry 0 has a bitmap for ledger {ledger}, "
                            f"which has no index in the segment")
    for ledger in present:
        lo, hi = np.searchsorted(sorted_ledgers, np.uint64(ledger), side="left"), \
            np.searchsorted(sorted_ledgers, np.uint64(ledger), side="right")
        actual = sorted_entries[lo:hi]
        bitmap = bitmaps.get(ledger)
        if bitmap is None:
            report.add(meta_at, f"segment {number}: ledger {ledger} has {len(actual)} indexes "
                                f"but no bitmap in entry 0")
            continue
        recorded = np.asarray(bitmap.to_array(), dtype=np.uint64)
        # Duplicate rows would make ``actual`` longer than any bitmap; the order
        # check has reported them, and this check reports the count mismatch.
        if len(recorded) != len(actual) or not np.array_equal(recorded, actual):
            report.add(at, f"segment {number}: ledger {ledger}: the bitmap in entry 0 ({len(recorded)} entries) "
                           f"differs from the segment's {len(actual)} entry ids")


KIND_CHECKERS["bucket"] = _check_bucket


def _check_dedup_snapshot(reader: LedgerReader, payloads: list[bytes | None], report: FileReport) -> None:
    """A de-duplicator snapshot is checked by loading it, as Deduplicator.load does."""
    if any(p is None for p in payloads):
        return  # the CRC failures are already reported
    try:
        Deduplicator._from_reader(reader)
    except CorruptLedgerError as exc:
        report.add(exc.offset, exc.reason)


KIND_CHECKERS["dedup-snapshot"] = _check_dedup_snapshot
