"""The shared queue's delivery frontier, against a plain model.

A frontier gathers the due rows of every run once and is consumed by many calls,
so these tests interleave, between calls, everything that could make a frontier
wrong if it were kept when it should not be: adds of rows earlier than its limit,
deletes and expiries (then re-adds at another time) of positions it holds, runs
killed and replaced by copies (as a seal or merge does), the cutoff moving back
and forth, and batch sizes from 1 up. Frontier sizes are shrunk to a few rows so
that limits below the cutoff, rebuilds and read-past-the-end all happen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import bucketstore
from bucketstore.engine.queue import index_set, shared_queue
from bucketstore.engine.queue.index_set import DelayedIndexSet
from bucketstore.engine.queue.shared_queue import Run, SharedQueue, sorted_run

from helpers import FakeClock, example_count
from test_tracker_differential import CONFIGS, SortedListModel, _run, ops

_U64 = np.uint64


@contextlib.contextmanager
def small_frontiers(rows: int, per_run: int, calls: int, min_cap: int):
    names = ("FRONTIER_ROWS", "FRONTIER_ROWS_PER_RUN", "FRONTIER_ROWS_MAX", "FRONTIER_CALLS", "FRONTIER_MIN_CAP")
    saved = {name: getattr(shared_queue, name) for name in names}
    scan_max = index_set._PENDING_SCAN_MAX
    for name, value in zip(names, (rows, per_run, rows + per_run, calls, min_cap)):
        setattr(shared_queue, name, value)
    index_set._PENDING_SCAN_MAX = rows // 4  # lookups both scan and settle pending removals
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(shared_queue, name, value)
        index_set._PENDING_SCAN_MAX = scan_max


sizes = st.tuples(st.integers(1, 32), st.integers(0, 8), st.integers(0, 3), st.integers(1, 4))

def queue_steps(seed: int, count: int = 300) -> list[tuple[str, object]]:
    """A long random interleaving (weighted so that a backlog of due rows builds up and
    frontiers outlive many calls): pushes, pops of 1..15, clock moves (back too),
    deletes, expiries, replacements, peeks."""
    rng = random.Random(seed)
    steps: list[tuple[str, object]] = []
    for _ in range(count):
        kind = rng.choices(["push", "pop", "clock", "delete", "expire", "replace", "peek"],
                           weights=[6, 8, 3, 1, 1, 1, 1])[0]
        if kind == "push":
            arg: object = [(rng.randint(0, 40), rng.randint(0, 3), rng.randint(0, 60))
                           for _ in range(rng.randint(1, 12))]
        elif kind == "pop":
            arg = rng.choice([1, 1, 2, 3, rng.randint(1, 15)])
        elif kind == "clock":
            arg = rng.randint(-10, 20)
        else:
            arg = rng.randint(0, 50)
        steps.append((kind, arg))
    return steps


class QueueModel:
    """What is tracked, at which time: the first ``n`` due rows leave, in index order."""

    def __init__(self) -> None:
        self.time: dict[tuple[int, int], int] = {}

    def due(self, cutoff: int) -> list[tuple[int, int, int]]:
        return sorted((t, l, e) for (l, e), t in self.time.items() if t <= cutoff)


@settings(max_examples=example_count(100), deadline=None)
@given(st.integers(0, 2**32 - 1), sizes)
def test_frontier_delivers_exactly_what_a_sorted_model_does(seed, size):
    steps = queue_steps(seed)
    with small_frontiers(*size):
        index = DelayedIndexSet()
        index.ghost_filter = lambda ledger: True  # every row may linger (in a "sealed file")
        queue = SharedQueue(lambda bucket: None)
        model = QueueModel()
        pushed: list[Run] = []
        cutoff = 0
        delivered_once: set[tuple[int, int]] = set()
        deleted: set[tuple[int, int]] = set()  # (not re-added: a plain untrack leaves no ghost)
        for kind, arg in steps:
            if kind == "push":
                # Some due already, some before the frontier's limit (as a replay, or a
                # copy a seal hands over, may push): the queue must fold its frontier.
                rows = [(max(0, cutoff + t - 8), l, e) for t, l, e in arg]
                fresh = []
                for t, l, e in rows:
                    if (l, e) in deleted:
                        continue
                    if index.add(l, e, t):
                        model.time[(l, e)] = t
                        delivered_once.discard((l, e))
                        fresh.append((t, l, e))
                if fresh:
                    run = sorted_run(*(np.array(c, dtype=_U64) for c in zip(*fresh)))
                    pushed.append(run)
                    queue.push(run)
            elif kind == "pop":
                ts, ledgers, entries, last = queue.pop_due(cutoff, arg, index)
                got = list(zip(ts.tolist(), ledgers.tolist(), entries.tolist()))
                expect = model.due(cutoff)[:arg]
                assert got == expect  # index order, never early, none skipped
                for t, l, e in got:
                    assert (l, e) not in delivered_once, "delivered twice"
                    delivered_once.add((l, e))
                    del model.time[(l, e)]
                if got:
                    assert last is not None and last >= got[-1]
            elif kind == "clock":
                cutoff = max(0, cutoff + arg)  # may move back: the queue must not deliver early
            elif kind == "delete" and model.time:
                l, e = sorted(model.time)[arg % len(model.time)]
                assert index.discard(l, e)
                del model.time[(l, e)]
                deleted.add((l, e))
            elif kind == "expire" and model.time:
                l, e = sorted(model.time)[arg % len(model.time)]
                assert index.expire(l, e)  # (it may be tracked again later, at another time)
                del model.time[(l, e)]
            elif kind == "replace" and pushed:
                # A seal or merge: the run dies and a copy of all its rows (delivered ones too;
                # the index keeps them dead) takes its place, maybe before the frontier's limit.
                old = pushed.pop(arg % len(pushed))
                if old.dead or not len(old.ts):
                    continue
                copy = Run(old.ts.copy(), old.ledgers.copy(), old.entries.copy())
                old.kill()
                queue.push(copy)
                queue.drop_dead()
                pushed.append(copy)
            elif kind == "peek":
                due = sorted((t, l, e) for (l, e), t in model.time.items())
                assert queue.next_timestamp(index) == (due[0][0] if due else None)
            # Exact after every step: the count, and membership of every tracked position.
            assert len(index) == len(model.time)
            for (l, e) in model.time:
                assert index.contains(l, e)
            for (l, e) in delivered_once:
                assert not index.contains(l, e)
        index._check()
        ts, ledgers, entries, _ = queue.pop_due(10**6, 10**6, index)
        assert list(zip(ts.tolist(), ledgers.tolist(), entries.tolist())) == model.due(10**6)


@settings(max_examples=example_count(100), deadline=None)
@given(ops, st.sampled_from(CONFIGS), sizes, st.sampled_from(["sealed", "journal"]))
def test_tracker_with_small_frontiers_matches_model(tmp_path_factory, ops_list, config, size, durability):
    """The differential workload (seals, merges, lazy loads, acks, peeks) with frontiers of a few
    rows, so that seals and merges install while a frontier is being consumed."""
    with small_frontiers(*size):
        clock = FakeClock(1_000)
        with bucketstore.open(tmp_path_factory.mktemp("s"), durability=durability) as store:
            tracker = store.tracker("sub", config, clock)
            baseline = bucketstore.InMemoryTracker(config, clock)
            _run(ops_list, tracker, baseline, SortedListModel(config.tick_time_ms, clock), clock)


def test_many_buckets_drain_in_order_with_counts_exact_after_every_call(tmp_path):
    """Forty sealed buckets all due at once (the shape of issue 18), drained in batches of
    1..97 with the clock moving: index order across buckets, exact counts and membership."""
    config = dataclasses.replace(CONFIGS[0], min_index_count_per_bucket=30, max_indexes_per_segment=7)
    clock = FakeClock(1_000)
    rng = np.random.default_rng(18)
    with small_frontiers(64, 4, 2, 2), bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("t", config, clock)
        expect = []
        for ledger in range(40):
            at = (2_000 + rng.integers(0, 600, 40)).tolist()
            t.add_messages([(ledger, e, a) for e, a in enumerate(at)])
            expect += [(a, ledger, e) for e, a in enumerate(at)]
        t.add_message(40, 0, 10**6)  # rolls the last ledger into a bucket too
        t.wait_for_maintenance()
        assert len(t.buckets()) >= 39
        expect.sort()
        held = len(expect) + 1
        sizes = iter(list(range(1, 98)) * 10)
        while expect:
            clock.advance(7)
            n = next(sizes)
            cutoff = clock.now + config.tick_time_ms
            due = [r for r in expect if r[0] <= cutoff][:n]
            got = t.get_scheduled_messages(n)
            assert got == sorted((l, e) for _, l, e in due)
            del expect[:len(due)]
            held -= len(due)
            assert t.number_of_delayed_messages == held
            for _, l, e in due[:3]:
                assert not t.contains_message(l, e)
            for _, l, e in expect[:3]:
                assert t.contains_message(l, e)


class _FakeBucket:
    """A sealed bucket's segments in memory (a SegmentSource): sorted, each starting at or after
    the previous one's end; ``ready`` says whether its next segment is "read ahead".

    :meth:`take_head` makes it an *unopened* bucket whose first rows are queued from its
    "catalog summary" (bucket_prefix): the rest of segment 1 follows them, and the first load
    "opens" it (``loads_unopened`` counts those)."""

    def __init__(self, segments: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        self.segments = segments
        self.current = 0
        self.dead = False
        self.ready = False
        self.exhausted = False
        self.opened = True
        self.head = 0
        self.loads_unopened = 0

    def take_head(self, k: int) -> Run:
        self.opened, self.head = False, k
        return Run(*(c[:k] for c in self.segments[0]), owner=self)

    def has_next_segment(self) -> bool:
        return self.current < len(self.segments)

    def next_segment_min_ts(self) -> int:
        return int(self.segments[self.current][0][self.head if self.current == 0 else 0])

    def next_segment_ready(self) -> bool:
        return self.ready and self.opened

    def load_next_segment(self) -> Run:
        if not self.opened:
            self.loads_unopened += 1
            self.opened = True
        cols = self.segments[self.current]
        if self.current == 0 and self.head:
            cols = tuple(c[self.head:] for c in cols)
        self.current += 1
        self.ready = False
        return Run(*cols, owner=self)


@settings(max_examples=example_count(60), deadline=None)
@given(st.integers(0, 2**32 - 1), sizes, st.integers(0, 60))
def test_a_slowly_moving_clock_over_many_overlapping_buckets(seed, size, ahead):
    """The broker's steady state: many sealed buckets (segments loaded lazily) whose rows are
    due at every moment of one window, and a clock moving a few ticks per call, so that one
    frontier looks ahead of the cutoff and serves many calls. Between calls: adds (some
    earlier than the frontier's horizon), deletes, expiries and re-adds, segments becoming
    "read ahead", peeks. Every call matches a sorted model: index order, never early, never
    twice, none skipped; count and membership exact after every step."""
    rng = random.Random(seed)
    saved_ahead, saved_opens = shared_queue.FRONTIER_AHEAD_MS, shared_queue.FRONTIER_OPENS
    shared_queue.FRONTIER_AHEAD_MS = ahead
    shared_queue.FRONTIER_OPENS = rng.choice([1, 2, 16])  # unopened buckets a build opens at most
    try:
        with small_frontiers(*size):
            index = DelayedIndexSet()
            index.ghost_filter = lambda ledger: True  # every delivered row lingers in its "file"
            exhausted: list[_FakeBucket] = []
            queue = SharedQueue(exhausted.append)
            model = QueueModel()
            buckets = []
            for ledger in range(rng.randint(8, 24)):
                n = rng.randint(5, 40)
                ts = sorted(rng.randint(0, 300) for _ in range(n))
                entries = rng.sample(range(200), n)
                rows = sorted(zip(ts, [ledger] * n, entries))
                seg = rng.randint(3, 9)
                cols = [tuple(np.array(c, dtype=_U64) for c in zip(*rows[i:i + seg])) for i in range(0, n, seg)]
                bucket = _FakeBucket(cols)
                buckets.append(bucket)
                for t, l, e in rows:
                    assert index.add(l, e, t)
                    model.time[(l, e)] = t
                if len(cols[0][0]) > 1 and rng.random() < 0.5:  # its first rows from its summary
                    queue.push(bucket.take_head(rng.randint(1, len(cols[0][0]) - 1)))
                else:
                    queue.push(shared_queue.Slot(bucket))
            cutoff = rng.randint(0, 20)
            delivered: set[tuple[int, int]] = set()
            for _ in range(400):
                kind = rng.choices(["pop", "clock", "add", "delete", "expire", "ready", "peek"],
                                   weights=[10, 6, 2, 1, 1, 2, 1])[0]
                if kind == "pop":
                    n = rng.choice([1, 2, 5, rng.randint(1, 30)])
                    ts, ledgers, entries, last = queue.pop_due(cutoff, n, index)
                    got = list(zip(ts.tolist(), ledgers.tolist(), entries.tolist()))
                    assert got == model.due(cutoff)[:n]
                    for t, l, e in got:
                        assert (l, e) not in delivered, "delivered twice"
                        delivered.add((l, e))
                        del model.time[(l, e)]
                elif kind == "clock":
                    cutoff += rng.choice([0, 1, 1, 2, 3])
                elif kind == "add":
                    # New positions (ledgers past the buckets'), or delivered ones again: some
                    # due already, most a little ahead (before the frontier's horizon).
                    fresh = []
                    for _ in range(rng.randint(1, 6)):
                        t = max(0, cutoff + rng.randint(-3, 40))
                        if delivered and rng.random() < 0.3:
                            l, e = rng.choice(sorted(delivered))
                        else:
                            l, e = 100 + rng.randint(0, 3), rng.randint(0, 100)
                        if index.add(l, e, t):
                            model.time[(l, e)] = t
                            delivered.discard((l, e))
                            fresh.append((t, l, e))
                    if fresh:
                        queue.push(sorted_run(*(np.array(c, dtype=_U64) for c in zip(*fresh))))
                elif kind in ("delete", "expire") and model.time:
                    l, e = sorted(model.time)[rng.randrange(len(model.time))]
                    if kind == "delete":
                        assert index.discard(l, e)
                        delivered.add((l, e))  # (never re-added without a ghost: see "add")
                        index.add_ghosts(l, index_set.bitmap_of(np.array([e], dtype=_U64)))
                    else:
                        assert index.expire(l, e)
                    del model.time[(l, e)]
                elif kind == "ready":
                    rng.choice(buckets).ready = True
                elif kind == "peek":
                    due = min(model.time.values(), default=None)
                    assert queue.next_timestamp(index) == due
                assert len(index) == len(model.time)
                for l, e in rng.sample(sorted(model.time), min(5, len(model.time))):
                    assert index.contains(l, e)
                for l, e in rng.sample(sorted(delivered), min(5, len(delivered))):
                    assert not index.contains(l, e)
            index._check()
            ts, ledgers, entries, _ = queue.pop_due(10**6, 10**6, index)
            assert list(zip(ts.tolist(), ledgers.tolist(), entries.tolist())) == model.due(10**6)
            assert sorted(map(id, exhausted)) == sorted(map(id, buckets))  # each read to its end once
    finally:
        shared_queue.FRONTIER_AHEAD_MS, shared_queue.FRONTIER_OPENS = saved_ahead, saved_opens


def test_a_compaction_while_a_frontier_holds_the_runs_never_brings_a_delivered_row_back(tmp_path):
    """The mutable bucket compacts its runs (more than it keeps) while a frontier holds them: the
    compacted run starts where delivery is, so a delivered position added again at a later
    time is delivered at that time, not at its old one."""
    clock = FakeClock(0)
    cfg = bucketstore.TrackerConfig(tick_time_ms=0)
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("t", cfg, clock)
        t.add_messages([(1, e, 10 + e) for e in range(40)])
        clock.now = 10
        assert t.get_scheduled_messages(1) == [(1, 0)]  # a frontier over the run, looking ahead
        assert t.add_message(1, 0, 1_000)  # delivered, tracked again for later
        for k in range(20):  # one run per flush: the mutable bucket compacts them
            t.add_message(1, 100 + k, 2_000 + k)
            assert t.next_delivery_time() == 11
        clock.now = 60
        assert t.get_scheduled_messages(100) == [(1, e) for e in range(1, 40)]
        assert t.contains_message(1, 0)
        assert t.next_delivery_time() == 1_000


def test_the_first_frontier_is_small_and_later_ones_grow():
    """The first batch (after an open) merges about FRONTIER_FIRST_ROWS rows, not a full
    frontier; each rebuild doubles that, so a steady drain soon builds full ones."""
    index = DelayedIndexSet()
    queue = SharedQueue(lambda bucket: None)
    rng = np.random.default_rng(5)
    for ledger in range(40):
        ts = np.sort(rng.integers(0, 1_000_000, 20_000).astype(_U64))
        entries = np.arange(20_000, dtype=_U64)
        ledgers = np.full(20_000, ledger, dtype=_U64)
        index.add_many(ledgers, entries, ts)
        queue.push(sorted_run(ts, ledgers, entries))
    first = shared_queue.FRONTIER_FIRST_ROWS
    sizes: list[int] = []
    seen = None
    while len(sizes) < 5:
        if not len(queue.pop_due(10**7, 1000, index)[0]):
            break
        f = queue._frontier
        if f is not None and f is not seen:
            seen = f
            sizes.append(len(f.ts))
    assert len(sizes) == 5 and sizes[0] <= first + 40 * shared_queue.FRONTIER_MIN_CAP, sizes
    assert all(b > a for a, b in zip(sizes, sizes[1:4]))
    assert max(sizes) >= shared_queue.FRONTIER_ROWS // 2
