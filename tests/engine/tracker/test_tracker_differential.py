"""Differential tests: random workloads against a plain sorted-list model and InMemoryTracker.

The bucket tracker is run with tiny buckets and segments so that seals, lazy
segment loads, direct (covered/old ledger) adds and bucket deletions all happen
within a few dozen operations.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import os
import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.format.snapshot import BucketFile

from helpers import FakeClock, example_count


class SortedListModel:
    """The specification, as plainly as possible: a sorted list of (ts, ledger, entry).

    With ``bits`` (``precision_bits``) a time is trimmed to a multiple of ``2**bits``, except,
    with ``exact_behind_frontier``, when the trimmed key would sort at or before the largest
    key delivered so far: the bucket tracker then keeps the exact time, so what it delivered
    stays a prefix of its index order (which journal recovery relies on). The in-memory
    ``TimeBucketTracker`` has no such rule: it always trims, as Pulsar does.
    """

    def __init__(self, tick: int, clock: FakeClock, bits: int = 0, exact_behind_frontier: bool = True) -> None:
        self.bits = bits  # precision_bits: stored times are trimmed to multiples of 2**bits
        self.exact_behind_frontier = exact_behind_frontier
        self.frontier: tuple[int, int, int] | None = None  # the largest key delivered
        self.rows: list[tuple[int, int, int]] = []
        self.where: dict[tuple[int, int], int] = {}
        self.tick = tick
        self.clock = clock
        self.cutoff = -1
        self.acked = (-1, -1)
        self.advance()  # trackers start their cutoff when created

    def advance(self) -> int:
        self.cutoff = max(self.cutoff, self.clock() + self.tick)
        return self.cutoff

    def add(self, ledger: int, entry: int, at: int) -> bool:
        cutoff = self.advance()  # every add reads the clock, as the trackers do
        if (ledger, entry) <= self.acked:
            return False  # acknowledged already
        if at <= cutoff:
            if (ledger, entry) in self.where:
                self.rows.remove((self.where.pop((ledger, entry)), ledger, entry))
            return False
        if (ledger, entry) in self.where:
            return True
        trimmed = at >> self.bits << self.bits
        if not (self.exact_behind_frontier and self.frontier is not None
                and (trimmed, ledger, entry) <= self.frontier):
            at = trimmed
        self.where[(ledger, entry)] = at
        bisect.insort(self.rows, (at, ledger, entry))
        return True

    def pop(self, n: int) -> list[tuple[int, int]]:
        cutoff = self.advance()
        out = []
        while self.rows and len(out) < n and self.rows[0][0] <= cutoff:
            at, ledger, entry = self.rows.pop(0)
            del self.where[(ledger, entry)]
            self.frontier = max(self.frontier or (at, ledger, entry), (at, ledger, entry))
            out.append((ledger, entry))
        return sorted(out)

    def mark_delete(self, ledger: int, entry: int) -> None:
        if (ledger, entry) < self.acked:
            return  # acknowledgement never moves back
        self.acked = (ledger, entry)
        for row in [r for r in self.rows if (r[1], r[2]) <= (ledger, entry)]:
            self.rows.remove(row)
            del self.where[(row[1], row[2])]

    def next_time(self):
        return self.rows[0][0] if self.rows else None


_add = st.tuples(st.just("add"), st.integers(0, 12), st.integers(0, 40), st.integers(-50, 3000))
ops = st.lists(
    st.one_of(
        _add, _add, _add,
        st.tuples(st.just("roll"), st.integers(1, 3), st.integers(0, 0), st.integers(0, 0)),
        st.tuples(st.just("batch"), st.integers(0, 12), st.integers(1, 30), st.integers(0, 10**6)),
        st.tuples(st.just("tick"), st.integers(-100, 400), st.integers(0, 0), st.integers(0, 0)),
        st.tuples(st.just("pop"), st.integers(0, 25), st.integers(0, 0), st.integers(0, 0)),
        st.tuples(st.just("peek"), st.integers(0, 0), st.integers(0, 0), st.integers(0, 0)),
        st.tuples(st.just("ack"), st.integers(0, 6), st.integers(0, 40), st.integers(0, 0)),
    ),
    min_size=5, max_size=120,
)

CONFIG = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=4, max_indexes_per_segment=3,
                       max_time_step_per_segment_ms=200)
#: The same, merging whenever there are more than 1, 2 or 3 buckets (Pulsar broke on 1..3: #26241).
CONFIGS = [CONFIG] + [dataclasses.replace(CONFIG, max_num_buckets=n) for n in (1, 2, 3)]


def _run(ops_list, tracker, baseline, model, clock, baseline_model=None):
    """Run ``ops_list`` on the bucket tracker and a baseline tracker, each checked against a
    model after every step: ``baseline_model`` where the baseline's rule differs (the times it
    keeps), else ``model`` for both."""
    models = [model] if baseline_model is None else [model, baseline_model]
    pairs = [(tracker, model), (baseline, models[-1])]
    ledger_base = 0
    delivered: set[tuple[int, int]] = set()
    for kind, a, b, c in ops_list:
        if kind == "add":
            ledger, entry, at = ledger_base + a, b, clock.now + c
            expect, *others = [m.add(ledger, entry, at) for m in models]
            assert others in ([], [expect])  # the rules differ in the times kept, not in what is tracked
            for subject, _ in pairs:
                assert subject.add_message(ledger, entry, at) == expect
            if expect:
                delivered.discard((ledger, entry))  # tracked anew: delivering it again is right
        elif kind == "roll":
            ledger_base += a  # the embedder's log moves on to newer ledgers
        elif kind == "batch":
            ledger = ledger_base + a
            rows = [(ledger, (c + 7 * i) % 50, clock.now + 1 + (c * (i + 1)) % 900) for i in range(b)]
            expect, *others = [sum(m.add(*r) for r in rows) for m in models]
            assert others in ([], [expect])
            for subject, _ in pairs:
                assert subject.add_messages(rows) == expect
            delivered -= set(model.where)
        elif kind == "tick":
            clock.advance(a)
        elif kind == "pop":
            expect, *others = [m.pop(a) for m in models]
            got = tracker.get_scheduled_messages(a)
            assert got == expect
            assert baseline.get_scheduled_messages(a) == (others or [expect])[0]
            assert not delivered & set(got), "a position was delivered twice"
            assert not any(tracker.contains_message(*p) for p in got), "a delivered position is still tracked"
            delivered |= set(got)
        elif kind == "peek":
            for subject, m in pairs:
                assert subject.next_delivery_time() == m.next_time()
            for m in models:
                m.advance()  # has_message_available reads the clock
            for subject, m in pairs:
                assert subject.has_message_available() == (m.rows != [] and m.rows[0][0] <= m.cutoff)
        elif kind == "ack":
            ledger, entry = max(0, ledger_base - a), b
            for m in models:
                m.mark_delete(ledger, entry)
            tracker.mark_delete(ledger, entry)
            baseline.mark_delete(ledger, entry)
        for subject, m in pairs:
            assert subject.number_of_delayed_messages == len(m.where)
        tracker._check()
    for ledger, entry in list(model.where)[:20]:
        assert tracker.contains_message(ledger, entry)
    # Drain: everything left comes out, once, in order.
    clock.advance(10**7)
    assert tracker.get_scheduled_messages(10**6) == model.pop(10**6)
    assert tracker.number_of_delayed_messages == 0


@settings(max_examples=example_count(200))
@given(ops, st.sampled_from(CONFIGS))
def test_bucket_tracker_matches_model_and_in_memory(tmp_path_factory, ops_list, config):
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path_factory.mktemp("s")) as store:
        tracker = store.tracker("sub", config, clock)
        baseline = bucketstore.InMemoryTracker(config, clock)
        _run(ops_list, tracker, baseline, SortedListModel(config.tick_time_ms, clock), clock)
        stats = tracker.stats()
        event(f"sealed: {stats['create']['succeeded'] > 0}, loaded: {stats['load']['succeeded'] > 0}, "
              f"deleted: {stats['delete']['succeeded'] > 0}, merged: {stats['merge']['succeeded'] > 0}")


def _sealed_contents(store_path, catalog_keys):
    rows = set()
    for ledger_id in catalog_keys.values():
        with BucketFile(store_path / "ledgers" / f"{ledger_id:020d}.ledger") as bf:
            for k in range(1, bf.segment_count + 1):
                seg = bf.read_segment(k)
                rows |= set(zip(seg.timestamps.tolist(), seg.ledger_ids.tolist(), seg.entry_ids.tolist()))
    return rows


@settings(max_examples=example_count(100))
@given(ops, st.sampled_from([3, 6]), st.sampled_from([-1, 2]))
def test_time_bucketed_tracker_matches_model_and_time_bucket_tracker(tmp_path_factory, ops_list, bits, max_buckets):
    """precision_bits > 0: the mutable bucket is a TimeBucket index and every time is trimmed
    to a multiple of 2**bits (the bucket tracker keeps the exact time of a re-add whose trimmed
    key is behind its delivery frontier); each matches its model."""
    config = dataclasses.replace(CONFIG, precision_bits=bits, max_num_buckets=max_buckets)
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path_factory.mktemp("s")) as store:
        tracker = store.tracker("sub", config, clock)
        baseline = bucketstore.TimeBucketTracker(config, clock)
        _run(ops_list, tracker, baseline, SortedListModel(config.tick_time_ms, clock, bits), clock,
             SortedListModel(config.tick_time_ms, clock, bits, exact_behind_frontier=False))


@settings(max_examples=example_count(80))
@given(ops, st.integers(0, 3000), st.sampled_from(CONFIGS))
def test_recovery_in_sealed_mode_keeps_sealed_undue_indexes(tmp_path_factory, ops_list, pause, config):
    """After close and reopen (sealed mode): no phantom; every sealed, undelivered index
    that is not yet due on reopen is tracked again (Pulsar §3.9 skips only due segments)."""
    path = tmp_path_factory.mktemp("s")
    clock = FakeClock(1_000)
    model = SortedListModel(CONFIG.tick_time_ms, clock)
    with bucketstore.open(path, durability="sealed") as store:
        tracker = store.tracker("sub", config, clock)
        for op in ops_list:
            if op[0] == "pop":
                tracker.get_scheduled_messages(op[1])
                model.pop(op[1])
            elif op[0] == "add":
                tracker.add_message(op[1], op[2], clock.now + op[3])
                model.add(op[1], op[2], clock.now + op[3])
            elif op[0] == "tick":
                clock.advance(op[1])
        before = {(at, l, e) for (l, e), at in model.where.items()}
        sealed = _sealed_contents(path, store.catalog.buckets("sub"))
    clock.advance(pause)
    with bucketstore.open(path, durability="sealed") as store:
        tracker = store.tracker("sub", config, clock)
        tracker._check()
        cutoff = clock.now + CONFIG.tick_time_ms
        must = {r for r in before & sealed if r[0] > cutoff}
        may = before & sealed
        clock.advance(10**7)
        got = tracker.get_scheduled_messages(10**6)
        got_set = set(got)
        assert {(l, e) for _, l, e in must} <= got_set
        assert got_set <= {(l, e) for _, l, e in may}, "a phantom index came back"
        assert len(got) == len(got_set)


@settings(max_examples=example_count(30))
@given(seed=st.integers(0, 2**32 - 1), max_buckets=st.integers(1, 3))
def test_merging_workload_matches_model(tmp_path_factory, seed, max_buckets):
    """Many small seals so that merges (max_num_buckets 1..3) happen constantly,
    interleaved with deliveries that leave buckets partly loaded and partly delivered."""
    rng = random.Random(seed)
    config = dataclasses.replace(CONFIG, max_num_buckets=max_buckets, min_index_count_per_bucket=3)
    clock = FakeClock(1_000)
    model = SortedListModel(config.tick_time_ms, clock)
    with bucketstore.open(tmp_path_factory.mktemp("s")) as store:
        tracker = store.tracker("sub", config, clock)
        delivered: set[tuple[int, int]] = set()
        for ledger in range(40):
            for entry in range(rng.randint(0, 8)):
                at = clock.now + rng.randint(1, 2000)
                assert tracker.add_message(ledger, entry, at) == model.add(ledger, entry, at)
            if rng.random() < 0.5:
                clock.advance(rng.randint(0, 150))
                n = rng.randint(0, 10)
                got = tracker.get_scheduled_messages(n)
                assert got == model.pop(n)
                assert not delivered & set(got)
                delivered |= set(got)
            assert tracker.number_of_delayed_messages == len(model.where)
            tracker._check()
        assert tracker.stats()["merge"]["failed"] == 0, tracker.stats()["maintenance"]
        event(f"merged: {tracker.stats()['merge']['succeeded'] > 0}")
        clock.advance(10**6)
        assert tracker.get_scheduled_messages(10**6) == model.pop(10**6)
        assert tracker.number_of_delayed_messages == 0
        assert tracker.stats()["immutable_buckets"] == 0  # exhausted buckets are deleted
    assert os.listdir(store.ledgers_dir) == [], "every bucket file is removed once delivered"


@pytest.mark.parametrize("kind", ["bucket", "in-memory", "time-bucket"])
def test_an_acknowledged_add_reads_the_clock_too(tmp_path, kind):
    """Every add moves the cutoff to the clock, even one refused as acknowledged: the three
    trackers agree when the clock then steps back (the cutoff never does)."""
    clock = FakeClock(100)
    config = TrackerConfig(tick_time_ms=0, precision_bits=3 if kind == "time-bucket" else 0)
    with contextlib.ExitStack() as stack:
        if kind == "bucket":
            store = stack.enter_context(bucketstore.open(tmp_path / "s"))
            tracker = store.tracker("t", config, clock)
        else:
            tracker = (bucketstore.InMemoryTracker if kind == "in-memory" else bucketstore.TimeBucketTracker)(
                config, clock)
        tracker.mark_delete(0, 0)
        clock.now = 200
        assert tracker.add_message(0, 0, 500) is False  # acknowledged; the cutoff is now 200
        clock.now = 150  # the clock steps back; the cutoff stays at 200
        assert tracker.add_message(0, 1, 180) is False  # due: at or before the cutoff
        assert tracker.number_of_delayed_messages == 0
