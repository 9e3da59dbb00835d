"""The shared queue: one priority queue of *sorted runs*, not of indexes.

Pulsar's shared queue holds one heap entry per loaded index. Here each heap
entry is the head of a sorted run of indexes — a loaded segment of a sealed
bucket, a sorted batch of the mutable bucket, or a batch of indexes that went
straight to the queue — or a *slot*: a sealed bucket's next segment, not yet
read, keyed by the segment's minimum timestamp from entry 0. A slot is read
from disk only when it reaches the front of the queue, so loading never hangs
on one sentinel index (PIP-195 §6 guarantee 3) and memory holds only what is
about to be delivered.

Runs are three numpy uint64 columns with a read position; Python tuples are
made only for the positions actually delivered, in one batch per call.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..format.row_sort import sort_rows
from .index_set import DelayedIndexSet, _group_by_ledger

__all__ = ["Run", "RunBuffer", "Slot", "SharedQueue", "SegmentSource"]

_U64 = np.dtype("<u8")
_EMPTY = np.zeros(0, dtype=_U64)


class SegmentSource(Protocol):
    """What the queue needs from a sealed bucket to load its segments lazily."""

    dead: bool

    def has_next_segment(self) -> bool: ...

    def next_segment_min_ts(self) -> int: ...

    def load_next_segment(self) -> "Run": ...


class Run:
    """A sorted run of indexes with a read position.

    :ivar owner: the sealed bucket whose segment this is, or None.
    A run is *dead* once it is replaced (the mutable bucket was sealed or
    compacted) or its bucket is gone (deleted, merged away); the queue drops
    dead runs when it meets them.
    """

    __slots__ = ("ts", "ledgers", "entries", "pos", "owner", "_killed")

    def __init__(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray,
                 owner: SegmentSource | None = None) -> None:
        self.ts = ts
        self.ledgers = ledgers
        self.entries = entries
        self.pos = 0
        self.owner = owner
        self._killed = False

    @property
    def dead(self) -> bool:
        return self._killed or (self.owner is not None and self.owner.dead)

    def kill(self) -> None:
        """Mark the run replaced and let go of its rows (the queue drops the entry later)."""
        self._killed = True
        self.ts = self.ledgers = self.entries = _EMPTY
        self.pos = 0

    @property
    def remaining(self) -> int:
        return len(self.ts) - self.pos

    def head(self) -> tuple[int, int, int]:
        p = self.pos
        return int(self.ts[p]), int(self.ledgers[p]), int(self.entries[p])

    def due_count(self, cutoff: int) -> int:
        """How many unread rows have a timestamp at or before ``cutoff``."""
        if cutoff < 0:
            return 0
        return int(np.searchsorted(self.ts[self.pos:], np.uint64(cutoff), side="right"))

    def rest(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The unread rows (views)."""
        p = self.pos
        return self.ts[p:], self.ledgers[p:], self.entries[p:]

    def extend(self, other: "Run") -> None:
        """Append a run whose rows all sort after this one's (the bucket's next segment)."""
        p = self.pos
        self.ts = np.concatenate((self.ts[p:], other.ts))
        self.ledgers = np.concatenate((self.ledgers[p:], other.ledgers))
        self.entries = np.concatenate((self.entries[p:], other.entries))
        self.pos = 0


class Slot:
    """A sealed bucket's next segment, not yet read from its ledger file."""

    __slots__ = ("bucket",)

    def __init__(self, bucket: SegmentSource) -> None:
        self.bucket = bucket

    @property
    def dead(self) -> bool:
        return self.bucket.dead


class RunBuffer:
    """An append buffer that turns into sorted runs.

    Single adds go to three Python lists (the cheapest per-call append);
    :meth:`flush` sorts them once into a :class:`Run`.
    """

    __slots__ = ("ts", "ledgers", "entries")

    def __init__(self) -> None:
        self.ts: list[int] = []
        self.ledgers: list[int] = []
        self.entries: list[int] = []

    def __len__(self) -> int:
        return len(self.ts)

    def append(self, ts: int, ledger_id: int, entry_id: int) -> None:
        self.ts.append(ts)
        self.ledgers.append(ledger_id)
        self.entries.append(entry_id)

    def flush(self) -> Run | None:
        if not self.ts:
            return None
        run = sorted_run(np.array(self.ts, dtype=_U64), np.array(self.ledgers, dtype=_U64),
                         np.array(self.entries, dtype=_U64))
        self.ts, self.ledgers, self.entries = [], [], []
        return run


def sorted_run(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, owner: SegmentSource | None = None) -> Run:
    """A :class:`Run` of the given columns, sorted by (timestamp, ledger, entry)."""
    if len(ts) > 1:
        ts, ledgers, entries = sort_rows(ts, ledgers, entries)
    return Run(ts, ledgers, entries, owner)


class SharedQueue:
    """The min-queue of run heads and segment slots from which due indexes are delivered.

    :param on_bucket_exhausted: called with a sealed bucket whose last segment
        has been read to the end (the tracker deletes it).
    :param load: reads a sealed bucket's next segment (default: ``load_next_segment``;
        the tracker's read-ahead hands over a segment read off the lock instead).
    :param on_low: called with a sealed bucket whose loaded run is low — at most
        ``low_fraction`` of it left unread, or read to its end with a segment still on
        disk — so its next segment can be read ahead.
    """

    def __init__(self, on_bucket_exhausted: Callable[[SegmentSource], None],
                 load: Callable[[SegmentSource], Run] | None = None,
                 on_low: Callable[[SegmentSource], None] | None = None, low_fraction: float = 0.5) -> None:
        self._heap: list[tuple[int, int, int, int, Run | Slot]] = []
        self._seq = itertools.count()
        self._on_exhausted = on_bucket_exhausted
        self._load: Callable[[SegmentSource], Run] = load or (lambda bucket: bucket.load_next_segment())
        self._on_low = on_low
        self._low_fraction = low_fraction

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, item: Run | Slot) -> None:
        """Add a run (non-empty) or a slot to the queue."""
        if isinstance(item, Slot):
            key = (item.bucket.next_segment_min_ts(), 0, 0)
        else:
            key = item.head()
        heapq.heappush(self._heap, (*key, next(self._seq), item))

    def clear(self) -> None:
        self._heap.clear()

    def drop_dead(self) -> None:
        """Remove entries of dead runs and slots now, rather than when they reach the front:
        a replaced run whose head is an hour away would otherwise hold its rows for an hour."""
        live = [entry for entry in self._heap if not entry[-1].dead]
        if len(live) != len(self._heap):
            heapq.heapify(live)
            self._heap = live

    def first_slots(self, k: int) -> list[Slot]:
        """The live slots among the ``k`` earliest entries (what opening buckets ahead looks at)."""
        return [e[-1] for e in heapq.nsmallest(k, self._heap) if isinstance(e[-1], Slot) and not e[-1].dead]

    def items(self) -> list[Run | Slot]:
        return [entry[-1] for entry in self._heap]

    def loaded_indexes(self) -> int:
        """Rows held in memory by live runs."""
        return sum(item.remaining for item in self.items() if isinstance(item, Run) and not item.dead)

    def _retire(self, run: Run) -> None:
        """A run was read to its end: queue its bucket's next segment, or report the bucket done."""
        owner = run.owner
        if owner is None or owner.dead:
            return
        if owner.has_next_segment():
            self.push(Slot(owner))
            if self._on_low is not None:
                self._on_low(owner)
        else:
            self._on_exhausted(owner)

    def _check_low(self, run: Run) -> None:
        """Tell the read-ahead that a sealed bucket's run is low (it ignores repeats)."""
        owner = run.owner
        if self._on_low is not None and owner is not None and run.remaining <= self._low_fraction * len(run.ts) \
                and not owner.dead and owner.has_next_segment():
            self._on_low(owner)

    def _pop_due_items(self, cutoff: int) -> list[Run]:
        """Pop every live item whose head is due, reading slots into runs."""
        due: list[Run] = []
        heap = self._heap
        while heap and heap[0][0] <= cutoff:
            item = heapq.heappop(heap)[-1]
            if item.dead:
                continue
            if isinstance(item, Slot):
                item = self._load(item.bucket)
            due.append(item)
        return due

    def next_timestamp(self, index: DelayedIndexSet) -> int | None:
        """The timestamp of the first tracked index in the queue, or None.

        Rows that are no longer tracked (delivered through a duplicate, untracked
        by an expired re-add, trimmed) are dropped from the front on the way, and
        a slot at the front is read, so the answer is exact.
        """
        heap = self._heap
        while heap:
            item = heap[0][-1]
            if item.dead:
                heapq.heappop(heap)
                continue
            if isinstance(item, Slot):
                heapq.heappop(heap)
                run = self._load(item.bucket)
                self.push(run)
                continue
            skip = _first_tracked(item, index)
            if skip == 0:
                return int(heap[0][0])
            heapq.heappop(heap)
            item.pos += skip
            if item.remaining:
                self.push(item)
                self._check_low(item)
            else:
                self._retire(item)
        return None

    def pop_due(self, cutoff: int, max_items: int, index: DelayedIndexSet,
                rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
                ) -> tuple[dict[int, list], tuple[int, int, int] | None]:
        """Deliver up to ``max_items`` due indexes in index order.

        Each delivered position is removed from ``index``; rows that are not in
        it are skipped, so nothing is delivered twice and stale rows never count
        against ``max_items``. Sealed buckets' next segments are read as soon as
        they may hold due indexes, so the call never comes back short while
        something due is left.

        :param rows: when given, the delivered rows are appended to it as
            (ts, ledgers, entries) columns, one row per position, at its live time.
        :return: ledger id -> list of bitmaps of delivered entry ids, and the
            largest (timestamp, ledger, entry) key taken from the queue (every
            live index at or before it has now been delivered), or None.
        """
        delivered: dict[int, list] = {}
        last_key: tuple[int, int, int] | None = None
        need = max_items
        while need > 0:
            runs = self._pop_due_items(cutoff)
            if not runs:
                break
            counts = []
            for run in runs:
                owner = run.owner
                due = run.due_count(cutoff)
                # A run whose every row is due may be followed, in its bucket, by a
                # segment that is due too: read it now so the selection below sees
                # every due row that could sort before the ones it picks.
                while (due == run.remaining < need and owner is not None and not owner.dead
                       and owner.has_next_segment() and owner.next_segment_min_ts() <= cutoff):
                    run.extend(self._load(owner))
                    due = run.due_count(cutoff)
                counts.append(min(due, need))
            if len(runs) == 1:
                run, k = runs[0], counts[0]
                ts, ledgers, entries = run.rest()
                sel_t, sel_l, sel_e = ts[:k], ledgers[:k], entries[:k]
                taken = [k]
            else:
                sel_t, sel_l, sel_e, taken = _select_first(runs, counts, need)
            if len(sel_t):
                key = _max_key(sel_t, sel_l, sel_e)
                last_key = key if last_key is None or key > last_key else last_key
            for ledger, at in _group_by_ledger(sel_l, np.arange(len(sel_l))):
                # (Rows of re-added positions at a stale time are not taken: note which first.)
                stale = None if rows is None else index.live_time_mask(ledger, sel_e[at], sel_t[at])
                hits = index.take(ledger, sel_e[at], sel_t[at])
                if hits:
                    delivered.setdefault(ledger, []).append(hits)
                    need -= len(hits)
                    if rows is not None:
                        rows.append(_taken_rows(sel_t, sel_l, sel_e, at, hits, stale))
            for run, k in zip(runs, taken):
                run.pos += k
                if run.remaining:
                    self.push(run)
                    self._check_low(run)
                else:
                    self._retire(run)
        return delivered, last_key


def _taken_rows(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, at: np.ndarray, hits: Any,
                live: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows ``at`` (of one ledger) that delivered ``hits``: one row per position, at its live time."""
    if len(hits) == len(at):  # the common case: every row was delivered, each a distinct position
        return ts[at], ledgers[at], entries[at]
    taken = np.isin(entries[at], np.fromiter(hits, dtype=np.uint64, count=len(hits)))
    if live is not None:
        taken &= live
    at = at[taken]
    at = at[np.unique(entries[at], return_index=True)[1]]  # duplicates of a row: keep one
    return ts[at], ledgers[at], entries[at]


def _max_key(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> tuple[int, int, int]:
    """The largest (timestamp, ledger, entry) among rows (in no particular order)."""
    top = ts.max()
    rows = np.flatnonzero(ts == top)
    if len(rows) > 1:
        rows = rows[np.lexsort((entries[rows], ledgers[rows]))]
    r = rows[-1]
    return int(top), int(ledgers[r]), int(entries[r])


def _select_first(runs: list[Run], counts: list[int], need: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """The first ``need`` rows, in index order, of the candidate prefixes of several runs,
    and how many rows each run gives up (always a prefix of each run).

    Rather than sorting every candidate, find the timestamp ``T`` of the
    ``need``-th smallest candidate with a linear-time partition: every row
    before ``T`` is taken, and only the rows *at* ``T`` are ordered, by
    (ledger, entry), to settle the tie.
    """
    prefixes = [run.rest() for run in runs]
    if sum(counts) <= need:
        taken = counts
    else:
        counts = _narrow([p[0] for p in prefixes], counts, need)
        ts_all = np.concatenate([p[0][:k] for p, k in zip(prefixes, counts)])
        boundary = np.partition(ts_all, need - 1)[need - 1]
        below = [int(np.searchsorted(p[0][:k], boundary, side="left")) for p, k in zip(prefixes, counts)]
        upto = [int(np.searchsorted(p[0][:k], boundary, side="right")) for p, k in zip(prefixes, counts)]
        left = need - sum(below)
        tie_l = np.concatenate([p[1][a:b] for p, a, b in zip(prefixes, below, upto)])
        tie_e = np.concatenate([p[2][a:b] for p, a, b in zip(prefixes, below, upto)])
        tie_src = np.concatenate([np.full(b - a, i, dtype=np.int64) for i, (a, b) in enumerate(zip(below, upto))])
        chosen = tie_src[np.lexsort((tie_e, tie_l))[:left]]
        extra = np.bincount(chosen, minlength=len(runs)).tolist()
        taken = [b + x for b, x in zip(below, extra)]
    ts = np.concatenate([p[0][:k] for p, k in zip(prefixes, taken)])
    ledgers = np.concatenate([p[1][:k] for p, k in zip(prefixes, taken)])
    entries = np.concatenate([p[2][:k] for p, k in zip(prefixes, taken)])
    return ts, ledgers, entries, list(taken)


_SAMPLES_PER_RUN = 32


def _narrow(prefix_ts: list[np.ndarray], counts: list[int], need: int) -> list[int]:
    """Shrink each run's candidate count without losing any of the ``need`` first rows.

    Every ``stride``-th timestamp of a run's candidates is a point with at least
    that many of the run's rows at or before it; the smallest such point at which
    the rows vouched for add up to ``need`` bounds the ``need``-th smallest
    timestamp from above. Rows after it cannot be selected, and with 32 samples
    per run only about one stride per run is kept beyond what is needed, so the
    partition that follows sees about ``need`` rows instead of ``runs * need``.
    """
    samples, weights = [], []
    for ts, k in zip(prefix_ts, counts):
        stride = max(1, k // _SAMPLES_PER_RUN)
        points = ts[stride - 1:k:stride]
        samples.append(points)
        weights.append(np.full(len(points), stride, dtype=np.int64))
    points = np.concatenate(samples)
    order = np.argsort(points, kind="stable")
    vouched = np.cumsum(np.concatenate(weights)[order])
    at = int(np.searchsorted(vouched, need))
    if at >= len(vouched):
        return counts
    bound = points[order[at]]
    return [min(k, int(np.searchsorted(ts[:k], bound, side="right"))) for ts, k in zip(prefix_ts, counts)]


def _first_tracked(run: Run, index: DelayedIndexSet) -> int:
    """How many rows at the front of ``run`` are no longer tracked (checked in chunks)."""
    p = run.pos
    if index.is_live(int(run.ledgers[p]), int(run.entries[p]), int(run.ts[p])):
        return 0
    skipped = 0
    chunk = 64
    while skipped < run.remaining:
        p = run.pos + skipped
        ledgers = run.ledgers[p:p + chunk]
        entries = run.entries[p:p + chunk]
        mask = index.present_mask(ledgers, entries, run.ts[p:p + chunk])
        if mask.any():
            return skipped + int(np.argmax(mask))
        skipped += len(ledgers)
        chunk = min(chunk * 4, 1 << 16)
    return skipped
