"""Merging adjacent sealed buckets (PIP-195 §3.6), done so that nothing is lost or repeated.

Pulsar's merge lost the already-loaded segment of a source bucket (#26251),
deleted sources after a failed create (#26239), and threw for
``maxNumBuckets`` 1..3 (#26241). Here:

* every segment of every source is read, and a row is kept only if it is still
  live in the tracker's index, so delivered indexes are left out and nothing
  undelivered is, whichever segments were loaded (``merge_pipeline`` does it);
* the merged ledger is made durable first, then *one* catalog transaction adds
  its key and removes the sources' keys, and only then are the source files
  unlinked; a failure before the commit removes the new file and leaves the
  sources untouched;
* windows of 4 down to 2 buckets work for any ``max_num_buckets`` >= 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..buckets.sealed_bucket import SealedBucket

__all__ = ["MAX_MERGE_NUM", "choose_merge_window"]

#: Pulsar merges at most this many adjacent buckets at once.
MAX_MERGE_NUM = 4


def choose_merge_window(buckets: Sequence[SealedBucket]) -> list[SealedBucket] | None:
    """Pick adjacent buckets to merge, or None when no window qualifies.

    Buckets are taken in ledger order. A window qualifies when each of its
    buckets still has segments on disk that the queue has not reached (merging
    a bucket whose last segment is in memory would save nothing). Windows of
    :data:`MAX_MERGE_NUM` are tried first, then smaller ones down to 2; among
    qualifying windows of one size the one holding the fewest pending indexes
    wins, ties going to the one whose next segment is due earliest. A bucket holding rows
    skipped at open for the embedder's replay is never merged: the merge keeps only what
    the index tracks, so those rows, which exist nowhere else, would be lost. (Pulsar's
    selector only replaces its pick on a strictly earlier timestamp, which can
    prefer a larger window; this one orders by the two keys plainly.)
    """
    ordered = list(buckets)
    for size in range(min(MAX_MERGE_NUM, len(ordered)), 1, -1):
        best: tuple[int, int, int] | None = None
        for i in range(len(ordered) - size + 1):
            window = ordered[i:i + size]
            if not all(b.has_next_segment() and not b.merging and not b.held_rows for b in window):
                continue
            key = (sum(b.pending_indexes for b in window), min(b.next_segment_min_ts() for b in window), i)
            if best is None or key < best:
                best = key
        if best is not None:
            return ordered[best[2]:best[2] + size]
    return None
