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

Delivery does not visit the runs at every call. It gathers a *frontier*: every
queued row whose timestamp is at or before a limit (the cutoff, or lower so that
about :data:`FRONTIER_ROWS` rows qualify), merged across runs in one sort, with
its liveness checked in one bitmap operation per ledger. Many calls then consume
it by slicing, handing the positions they deliver to the index in bulk
(:meth:`~bucketstore.engine.queue.index_set.DelayedIndexSet.deliver`), so a call's
cost follows its batch, not the number of buckets. While a frontier exists,
every queued row outside it sorts after it; anything that could break that — a
run or slot pushed at or before the limit (a seal's or merge's install, an
earlier add), a run of it killed — folds it back into the queue first.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import numpy as np

from ...errors import BucketStoreError
from .index_set import DelayedIndexSet
from .queue_runs import Run, RunBuffer, SegmentSource, Slot, sorted_run

# The queue's items are defined in queue_runs and imported from here too.
__all__ = ["Run", "RunBuffer", "Slot", "SharedQueue", "SegmentSource", "sorted_run"]

_U64 = np.dtype("<u8")
_EMPTY = np.zeros(0, dtype=_U64)
_TS_MAX = (1 << 64) - 1


class SharedQueue:
    """The min-queue of run heads and segment slots from which due indexes are delivered.

    :param on_bucket_exhausted: called with a sealed bucket whose last segment
        has been read to the end (the tracker deletes it).
    :param load: reads a sealed bucket's next segment (default: ``load_next_segment``;
        the tracker's read-ahead hands over a segment read off the lock instead).
    :param on_low: called with a sealed bucket whose loaded run is low — at most
        ``low_fraction`` of it left unread, or read to its end with a segment still on
        disk — so its next segment can be read ahead.
    :param on_opening: called with the unopened buckets a frontier is about to open one after
        the other, so their entry 0 can be read ahead while the first ones are read.
    """

    def __init__(self, on_bucket_exhausted: Callable[[SegmentSource], None],
                 load: Callable[[SegmentSource], Run] | None = None,
                 on_low: Callable[[SegmentSource], None] | None = None, low_fraction: float = 0.5,
                 on_opening: Callable[[list[SegmentSource]], None] | None = None) -> None:
        self._heap: list[tuple[int, int, int, int, Run | Slot]] = []
        self._seq = itertools.count()
        self._on_exhausted = on_bucket_exhausted
        self._load: Callable[[SegmentSource], Run] = load or (lambda bucket: bucket.load_next_segment())
        self._on_low = on_low
        self._on_opening = on_opening
        self._low_fraction = low_fraction
        self._frontier: _Frontier | None = None
        # Frontiers start small and double up to their full size: the first batch after an
        # open (a restart) merges only what it needs, a steady drain soon builds full ones.
        self._grown = FRONTIER_FIRST_ROWS

    def __len__(self) -> int:
        return len(self._heap) + (len(self._frontier.runs) if self._frontier is not None else 0)

    def push(self, item: Run | Slot) -> None:
        """Add a run (non-empty) or a slot to the queue."""
        if isinstance(item, Slot):
            key = (item.bucket.next_segment_min_ts(), 0, 0)
        else:
            key = item.head()
        f = self._frontier
        if f is not None and key[0] <= f.limit:
            # It may hold rows that sort before some of the frontier's: the frontier keeps
            # only its rows before the new item's head (a prefix of each of its runs, so their
            # read positions stay right), or is folded back if it has read past that point.
            cut = int(np.searchsorted(f.ts, np.uint64(key[0]), side="left"))
            if cut > f.off:
                f.truncate(cut, key[0] - 1)
            else:
                self._fold()
        heapq.heappush(self._heap, (*key, next(self._seq), item))

    def clear(self) -> None:
        self._heap.clear()
        self._frontier = None

    def drop_dead(self) -> None:
        """Remove entries of dead runs and slots now, rather than when they reach the front:
        a replaced run whose head is an hour away would otherwise hold its rows for an hour.
        A frontier holding rows of a dead run is folded back first: they must not deliver."""
        f = self._frontier
        if f is not None and any(run.dead for run in f.runs):
            self._fold()
        live = [entry for entry in self._heap if not entry[-1].dead]
        if len(live) != len(self._heap):
            heapq.heapify(live)
            self._heap = live

    def first_unopened(self, k: int) -> list[SegmentSource]:
        """The live unopened buckets among the ``k`` earliest entries' (slots, and runs of a
        summary's prefix): what opening buckets ahead looks at."""
        out = []
        for e in heapq.nsmallest(k, self._heap):
            item = e[-1]
            bucket = item.bucket if isinstance(item, Slot) else item.owner
            if bucket is not None and not item.dead and not bucket.opened:
                out.append(bucket)
        return out

    def items(self) -> list[Run | Slot]:
        """Every run and slot (a frontier is folded back first, so runs' positions are current)."""
        self._fold()
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
                try:
                    item = self._load(item.bucket)
                except BaseException:
                    # Damage or an I/O error: put back what was popped (the slot too, to be
                    # read again next time), so nothing tracked drops out of the queue.
                    for popped in (*due, item):
                        self.push(popped)
                    raise
            due.append(item)
        return due

    # -- the frontier ---------------------------------------------------------------------------
    def _fold(self) -> None:
        """Hand the frontier's runs back to the queue, each advanced past its consumed rows."""
        f = self._frontier
        if f is None:
            return
        self._frontier = None  # first: the pushes below must not fold again
        consumed = np.bincount(f.src[:f.off], minlength=len(f.runs))
        if f.applied is not None:
            consumed -= f.applied
        consumed = consumed.tolist()
        for run, k in zip(f.runs, consumed):
            if run.dead:
                continue
            run.pos += k
            if run.remaining:
                self.push(run)
                self._check_low(run)
            else:
                self._retire(run)

    def _build(self, cutoff: int, need: int, index: DelayedIndexSet) -> bool:
        """Gather a frontier: every queued row whose timestamp is at or before a limit,
        merged in index order. False when nothing is due.

        The limit looks ahead of the cutoff (up to :data:`FRONTIER_AHEAD_MS`), lowered so that
        about :data:`FRONTIER_ROWS` rows qualify: the smallest timestamp among the runs'
        ``cap``-th rows. Calls under a clock that moves slowly then take their batch by
        slicing the rows due by then, and the frontier is rebuilt once per horizon, not at
        every call. Items of the queue that start at or before the limit join it (a slot
        is read then), so every queued row outside the frontier still sorts after it."""
        runs = self._pop_due_items(cutoff)
        if not runs:
            return False
        rows = max(FRONTIER_ROWS, min(FRONTIER_ROWS_MAX, FRONTIER_ROWS_PER_RUN * len(runs)))
        rows = max(min(rows, self._grown), FRONTIER_CALLS * need)
        self._grown = min(2 * self._grown, FRONTIER_ROWS_MAX)
        cap = max(FRONTIER_MIN_CAP, -(-rows // len(runs)))
        limit = max(cutoff, min(cutoff + FRONTIER_AHEAD_MS, _TS_MAX))
        # A run of a bucket not opened yet is its catalog summary's prefix: the rest of the bucket
        # waits, due or not, unless the batch needs it (see _lengthen; the first batch after a
        # restart reads no file it does not need). Not when the due runs hold too few rows for
        # the batch anyway (few buckets): opening them at once saves rebuilds.
        waiting: list[Run] | None = [] if sum(run.remaining for run in runs) >= 2 * need else None
        seen = 0
        while True:
            for run in runs[seen:]:
                limit = self._lengthen(run, cap, limit, cutoff, waiting)
            seen = len(runs)
            limit = self._pop_ahead(limit, runs)
            if len(runs) == seen:
                break
        if waiting:
            waiting = sorted((r for r in waiting if r.owner.next_segment_min_ts() <= limit),
                             key=lambda r: r.owner.next_segment_min_ts())
        if waiting:
            # The prefixes alone serve the batch if rows enough come before the first of the
            # waiting rests; else the earliest few waiting buckets are opened now, the rest wait.
            first = waiting[0].owner.next_segment_min_ts()
            opens = 0 if sum(r.due_count(min(limit, first - 1)) for r in runs) >= need \
                else max(FRONTIER_OPENS, len(waiting) // 2)
            if opens and self._on_opening is not None:
                self._on_opening([run.owner for run in waiting[:opens]])
            for run in waiting[:opens]:
                limit = self._lengthen(run, cap, limit, cutoff, None)
            if len(waiting) > opens:
                limit = min(limit, waiting[opens].owner.next_segment_min_ts() - 1)
        # Every row at or before the limit goes in, also one at the limit in a next segment
        # (a failed read lowers the limit: then look again).
        settled = False
        while not settled:
            settled = True
            for run in runs:
                owner = run.owner
                while (owner is not None and not owner.dead and int(run.ts[-1]) <= limit
                       and owner.has_next_segment() and owner.next_segment_min_ts() <= limit):
                    if not self._extend(run):
                        limit = owner.next_segment_min_ts() - 1
                        settled = False
                        break
        members: list[Run] = []
        counts: list[int] = []
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for run in runs:
            owner = run.owner
            k = run.due_count(limit)
            if not k:
                self.push(run)  # its head is after the limit (no frontier yet: nothing to fold)
                continue
            ts, ledgers, entries = run.rest()
            parts.append((ts[:k], ledgers[:k], entries[:k]))
            members.append(run)
            counts.append(k)
            if k == run.remaining and self._on_low is not None and owner is not None and not owner.dead \
                    and owner.has_next_segment():
                self._on_low(owner)  # all it has loaded is in the frontier: the next build needs more
        if not members:
            return False
        if len(parts) == 1:
            ts, ledgers, entries = parts[0]
            src = np.zeros(len(ts), dtype=np.int64)
        else:
            ts, ledgers, entries, src = _merge(parts, counts)
        # Liveness in bulk: one bitmap operation per run when each run is one ledger of its own
        # (sealed buckets of one ledger, the usual store), else one sort by position.
        if index.all_claimable(parts):
            live = np.ones(len(ts), dtype=bool)
        else:
            live = index.claimable_mask(ledgers, entries, ts)
        index.changes()  # liveness is current as of now: only later changes matter
        self._frontier = _Frontier(ts, ledgers, entries, src, members, live, limit)
        return True

    def _lengthen(self, run: Run, cap: int, limit: int, cutoff: int, waiting: list[Run] | None) -> int:
        """Extend a short run with its bucket's next segments that start within the limit; return
        the limit, lowered where a segment is not read now and by the run's ``cap``-th row.

        A segment that is due, or already read ahead, joins the run now; one not due is not read
        under the lock ahead of need: the limit stops before it. So, when ``waiting`` is given,
        may the rest of a bucket not opened yet (its run is its summary's prefix): the run goes
        to ``waiting`` and the caller decides (open it now, or stop the limit before it)."""
        owner = run.owner
        while (run.remaining <= cap and owner is not None and not owner.dead
               and owner.has_next_segment() and owner.next_segment_min_ts() <= limit):
            nxt = owner.next_segment_min_ts()
            if nxt > cutoff and not owner.next_segment_ready():
                return nxt - 1
            if waiting is not None and not owner.opened:
                waiting.append(run)
                return limit
            if not self._extend(run):
                return min(limit, nxt - 1)
        if run.remaining > cap:
            # Its cap-th row bounds the limit (a scalar read, not a search per run).
            limit = min(limit, int(run.ts[run.pos + cap - 1]))
        return limit

    def _pop_ahead(self, limit: int, runs: list[Run]) -> int:
        """Move the queue's live items that start at or before ``limit`` (not due yet: the
        frontier looks ahead) into ``runs``; return the limit. A slot is read only if the
        read-ahead has its segment already: else the limit stops before it, so that no bucket
        is opened and no segment read under the lock before it is due (the first batch
        after a restart opens only the buckets it needs). A read that fails lowers the limit
        too (the error is raised when the slot is due and read again)."""
        heap = self._heap
        while heap and heap[0][0] <= limit:
            item = heap[0][-1]
            if item.dead:
                heapq.heappop(heap)
                continue
            if isinstance(item, Slot):
                if not item.bucket.next_segment_ready():
                    return min(limit, heap[0][0] - 1)
                heapq.heappop(heap)
                try:
                    item = self._load(item.bucket)
                except (BucketStoreError, OSError):
                    self.push(item)
                    return min(limit, item.bucket.next_segment_min_ts() - 1)
            else:
                heapq.heappop(heap)
            runs.append(item)
        return limit

    def _extend(self, run: Run) -> bool:
        """Append its bucket's next segment to a run, read ahead of need; False if the read
        failed. The frontier then stops before that segment: the rows before it are
        delivered, and the segment is read again when the queue reaches it, which raises
        the error (typed, naming the file) at the same point as reading it only then."""
        try:
            run.extend(self._load(run.owner))
        except (BucketStoreError, OSError):
            return False
        return True

    def _refresh(self, f: "_Frontier", index: DelayedIndexSet) -> None:
        """Check again the liveness of the frontier's unread rows of ledgers changed since
        (an add, a delete, an expiry, a trim between calls)."""
        dirty = index.changes()
        if dirty is not None and not dirty:
            return
        off = f.off
        if dirty is None:
            rows = np.arange(off, len(f.ts))
        else:
            changed = np.fromiter(dirty, dtype=_U64, count=len(dirty))
            rows = np.flatnonzero(np.isin(f.ledgers[off:], changed)) + off
        if len(rows):
            f.live[rows] = index.claimable_mask(f.ledgers[rows], f.entries[rows], f.ts[rows])

    def next_timestamp(self, index: DelayedIndexSet) -> int | None:
        """The timestamp of the first tracked index in the queue, or None.

        Rows that are no longer tracked (delivered through a duplicate, untracked
        by an expired re-add, trimmed) are dropped from the front on the way, and
        a slot at the front is read, so the answer is exact.
        """
        f = self._frontier
        if f is not None:
            # Every queued row outside the frontier sorts after its rows.
            self._refresh(f, index)
            rest = f.live[f.off:]
            first = int(np.argmax(rest)) if len(rest) else 0
            if len(rest) and rest[first]:
                f.consume(f.off + first)  # the rows before it are dead
                return int(f.ts[f.off])
            f.consume(len(f.ts))
            self._fold()
        heap = self._heap
        while heap:
            item = heap[0][-1]
            if item.dead:
                heapq.heappop(heap)
                continue
            if isinstance(item, Slot):
                heapq.heappop(heap)
                try:
                    run = self._load(item.bucket)
                except BaseException:
                    self.push(item)  # a failed read keeps the bucket queued: the next call reads it again
                    raise
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

    def pop_due(self, cutoff: int, max_items: int, index: DelayedIndexSet
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int, int] | None]:
        """Deliver up to ``max_items`` due indexes in index order.

        Rows come from the frontier (built when there is none, and consumed by
        many calls); each delivered position is handed to ``index.deliver``, which
        untracks it. Rows that are not live are skipped, so nothing is delivered
        twice and stale rows never count against ``max_items``. Sealed buckets'
        next segments are read as soon as they may hold rows of the frontier, so
        the call never comes back short while something due is left.

        :return: the delivered rows as (ts, ledgers, entries) columns in index order,
            one row per position, at its live time; and the largest (timestamp,
            ledger, entry) key taken from the queue (every live index at or before it
            has now been delivered), or None.
        """
        out: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        last_key: tuple[int, int, int] | None = None
        need = max_items
        while need > 0:
            f = self._frontier
            if f is None:
                try:
                    if not self._build(cutoff, need, index):
                        break
                except (BucketStoreError, OSError):
                    if out:
                        # Rows were taken already (from a bucket's prefix, say): they are returned,
                        # and the read that failed, queued again, raises at the next call.
                        break
                    raise
                f = self._frontier
                assert f is not None
            else:
                self._refresh(f, index)
            # The frontier may reach past the cutoff: only its rows due by now are taken.
            if f.limit <= cutoff:
                due = len(f.ts)
            elif cutoff < 0:
                due = f.off
            else:
                due = f.off + int(np.searchsorted(f.ts[f.off:], np.uint64(cutoff), side="right"))
            end, rows = _claim(f.live[:due], f.off, need)
            if end > f.off:
                last_key = (int(f.ts[end - 1]), int(f.ledgers[end - 1]), int(f.entries[end - 1]))
            f.consume(end)
            if len(rows):
                cols = f.ts[rows], f.ledgers[rows], f.entries[rows]
                index.deliver(cols[1], cols[2])
                out.append(cols)
                need -= len(rows)
            if f.off >= len(f.ts):
                self._fold()
            elif f.off >= due:
                break  # nothing else is due: every row outside the frontier sorts after its limit
        if not out:
            return _EMPTY, _EMPTY, _EMPTY, last_key
        if len(out) == 1:
            return (*out[0], last_key)
        ts, ledgers, entries = (np.concatenate(cols) for cols in zip(*out))
        return ts, ledgers, entries, last_key


#: How many rows a frontier gathers, about: ``FRONTIER_ROWS_PER_RUN`` per due run, within
#: [``FRONTIER_ROWS``, ``FRONTIER_ROWS_MAX``] (and at least four calls' worth). Its build
#: costs a few operations per run and per ledger, shared by every call it serves, so it
#: grows with the runs; the cap bounds its memory (~33 bytes a row, 2000 runs with
#: 5,000-row segments loaded hold 240 MB already) and the call that builds it (~0.2 s).
FRONTIER_ROWS = 1 << 18
#: How far past the cutoff a frontier may look (ms): far enough that a clock moving a few
#: milliseconds per call rebuilds it rarely, near enough that a sealed bucket's segment is
#: not read long before it is due.
FRONTIER_AHEAD_MS = 60_000
FRONTIER_ROWS_PER_RUN = 1024
FRONTIER_ROWS_MAX = 1 << 20
#: The first frontier's rows (then twice as many at each build, up to the above).
FRONTIER_FIRST_ROWS = 1 << 14
FRONTIER_CALLS = 4
#: No run's share is cut below this many rows (tests lower all five to exercise small frontiers).
FRONTIER_MIN_CAP = 16
#: Buckets not opened yet whose rest is due that one build opens (at least; half of those
#: waiting when more) when their prefixes (what the catalog keeps of them) do not serve the
#: batch: the others wait for later builds, so no call opens every overlapping bucket at once.
#: Each build visits every due run, so opening a few per build costs the catch-up drain many
#: builds (a fixed 64 halved its rate at 100 M, 2,000 buckets; tools/bench/bench_drain_scale.py).
FRONTIER_OPENS = 64


class _Frontier:
    """Every queued row at or before ``limit`` when it was built, merged in index order.

    ``src`` names each row's run in ``runs``; the runs are out of the heap while the
    frontier exists and their read positions are advanced only when it is folded
    back (:meth:`SharedQueue._fold`), so a call costs nothing per run. ``live`` says
    which rows would deliver their position (kept current by ``_refresh``); ``off``
    is the first unread row.
    """

    __slots__ = ("ts", "ledgers", "entries", "src", "runs", "live", "limit", "off", "plain", "applied")

    def __init__(self, ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, src: np.ndarray,
                 runs: list[Run], live: np.ndarray, limit: int) -> None:
        self.ts, self.ledgers, self.entries, self.src = ts, ledgers, entries, src
        self.runs = runs
        self.live = live
        self.limit = limit
        self.off = 0
        # Runs of no sealed bucket (the mutable bucket's, direct adds) are read by their owner
        # too, while the frontier holds them (a compaction, a seal's freeze): their read
        # positions are kept current at every call, else a compaction would copy rows
        # delivered already (and bring a delivered, re-added position back at its old time).
        self.plain = [i for i, run in enumerate(runs) if run.owner is None]
        self.applied = np.zeros(len(runs), dtype=np.int64) if self.plain else None

    def consume(self, end: int) -> None:
        """Move the first unread row to ``end``, advancing the plain runs' read positions."""
        if self.applied is not None and end > self.off:
            counts = np.bincount(self.src[self.off:end], minlength=len(self.runs))
            for i in self.plain:
                k = int(counts[i])
                run = self.runs[i]
                if k and not run.dead:  # (a killed run has let go of its rows: pos stays 0)
                    run.pos += k
                    self.applied[i] += k
        self.off = end

    def truncate(self, end: int, limit: int) -> None:
        """Keep only the rows before ``end`` (all at or before ``limit``); the rest stay in
        their runs, whose read positions move only by what was consumed."""
        self.ts, self.ledgers, self.entries = self.ts[:end], self.ledgers[:end], self.entries[:end]
        self.src, self.live = self.src[:end], self.live[:end]
        self.limit = limit


def _claim(live: np.ndarray, off: int, need: int) -> tuple[int, np.ndarray]:
    """The end of the shortest span from ``off`` holding ``need`` live rows (or the end of
    ``live``), and the live rows in it. Looks at about ``need`` rows when most are live."""
    n = len(live)
    span = need
    while True:
        end = min(n, off + span)
        rows = np.flatnonzero(live[off:end])
        if len(rows) >= need:
            return off + int(rows[need - 1]) + 1, rows[:need] + off
        if end == n:
            return n, rows + off
        span *= 2


def _merge(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], counts: list[int]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge sorted runs' rows into (timestamp, ledger, entry) order; also return each row's run.

    The offsets of the three columns from their minimums and the run number usually fit
    in one 64-bit key together (a frontier spans seconds of timestamps, hundreds of ledgers,
    entry ids below millions): then one in-place sort of the keys orders everything and
    the columns come back out of the keys with shifts, with no gather. Else a lexsort.
    (Equal rows of two runs may come out in either order: they are the same row.)
    """
    ts, ledgers, entries = (np.concatenate(cols) for cols in zip(*parts))
    src = np.repeat(np.arange(len(parts), dtype=np.int64), counts)
    t0, l0, e0 = int(ts.min()), int(ledgers.min()), int(entries.min())
    tb = (int(ts.max()) - t0).bit_length()
    lb = (int(ledgers.max()) - l0).bit_length()
    eb = (int(entries.max()) - e0).bit_length()
    sb = (len(parts) - 1).bit_length()
    if max(tb, 1) + lb + eb + sb > 64:
        order = np.lexsort((entries, ledgers, ts))
        return ts[order], ledgers[order], entries[order], src[order]
    key = ts - np.uint64(t0)
    key <<= np.uint64(lb + eb + sb)
    if lb:
        key |= (ledgers - np.uint64(l0)) << np.uint64(eb + sb)
    if eb:
        key |= (entries - np.uint64(e0)) << np.uint64(sb)
    if sb:
        key |= src.astype(_U64)
    key.sort()
    src = (key & np.uint64((1 << sb) - 1)).astype(np.int64) if sb else np.zeros(len(key), dtype=np.int64)
    key >>= np.uint64(sb)
    entries = (key & np.uint64((1 << eb) - 1)) + np.uint64(e0)
    key >>= np.uint64(eb)
    ledgers = (key & np.uint64((1 << lb) - 1)) + np.uint64(l0)
    key >>= np.uint64(lb)
    key += np.uint64(t0)
    return key, ledgers, entries, src


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
