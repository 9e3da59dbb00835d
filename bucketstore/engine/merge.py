"""Merging adjacent sealed buckets (PIP-195 §3.6), done so that nothing is lost or repeated.

Pulsar's merge lost the already-loaded segment of a source bucket (#26251),
deleted sources after a failed create (#26239), and threw for
``maxNumBuckets`` 1..3 (#26241). Here:

* every segment of every source is read, and a row is kept only if it is still
  live in the tracker's index, so delivered indexes are left out and nothing
  undelivered is, whichever segments were loaded;
* the merged ledger is made durable first, then *one* catalog transaction adds
  its key and removes the sources' keys, and only then are the source files
  unlinked; a failure before the commit removes the new file and leaves the
  sources untouched;
* windows of 4 down to 2 buckets work for any ``max_num_buckets`` >= 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .index_set import DelayedIndexSet
from .sealed_bucket import SealedBucket
from ..format.row_sort import sort_rows
from ..format.snapshot import drop_repeats

__all__ = ["MAX_MERGE_NUM", "choose_merge_window", "live_rows"]

#: Pulsar merges at most this many adjacent buckets at once.
MAX_MERGE_NUM = 4


def choose_merge_window(buckets: Sequence[SealedBucket]) -> list[SealedBucket] | None:
    """Pick adjacent buckets to merge, or None when no window qualifies.

    Buckets are taken in ledger order. A window qualifies when each of its
    buckets still has segments on disk that the queue has not reached (merging
    a bucket whose last segment is in memory would save nothing). Windows of
    :data:`MAX_MERGE_NUM` are tried first, then smaller ones down to 2; among
    qualifying windows of one size the one holding the fewest pending indexes
    wins, ties going to the one whose next segment is due earliest. (Pulsar's
    selector only replaces its pick on a strictly earlier timestamp, which can
    prefer a larger window; this one orders by the two keys plainly.)
    """
    ordered = list(buckets)
    for size in range(min(MAX_MERGE_NUM, len(ordered)), 1, -1):
        best: tuple[int, int, int] | None = None
        for i in range(len(ordered) - size + 1):
            window = ordered[i:i + size]
            if not all(b.has_next_segment() and not b.merging for b in window):
                continue
            key = (sum(b.pending_indexes for b in window), min(b.next_segment_min_ts() for b in window), i)
            if best is None or key < best:
                best = key
        if best is not None:
            return ordered[best[2]:best[2] + size]
    return None


def live_rows(buckets: Sequence[SealedBucket], index: DelayedIndexSet
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every still-live index of the buckets' files, sorted by (timestamp, ledger, entry).

    All segments are read, loaded ones included: a segment in memory may still
    hold undelivered indexes, and after the merge only the new file holds them.
    """
    parts_t, parts_l, parts_e = [], [], []
    for bucket in buckets:
        for number in range(1, bucket.segment_count + 1):
            run = bucket.read_segment(number)
            keep = index.present_mask(run.ledgers, run.entries, run.ts)
            if keep.any():
                parts_t.append(run.ts[keep])
                parts_l.append(run.ledgers[keep])
                parts_e.append(run.entries[keep])
    if not parts_t:
        empty = np.zeros(0, dtype=np.uint64)
        return empty, empty, empty
    return drop_repeats(*sort_rows(np.concatenate(parts_t), np.concatenate(parts_l), np.concatenate(parts_e)))
