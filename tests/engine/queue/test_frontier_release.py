"""Rows the delivery frontier delivered are not taken back by the mutable bucket.

The mutable bucket's seal (its freeze) and its compaction read its runs' unread rows
while a frontier may hold those runs. Until the frontier kept plain runs' read
positions current at every call (``_Frontier.consume``), it advanced them only when
folded back, so the seal and the compaction read delivered rows as unread. A
position delivered, then tracked again at a later time, was then delivered early
by its old row: from the sealed file (the seal kept the row, the position being
tracked; no ghost marks it, as no file held its ledger when it was delivered) or
from the compacted run. Found by the threaded twin test in test_read_ahead (about 1
run in 10 before; every failure seen went through a seal); these replay its shape
in a few calls, with the in-memory tracker as the twin.
"""

from __future__ import annotations

import pytest

import bucketstore
from bucketstore import InMemoryTracker, TrackerConfig
from bucketstore.engine.store.store import Store
from bucketstore.testing import SteppedWorker

from helpers import FakeClock


def _twins(tmp_path, cfg, clock, durability="sealed", worker=None):
    if worker is not None:  # background seals, run when the test says
        store = Store(tmp_path / "s", durability, background=True, maintenance=worker)
    else:
        store = bucketstore.open(tmp_path / "s", durability, background=False)
    return store, store.tracker("t", cfg, clock), InMemoryTracker(cfg, clock)


def _both(t, mem, call, *args):
    got, want = getattr(t, call)(*args), getattr(mem, call)(*args)
    assert got == want, (call, args, got, want)
    assert t.number_of_delayed_messages == mem.number_of_delayed_messages
    return got


@pytest.mark.parametrize("durability", ["sealed", "journal"])
@pytest.mark.parametrize("stepped", [False, True])
def test_a_seal_leaves_out_rows_the_frontier_delivered(tmp_path, durability, stepped):
    clock = FakeClock(0)
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=2, max_indexes_per_segment=4)
    worker = SteppedWorker() if stepped else None
    store, t, mem = _twins(tmp_path, cfg, clock, durability, worker)
    with store:
        _both(t, mem, "add_messages", [(1, 0, 5), (1, 1, 5), (1, 2, 50), (1, 3, 60)])
        clock.now = 5
        assert _both(t, mem, "get_scheduled_messages", 1) == [(1, 0)]  # the frontier keeps (1, 1)
        assert _both(t, mem, "add_message", 1, 0, 1000)  # delivered, tracked again: due at 1000
        _both(t, mem, "add_messages", [(2, 0, 70), (2, 1, 80)])  # rolls ledger 1: sealed
        if worker is not None:
            assert worker.pending_kinds() == ["create"]
            assert worker.install()
        assert len(t.buckets()) == 1 and t.buckets()[0].start_ledger == 1
        clock.now = 100
        assert _both(t, mem, "get_scheduled_messages", 10) == [(1, 1), (1, 2), (1, 3), (2, 0), (2, 1)]
        assert t.contains_message(1, 0)  # not delivered at 5 from the sealed file
        clock.now = 1000
        assert _both(t, mem, "get_scheduled_messages", 10) == [(1, 0)]
        assert t.number_of_delayed_messages == 0


def test_a_compaction_leaves_out_rows_the_frontier_delivered(tmp_path):
    clock = FakeClock(0)
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=1000)  # never sealed here
    store, t, mem = _twins(tmp_path, cfg, clock)
    with store:
        _both(t, mem, "add_messages", [(1, 0, 5), (1, 1, 5)])
        for i in range(15):  # one run per batch: 16 runs in the mutable bucket
            _both(t, mem, "add_messages", [(1, 10 + 2 * i, 500), (1, 11 + 2 * i, 500)])
        clock.now = 5
        assert _both(t, mem, "get_scheduled_messages", 1) == [(1, 0)]  # the frontier keeps (1, 1)
        _both(t, mem, "add_messages", [(1, 0, 1000), (1, 100, 1000)])  # a 17th run: compacted at the next call
        assert _both(t, mem, "get_scheduled_messages", 1) == [(1, 1)]
        clock.now = 500
        assert _both(t, mem, "get_scheduled_messages", 100) == [(1, e) for e in range(10, 40)]
        clock.now = 1000
        assert _both(t, mem, "get_scheduled_messages", 100) == [(1, 0), (1, 100)]
        assert t.number_of_delayed_messages == 0
