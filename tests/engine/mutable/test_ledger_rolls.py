"""Ledger rolls cost O(1) each: the seal gate's running count, and many small ledgers."""

from __future__ import annotations

import gc
import weakref

import numpy as np
from hypothesis import given, settings, strategies as st

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.mutable.mutable_bucket import MutableBucket, PendingCounter

from helpers import FakeClock, example_count

_ops = st.lists(st.one_of(
    st.tuples(st.just("one"), st.integers(0, 50)),
    st.tuples(st.just("batch"), st.lists(st.integers(0, 50), max_size=6)),
    st.tuples(st.just("cutoff"), st.integers(-1, 50)),
    st.tuples(st.just("reset"), st.just(0)),
    st.tuples(st.just("merge"), st.booleans()),
), max_size=40)


@settings(max_examples=example_count(200), deadline=None)
@given(_ops)
def test_pending_counter_matches_a_scan(ops):
    """The running count equals counting the rows after the cutoff, whatever the order of
    single adds, sorted batches, cutoff moves (never back) and resets."""
    counter, rows, cutoff = PendingCounter(), [], -1
    for op, arg in ops:
        if op == "one":
            counter.add_one(arg)
            rows.append(arg)
        elif op == "batch":
            counter.add_sorted(np.array(sorted(arg), dtype=np.uint64))
            rows.extend(arg)
        elif op == "cutoff":
            cutoff = max(cutoff, arg)
        elif op == "merge":
            # The runs merged into one: its rows are every row counted, less (or not) the due
            # rows already read from the runs.
            if arg and cutoff >= 0:
                rows = [t for t in rows if t > cutoff]
            counter.replace(np.array(sorted(rows), dtype=np.uint64))
        else:
            counter.reset()
            rows = []
        assert counter.pending(cutoff) == sum(1 for t in rows if t > cutoff)


def test_merged_runs_leave_the_seal_gate():
    """Once the mutable bucket merges its runs, the seal gate counts the merged column and
    holds none of the merged-away runs' timestamps (it kept each until the seal), with the
    same counts."""
    bucket = MutableBucket()
    old = []
    for ledger in range(1, 41):
        ts = np.arange(ledger * 10, ledger * 10 + 5, dtype=np.uint64)
        run = bucket.add_run(ts, np.full(5, ledger, np.uint64), np.arange(5, dtype=np.uint64))
        old.append(weakref.ref(run.ts))
    expected = lambda cutoff: sum(1 for ledger in range(1, 41) for t in range(5)  # noqa: E731
                                  if ledger * 10 + t > cutoff)
    assert bucket.pending_count(99) == expected(99)
    bucket.flush()  # over _MAX_RUNS runs: merged into one
    gc.collect()
    assert all(ref() is None for ref in old)
    for cutoff in (99, 150, 300, 500):
        assert bucket.pending_count(cutoff) == expected(cutoff)


def _seal_gate_store(tmp_path, mode):
    clock = FakeClock(0)
    store = bucketstore.open(tmp_path / mode, durability="sealed")  # the seal gate; no fsync per add
    return store, store.tracker("t", TrackerConfig(min_index_count_per_bucket=100, tick_time_ms=1), clock=clock), clock


def test_many_one_message_ledgers_seal_and_deliver_exactly(tmp_path):
    """5,000 one-message ledgers, half of them due before the gate is checked: seals
    happen once 100 rows are pending (due rows do not count), and every index is
    delivered once, batch and single adds alike."""
    n = 5_000
    ledgers = np.arange(1, n + 1, dtype=np.uint64)
    at = 1_000 + ledgers * 10
    for mode in ("batch", "single"):
        store, tracker, clock = _seal_gate_store(tmp_path, mode)
        with store:
            half = n // 2
            if mode == "batch":
                tracker.add_messages((ledgers[:half], np.zeros(half, np.uint64), at[:half]))
            else:
                for ledger, t in zip(ledgers[:half].tolist(), at[:half].tolist()):
                    assert tracker.add_message(ledger, 0, t)
            clock.now = int(at[half - 1])  # every row added so far is due now
            assert tracker.wait_for_maintenance(30)  # single adds do not wait for the worker's seals
            sealed_before = len(tracker.buckets())
            rest = np.arange(half + 1, half + 51, dtype=np.uint64)
            assert tracker.add_messages((rest, np.zeros(50, np.uint64), 1_000 + rest * 10)) == 50
            # 50 pending rows: below the gate of 100 although the bucket holds more rows.
            assert tracker.wait_for_maintenance(30)
            assert len(tracker.buckets()) == sealed_before
            rest = np.arange(half + 51, n + 1, dtype=np.uint64)
            if mode == "batch":
                tracker.add_messages((rest, np.zeros(len(rest), np.uint64), 1_000 + rest * 10))
            else:
                for ledger in rest.tolist():
                    assert tracker.add_message(ledger, 0, 1_000 + ledger * 10)
            assert tracker.wait_for_maintenance(30)
            assert len(tracker.buckets()) > sealed_before
            clock.now = 10 ** 9
            got = tracker.get_scheduled_messages(10 * n)
            assert got == [(ledger, 0) for ledger in range(1, n + 1)]
            assert tracker.number_of_delayed_messages == 0
            tracker._check()
