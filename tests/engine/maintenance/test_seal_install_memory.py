"""What a seal's install keeps in memory: its bucket's first segment only when it is due within
one segment's time step; otherwise the segment waits on disk, as a reopened store's does."""

from __future__ import annotations

import bucketstore
from bucketstore import TrackerConfig

from helpers import FakeClock

STEP = 1_000
CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=100, max_indexes_per_segment=20,
                    max_time_step_per_segment_ms=STEP)


def _seal(tmp_path, clock, first_ts):
    store = bucketstore.open(tmp_path, durability="sealed")
    t = store.tracker("t", CFG, clock)
    assert t.add_messages([(1, e, first_ts + e) for e in range(100)]) == 100
    assert t.add_message(2, 0, first_ts + 10 ** 9)  # rolls ledger 1 over: it is sealed
    t.wait_for_maintenance()
    assert len(t.buckets()) == 1
    return store, t


def _drain(t, clock, upto):
    clock.now = upto
    out = []
    while got := t.get_scheduled_messages(1000):
        out.extend(got)
    return out


def test_a_segment_due_later_waits_on_disk(tmp_path):
    clock = FakeClock(0)
    store, t = _seal(tmp_path / "s", clock, first_ts=50 * STEP)
    with store:
        t.get_scheduled_messages(10)  # nothing due; the cutoff is computed
        # Only ledger 2's row is in memory (the mutable bucket): not the bucket's first segment,
        # which the seal had in hand (20 rows) and used to keep until due.
        assert t.stats()["loaded_indexes"] == 1
        assert t.buckets()[0].current == 0
        loads = t.stats()["load"]["succeeded"]
        assert _drain(t, clock, 50 * STEP + 99) == [(1, e) for e in range(100)]
        assert t.stats()["load"]["succeeded"] == loads + 5  # every segment read from disk
        assert t.number_of_delayed_messages == 1 and t.contains_message(2, 0)


def test_a_segment_due_soon_is_kept(tmp_path):
    clock = FakeClock(0)
    store, t = _seal(tmp_path / "s", clock, first_ts=STEP // 2)
    with store:
        assert t.get_scheduled_messages(10) == []  # nothing due yet; the cutoff is computed
        assert t.stats()["loaded_indexes"] == 1 + 20  # segment 1 handed over by the seal
        assert t.buckets()[0].current == 1
        loads = t.stats()["load"]["succeeded"]
        assert _drain(t, clock, STEP // 2 + 99) == [(1, e) for e in range(100)]
        assert t.stats()["load"]["succeeded"] == loads + 4  # segments 2 to 5 only
