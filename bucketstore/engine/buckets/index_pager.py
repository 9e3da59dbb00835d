"""Paging sealed buckets' membership out of the tracker-wide index, and back in.

The tracker-wide index (:mod:`~bucketstore.engine.queue.index_set`) keeps one roaring
bitmap per ledger, about 500 bytes for a sparse ledger of a hundred positions.
Buckets recovered at open stay out of it until needed (lazy open, and
:mod:`~bucketstore.engine.buckets.sealed_membership` for questions); but a bucket this
process sealed or merged, or one that delivery, an add or a trim opened, would
keep its bitmaps there for good, so a long-running broker's memory would follow
its backlog's ledgers.

A *sweep* pages out every sealed bucket that delivery does not need now: its
ledgers' bitmaps leave the index for the membership spill (the same anonymous
file and per-ledger layout as an unopened bucket's, with a directory of 4 to 8
bytes a ledger in memory, *pinned*: it is the only copy, so never dropped under
the directory budget), and the bucket counts as unopened again, holding
:attr:`~bucketstore.engine.buckets.sealed_bucket.SealedBucket.paged` positions. What is
written is the index's own state for the bucket's ledgers — deliveries, trims,
expiries and re-adds since the file was sealed all applied — so nothing has to be
replayed when it comes back. Ghosts and live times of re-added positions stay
resident (few, and read without the bitmaps).

The answers stay exact because every operation that could change a paged-out
bucket's positions, or needs them as bitmaps, goes through the tracker's existing
"open the covering bucket first" path, which for a paged-out bucket *pages it
in* (one ``pread`` of its region, one bitmap per ledger): an add, expiry or
journal replay on its ledgers, a trim that cuts through it, a merge that takes
it, and the queue reaching its next segment. ``contains_message`` answers from the
spill without paging in; ``number_of_delayed_messages`` counts the paged-out
positions from the bucket. So a bucket is pageable only if no row the index must
judge is in memory: its loaded segment, if any, is untouched (it goes back to
disk, to be read again when due) and no run outside a bucket (direct adds to
covered ledgers, buffered or queued; rows due at a seal) holds rows of its ledgers.

A sweep walks the index's ledgers once, so it runs only when the index holds
more than the tracker's budget (``TrackerConfig.max_resident_ledgers``) and
:data:`GROWTH` times as many ledgers as the last sweep left (what is being
delivered cannot go): its cost is shared by the ledgers it found. It runs
after a seal's or merge's install and after a delivery call.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np
from pyroaring import BitMap

from ..queue.index_set import bitmap_of
from ..queue.shared_queue import Run, Slot
from .sealed_bucket import SealedBucket

__all__ = ["IndexPager"]

#: A sweep also needs more than this many times the ledgers the last sweep left. Read at each
#: check, so tests may set 0 (with a budget of 0: sweep at every chance).
GROWTH = 2


class IndexPager:
    """When and what to page out of a tracker's index; counters for ``stats()``.

    Not thread-safe by itself: called under the owning tracker's lock.
    """

    __slots__ = ("budget", "floor", "sweeps", "paged_out", "paged_in", "_refused")

    def __init__(self, budget: int) -> None:
        #: Ledgers the index may hold before a sweep (``TrackerConfig.max_resident_ledgers``).
        self.budget = budget
        #: Ledgers left in the index by the last sweep (what it could not page out).
        self.floor = 0
        self.sweeps = self.paged_out = self.paged_in = 0
        # Buckets whose every ledger is a few runs (dense): as small in the index, never retried.
        self._refused: set[int] = set()

    def as_dict(self) -> dict[str, int]:
        return {"sweeps": self.sweeps, "paged_out": self.paged_out, "paged_in": self.paged_in}

    def maybe_sweep(self, tracker: Any) -> None:
        """Sweep if the index has grown past the budget and :data:`GROWTH` times the last floor."""
        if tracker._read_only or tracker._replaying or tracker._closed:
            return
        if tracker._index.ledger_count() > max(self.budget, GROWTH * self.floor):
            self.sweep(tracker)

    def sweep(self, tracker: Any) -> int:
        """Page out every sealed bucket delivery does not need now; return how many went."""
        self.sweeps += 1
        index, queue = tracker._index, tracker._queue
        # Which rows are in memory: the queue's runs (folding its frontier back first).
        owned: dict[int, list[Run]] = {}
        loose: list[tuple[int, int]] = []
        for item in queue.items():
            if not isinstance(item, Run) or item.dead or not item.remaining:
                continue
            if item.owner is None:
                ledgers = item.rest()[1]
                loose.append((int(ledgers.min()), int(ledgers.max())))
            else:
                owned.setdefault(id(item.owner), []).append(item)
        direct = tracker._direct.ledgers  # adds to covered ledgers, buffered until the queue syncs
        if direct:
            loose.append((min(direct), max(direct)))
        starts, ends = _merged(loose)
        ids = index.ledger_ids()
        buckets = tracker._buckets.values()
        if self._refused:
            self._refused &= {b.ledger_id for b in buckets}  # (deleted ones need no memory)
        done = 0
        for bucket in buckets:
            if not bucket.opened or bucket.dead or bucket.merging or bucket.ledger_id in self._refused:
                continue
            if bucket.head is not None and bucket.current == 0:
                # Its prefix (the catalog summary's first rows, see bucket_prefix) is queued as a
                # run outside its file's segments, or was delivered from it and segment 1's load
                # must still leave those rows out: delivery needs the bitmaps until that load.
                continue
            runs = owned.get(id(bucket), [])
            if len(runs) > 1 or (runs and not _untouched(bucket, runs[0])):
                continue  # being delivered: the frontier needs its bitmaps
            i = bisect_right(starts, bucket.end_ledger) - 1
            if i >= 0 and ends[i] >= bucket.start_ledger:
                continue  # rows of its ledgers outside the bucket are in memory
            lo = int(np.searchsorted(ids, np.uint64(bucket.start_ledger), side="left"))
            hi = int(np.searchsorted(ids, np.uint64(bucket.end_ledger), side="right"))
            if lo == hi:
                continue  # nothing of it is tracked: nothing to page
            if self._page_out(tracker, bucket, ids[lo:hi].tolist(), runs):
                done += 1
        self.floor = index.ledger_count()
        return done

    def _page_out(self, tracker: Any, bucket: SealedBucket, ledgers: list[int], runs: list[Run]) -> bool:
        index, membership = tracker._index, tracker._membership
        taken = index.take_ledgers(ledgers)
        failures = membership.failures
        if not membership.add(bucket.ledger_id, bucket.start_ledger, taken, pinned=True):
            for ledger, bm in taken.items():
                index.add_bitmap(ledger, bm)  # back as it was
            if membership.failures == failures:
                self._refused.add(bucket.ledger_id)  # dense: the spill refused it, not the disk
            return False
        if runs:
            # Its loaded segment is untouched: back to disk, read again when the queue reaches it.
            runs[0].kill()
            bucket.current -= 1
            tracker._read_ahead.forget(bucket)
            tracker._queue.drop_dead()
            tracker._queue.push(Slot(bucket))
        count = sum(len(bm) for bm in taken.values())
        bucket.paged = count
        tracker._unopened += 1
        tracker._unopened_rows += count
        self.paged_out += 1
        return True

    def page_in(self, tracker: Any, bucket: SealedBucket) -> None:
        """Put a paged-out bucket's positions back in the index (one read of its spilled region).
        Raises OSError if the spill cannot be read; then nothing changes."""
        positions = tracker._membership.positions(bucket.ledger_id)
        index = tracker._index
        for ledger, ids in positions.items():
            index.add_bitmap(ledger, ids if isinstance(ids, BitMap) else bitmap_of(ids))
        tracker._forget_unopened(bucket)
        bucket.paged = None
        self.paged_in += 1

    @staticmethod
    def check(tracker: Any) -> None:
        """Assert that no paged-out bucket's ledger is in the index (tests)."""
        ids = tracker._index.ledger_ids()
        for b in tracker._buckets.values():
            if b.paged is not None:
                lo = int(np.searchsorted(ids, np.uint64(b.start_ledger), side="left"))
                assert lo == len(ids) or int(ids[lo]) > b.end_ledger, f"{b!r} is paged out but in the index"


def _untouched(bucket: SealedBucket, run: Run) -> bool:
    """Whether ``run`` is exactly the bucket's current loaded segment, not a row of it read yet
    (segment 1 loaded past a prefix is shorter than its count: it stays). The caller has left
    out a bucket with no segment loaded (``current`` 0), whose run can only be its prefix."""
    return run.pos == 0 and len(run.ts) == int(bucket.counts[bucket.current - 1])


def _merged(ranges: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Ledger ranges merged into sorted disjoint ones (their starts, their ends)."""
    starts: list[int] = []
    ends: list[int] = []
    for lo, hi in sorted(ranges):
        if ends and lo <= ends[-1]:
            ends[-1] = max(ends[-1], hi)
        else:
            starts.append(lo)
            ends.append(hi)
    return starts, ends
