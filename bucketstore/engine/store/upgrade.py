"""Rewriting a store's older bucket snapshots in the current format, in place and crash-safely.

Seals and merges always write the current version, so a store upgrades as it
lives; ``bucketstore upgrade STORE`` does it at once. Each old bucket is
upgraded like a merge of one bucket:

1. its segments are read (every check of the reader applies) and re-encoded
   with the same cuts; the new ledger file, under a fresh ledger id, is written,
   fsynced, renamed and its directory fsynced (``write_bucket``);
2. *one* catalog transaction points the bucket's key at the new ledger id;
3. the old file is unlinked.

A crash before step 2 leaves the new file an orphan (the next open removes it)
and the old bucket in force; after step 2, the old file is the orphan. At no
point is the bucket missing from the catalog or named twice. The store's write
lock is held throughout, so no tracker runs beside the upgrade.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...errors import BucketStoreError, CorruptLedgerError
from ...format.bucket_summary import encode_summary
from ...format.ledger_file import PropertyValue
from ...format.segment_codec import encode_segment
from ...format.snapshot import (SNAPSHOT_VERSION, BucketFile, BucketMetadata, SegmentMetadata, ledger_bitmaps,
                               write_bucket)
from .store import Store

__all__ = ["UpgradeReport", "upgrade_store"]

_AUTOMATIC = {"kind", "bucket_key", "start_ledger", "end_ledger"}


@dataclass
class UpgradeReport:
    """What :func:`upgrade_store` did."""

    upgraded: int = 0
    current: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    #: ``"<tracker> <key>: <reason>"`` for each bucket left as it was.
    failed: list[str] = field(default_factory=list)


def upgrade_store(path: str | os.PathLike[str],
                  on_bucket: Callable[[int, int], None] | None = None) -> UpgradeReport:
    """Rewrite every bucket of the store at ``path`` that is older than :data:`SNAPSHOT_VERSION`.

    Takes the store's write lock (raises :class:`~bucketstore.StoreLockedError`
    when a writer has it). A bucket that cannot be read or rewritten is left as
    it was and reported; the others are still upgraded.

    :param on_bucket: called as ``on_bucket(done, total)`` after each bucket (the
        command line draws progress from it; the library itself never prints).
    """
    report = UpgradeReport()
    with Store(path) as store:
        catalog = store.catalog
        work = [(name, key, ledger_id) for name in catalog.tracker_names()
                for key, ledger_id in sorted(catalog.buckets(name).items())]
        for done, (name, key, ledger_id) in enumerate(work, start=1):
            try:
                _upgrade_bucket(store, name, key, ledger_id, report)
            except (OSError, BucketStoreError, ValueError) as exc:
                report.failed.append(f"{name} {key}: {exc}")
            if on_bucket is not None:
                on_bucket(done, len(work))
    return report


def _upgrade_bucket(store: Store, name: str, key: str, ledger_id: int, report: UpgradeReport) -> None:
    old_path = store.ledger_path(ledger_id)
    with BucketFile(old_path) as bucket:
        old = bucket.metadata
        if old.version >= SNAPSHOT_VERSION:
            report.current += 1
            return
        extra: dict[str, PropertyValue] = {k: v for k, v in bucket.ledger.properties.items() if k not in _AUTOMATIC}
        segments = [bucket.read_segment(n) for n in range(1, bucket.segment_count + 1)]
        old_size = bucket.size
    ledgers = np.concatenate([s.ledger_ids for s in segments]) if segments else np.zeros(0, np.uint64)
    entries = np.concatenate([s.entry_ids for s in segments]) if segments else np.zeros(0, np.uint64)
    bitmaps = ledger_bitmaps(ledgers, entries)
    if sum(len(bm) for bm in bitmaps.values()) != old.count:
        # Version 1 could list a position in two segments; version 2 cannot say that.
        raise CorruptLedgerError(old_path, 0, "a position appears in more than one segment; "
                                              "run `bucketstore verify` and repair before upgrading")
    meta = BucketMetadata(old.start_ledger, old.end_ledger, old.count,
                          [SegmentMetadata(s.min_timestamp, s.max_timestamp, s.count) for s in old.segments],
                          SNAPSHOT_VERSION, bitmaps)
    payloads = [encode_segment(s.timestamps, s.ledger_ids, s.entry_ids) for s in segments]
    new_id = store.allocate_ledger_id()
    new_path = None
    try:
        # Durable before the catalog names it: write, fsync, rename, fsync(dir).
        new_path = write_bucket(store.ledgers_dir, new_id, meta, payloads, extra, fs=store.fs)
        # The one step that switches: the key now names the new file, atomically.
        store.catalog.commit(name, put={key: new_id}, next_ledger_id=new_id + 1,
                             summaries={key: encode_summary(meta, new_id, os.path.getsize(new_path), _head(segments))})
    except BaseException:
        if new_path is not None:
            store.remove_ledger_file(new_path)  # an orphan either way; removing it now is tidier
        raise
    # Only now is the old file unreferenced; a crash before this unlink leaves an orphan.
    store.remove_ledger_file(old_path)
    report.upgraded += 1
    report.bytes_before += old_size
    report.bytes_after += os.path.getsize(new_path)


def _head(segments: list) -> tuple | None:
    """Segment 1's rows (the summary keeps its first ones), or None when there is none."""
    if not segments:
        return None
    return segments[0].timestamps, segments[0].ledger_ids, segments[0].entry_ids
