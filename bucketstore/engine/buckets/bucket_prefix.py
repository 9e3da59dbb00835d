"""A bucket's first rows, delivered from its catalog summary before its file is opened.

The first batch after a restart needs the earliest rows of every bucket whose
delays overlap the clock: with random delays in one window, every bucket's.
Reading each one's entry 0 and segment 1 made the first batch cost grow with the
number of buckets (~200 files at 10 M positions). A version-2 catalog summary
keeps segment 1's first rows (:data:`~bucketstore.format.bucket_summary.PREFIX_ROWS`)
and the timestamp of the row after them; recovery queues those rows as the
bucket's run (:func:`take_head`), their positions tracked in the index like any
other (:func:`track_heads`), and the rest of segment 1 waits behind them, keyed by
that next timestamp. The shared queue opens the bucket (entry 0, then segment 1
without the prefix, checked against it) only when a batch reaches past the
prefix.

Why the index stays exact: every operation on a bucket's ledgers other than
delivery (an add, a membership test, an expiry, a mark-delete cutting through it,
a journal record, a merge) opens the bucket first. So when a bucket opens, a
prefix position no longer tracked was delivered, and nothing else: it is left out
of the positions entry 0 adds (:func:`without_delivered_head`), and it is a ghost already
(delivery made it one: the bucket's file still holds its row).
"""

from __future__ import annotations

import numpy as np
from pyroaring import BitMap64

from ...errors import CatalogError
from ...format import bucket_summary
from ...format.snapshot import BucketFile, BucketMetadata, EntryBitmap, ledger_bitmaps
from ..queue.index_set import DelayedIndexSet
from ..queue.shared_queue import Run
from .sealed_bucket import SealedBucket

__all__ = ["first_rows", "head_holds", "take_head", "track_heads", "without_delivered_head"]

_U64 = np.dtype("<u8")


def take_head(bucket: SealedBucket) -> Run | None:
    """The run of an unopened bucket's prefix, which the queue holds instead of its first slot
    (and ``bucket.head`` set), or None when its summary keeps none or recovery skipped segment 1.

    :raises CatalogError: the prefix names a position outside the bucket's ledgers, or one twice.
    """
    summary = bucket.summary
    if summary is None or not summary.prefix_rows or bucket.current != 0:
        return None
    k = summary.prefix_rows
    cols = np.concatenate(summary.prefix())  # one aligned copy of the three columns
    ts, ledgers, entries = cols[:k], cols[k:2 * k], cols[2 * k:]
    ls = ledgers.tolist()  # (a few dozen rows: Python's min/max/set beat numpy's per-call cost)
    if min(ls) < bucket.start_ledger or max(ls) > bucket.end_ledger or len(set(zip(ls, entries.tolist()))) != k:
        raise CatalogError(f"{summary.path}: summary of bucket {summary.key}: its prefix names a position "
                           f"outside ledgers [{bucket.start_ledger}, {bucket.end_ledger}] or one twice",
                           path=summary.path, key=summary.key)
    bucket.head = summary
    return Run(ts, ledgers, entries, owner=bucket)


def track_heads(index: DelayedIndexSet, runs: list[Run]) -> None:
    """Track the positions of the prefix runs :func:`take_head` gave (one bitmap union per ledger)."""
    if runs:
        index.add_many(np.concatenate([r.ledgers for r in runs]), np.concatenate([r.entries for r in runs]))


def head_holds(bucket: SealedBucket, ledger_id: int, entry_id: int) -> bool:
    """Whether the position is one of the prefix rows the queue holds for the unopened ``bucket``:
    the index tracks those (delivery untracks them), so the index, not the bucket's file or a
    copy of entry 0, says whether such a position is still tracked."""
    head = bucket.head
    if head is None or bucket.current != 0:
        return False
    _, ledgers, entries = head.prefix()
    return bool(((ledgers == ledger_id) & (entries == entry_id)).any())


def without_delivered_head(index: DelayedIndexSet, bucket: SealedBucket,
                           live: dict[int, EntryBitmap]) -> dict[int, EntryBitmap]:
    """``live`` (the positions opening ``bucket`` would track) less the prefix positions
    delivered before it was opened: those no longer tracked. ``live`` is not changed."""
    head = bucket.head
    if head is None or bucket.current != 0:
        return live
    _, ledgers, entries = head.prefix()
    gone = ~index.present_mask(ledgers, entries)
    if not gone.any():
        return live
    out = dict(live)
    for ledger, bm in ledger_bitmaps(np.array(ledgers[gone], dtype=_U64), np.array(entries[gone], dtype=_U64)).items():
        have = out.get(ledger)
        if have is None:
            continue
        rest = have - bm if type(have) is type(bm) else BitMap64(have) - BitMap64(bm)
        if rest:
            out[ledger] = rest
        else:
            del out[ledger]
    return out


def first_rows(path: str, meta: BucketMetadata) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Segment 1's rows read from the file, for the prefix of a summary derived from entry 0
    (the backfill of a catalog written before summaries); None when segment 1 is too short
    to keep one.

    :raises CorruptLedgerError: segment 1 is damaged."""
    if not meta.segments or meta.segments[0].count <= bucket_summary.PREFIX_ROWS:
        return None
    with BucketFile(path) as bf:
        seg = bf.read_segment(1)
    return seg.timestamps, seg.ledger_ids, seg.entry_ids
