"""The shared queue's merge of several runs' rows (the frontier's one sort), against a plain sort."""

from __future__ import annotations

import numpy as np
from helpers import example_count
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketstore.engine.queue.shared_queue import _merge, sorted_run

rows = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 3), st.integers(0, 200)), min_size=1, max_size=300)
wide = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
                min_size=1, max_size=40)


@settings(max_examples=example_count(300))
@given(st.lists(st.one_of(rows, wide), min_size=2, max_size=6))
def test_merge_equals_sorting_everything(run_rows):
    runs = [sorted_run(*(np.array(c, dtype=np.uint64) for c in zip(*rs))) for rs in run_rows]
    parts = [run.rest() for run in runs]
    ts, ledgers, entries, src = _merge(parts, [len(p[0]) for p in parts])
    merged = list(zip(ts.tolist(), ledgers.tolist(), entries.tolist()))
    assert merged == sorted(r for rs in run_rows for r in rs)
    # Each row's run: every run's rows come out in its own order, all of them.
    for i, run in enumerate(runs):
        mine = [m for m, s in zip(merged, src.tolist()) if s == i]
        assert mine == list(zip(run.ts.tolist(), run.ledgers.tolist(), run.entries.tolist()))


def _loose_runs(tracker) -> int:
    """Live runs of the queue held only in memory (no sealed bucket owns them)."""
    from bucketstore.engine.queue.queue_runs import Run
    return sum(1 for item in tracker._queue.items()
               if isinstance(item, Run) and item.owner is None and not item.dead and item.remaining)


def test_a_replayed_journal_of_single_adds_to_covered_ledgers_makes_one_run(tmp_path):
    """Single adds to ledgers a sealed bucket covers each make a journal record; replayed at open,
    each record became a one-row run, and every frontier build then looked at all of them (60,000
    indexes took 5 s to drain instead of 50 ms). They join one buffered run instead."""
    import bucketstore
    from bucketstore.testing import FakeClock

    clock = FakeClock(1_000)
    config = bucketstore.TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=100)
    path = str(tmp_path / "s")
    with bucketstore.open(path, background=False) as store:
        t = store.tracker("t", config=config, clock=clock)
        t.add_messages([(ledger, entry, 10_000 + entry) for ledger in range(2) for entry in range(100)])
        t.add_message(2, 0, 10_000)  # ledger 2 rolls: ledger 0 (at least) is sealed
        assert t.stats()["immutable_buckets"] >= 1
        for entry in range(100, 400):  # covered by a sealed bucket: straight to the queue
            t.add_message(0, entry, 20_000 + entry)
    with bucketstore.open(path, background=False) as store:
        t = store.tracker("t", config=config, clock=clock)
        t.next_delivery_time()  # syncs the queue
        assert _loose_runs(t) <= 2
        clock.advance(100_000)
        got = []
        while batch := t.get_scheduled_messages(50):
            got += batch
        assert len(got) == 501 and len(set(got)) == 501
