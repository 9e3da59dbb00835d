"""Trimmed timestamps (``precision_bits > 0``) and the journal's delivery frontier.

Trimming rounds a time down to a multiple of ``2**precision_bits``, so an index not due
yet can land at or before the cutoff, and so at or before the delivery frontier, which
recovery takes as "everything up to here was delivered". Such an index must keep its
exact time: found when an add that returned True was gone after a clean reopen.

``BUCKETSTORE_PRECISION_EXAMPLES`` raises the property test's example count (default 40).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from helpers import FakeClock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_journal import crash  # in process: the journal's pending group is lost, nothing is closed

import bucketstore
from bucketstore import TrackerConfig

CFG = TrackerConfig(tick_time_ms=0, precision_bits=3)


def _deliver_and_add_behind(t, clock) -> None:
    """The report's steps: (5, 5) at 101 trims to 96 and is delivered (frontier (96, 5, 5));
    (5, 1) at 103 is not due, but its trimmed key (96, 5, 1) sorts before that frontier."""
    assert t.add_message(5, 5, 101)
    assert t.get_scheduled_messages(10) == [(5, 5)]
    t.flush()
    assert t._handoff.confirmed == (96, 5, 5)
    assert t.add_message(5, 1, 103)


def _check_kept(t, clock) -> None:
    assert t.number_of_delayed_messages == 1 and t.contains_message(5, 1)
    clock.now = 103
    assert t.get_scheduled_messages(10) == [(5, 1)]  # never late


@pytest.mark.parametrize("batch", [False, True])
def test_an_add_trimmed_behind_the_frontier_survives_a_clean_reopen(tmp_path, batch):
    clock = FakeClock(100)
    with bucketstore.open(tmp_path / "s") as store:  # journal: the default
        t = store.tracker("sub", CFG, clock)
        if batch:
            assert t.add_message(5, 5, 101)
            assert t.get_scheduled_messages(10) == [(5, 5)]
            t.flush()
            assert t.add_messages([(5, 1, 103), (5, 2, 103), (5, 9, 104)]) == 3  # 2 rows behind, 1 after
        else:
            _deliver_and_add_behind(t, clock)
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("sub", CFG, clock)
        if batch:
            assert t.number_of_delayed_messages == 3
            clock.now = 104
            assert t.get_scheduled_messages(10) == [(5, 1), (5, 2), (5, 9)]
        else:
            _check_kept(t, clock)


def test_an_add_trimmed_behind_the_frontier_survives_its_seal_and_a_merge(tmp_path):
    """The exact-time row goes into the sealed bucket (its segment lies behind the frontier's
    time, so recovery opens the bucket and untracks what the frontier covers) and through a
    merge of that bucket with the next one."""
    cfg = dataclasses.replace(CFG, min_index_count_per_bucket=2, max_indexes_per_segment=1, max_num_buckets=1)
    clock = FakeClock(100)
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("sub", cfg, clock)
        _deliver_and_add_behind(t, clock)
        assert t.add_messages([(5, 2, 500), (5, 3, 510)]) == 2
        assert t.add_message(6, 0, 600)  # rolls: seals ledger 5's rows, (5, 1) at 103 among them
        assert t.add_message(6, 1, 700)
        assert t.add_message(7, 0, 800)  # rolls again: a second bucket, merged with the first
        t.flush()
        t.wait_for_maintenance()  # the merge the second seal started
        assert [(b.start_ledger, b.end_ledger) for b in t.buckets()] == [(5, 6)]
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("sub", cfg, clock)
        assert t.number_of_delayed_messages == 6 and t.contains_message(5, 1)
        clock.now = 103
        assert t.get_scheduled_messages(10) == [(5, 1)]
        clock.now = 800
        assert t.get_scheduled_messages(10) == [(5, 2), (5, 3), (6, 0), (6, 1), (7, 0)]


CHILD = textwrap.dedent("""
    import sys, time, bucketstore
    from bucketstore.testing.clock import FakeClock
    clock = FakeClock(100)
    store = bucketstore.open(sys.argv[1])
    t = store.tracker("sub", bucketstore.TrackerConfig(tick_time_ms=0, precision_bits=3), clock)
    assert t.add_message(5, 5, 101)
    assert t.get_scheduled_messages(10) == [(5, 5)]
    t.flush()
    assert t.add_message(5, 1, 103)  # returned True: durable (sync_interval_ms=0, the default)
    print("ready", flush=True)
    time.sleep(60)
""")


def test_an_add_trimmed_behind_the_frontier_survives_a_sigkill(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "s")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    clock = FakeClock(100)
    with bucketstore.open(tmp_path / "s") as store:
        _check_kept(store.tracker("sub", CFG, clock), clock)


def test_a_replayed_re_add_replaces_the_timebucket_row_of_its_position(tmp_path):
    """Found by the property test below. A position delivered (unconfirmed) and re-added at
    another time: the journal holds its add, an untrack, its re-add. The replay untracked it
    in the index but left its row in the TimeBucket index, which holds a position once, so
    the re-add was dropped there and the position, counted, was never delivered again."""
    cfg = TrackerConfig(tick_time_ms=0, precision_bits=1)
    clock = FakeClock(1000)
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("sub", cfg, clock)
        assert t.add_message(0, 0, 1001)  # trimmed to 1000: due now
        assert t.get_scheduled_messages(1) == [(0, 0)]
        assert t.add_message(0, 0, 1002)  # tracked again before its batch is confirmed
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("sub", cfg, clock)
        assert t.number_of_delayed_messages == 1 and t.next_delivery_time() == 1002
        clock.now = 1002
        assert t.get_scheduled_messages(10) == [(0, 0)]


def _trimmed(at: int, bits: int) -> int:
    return at >> bits << bits


#: How far ahead of the clock an add is: mostly within a step of the cutoff, where trimming bites.
delays = st.one_of(st.integers(-2, 12), st.integers(1, 300))
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), st.integers(0, 12), delays),
    st.tuples(st.just("batch"), st.integers(0, 2), st.integers(0, 12), delays),
    st.tuples(st.just("roll"), st.integers(1, 2), st.just(0), st.just(0)),
    st.tuples(st.just("tick"), st.integers(0, 40), st.just(0), st.just(0)),
    st.tuples(st.just("pop"), st.integers(1, 6), st.just(0), st.just(0)),
    st.tuples(st.just("flush"), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("reopen"), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("crash"), st.just(0), st.just(0), st.just(0)),
), max_size=60)


@settings(max_examples=int(os.environ.get("BUCKETSTORE_PRECISION_EXAMPLES", 40)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.integers(1, 8), st.sampled_from([-1, 1]), ops)
def test_trimmed_times_lose_nothing_across_reopens_and_crashes(tmp_path_factory, bits, max_buckets, ops_list):
    """Random adds (single and batched, most due within a step or two), deliveries, flushes,
    clean reopens and crashes on a journal tracker with ``precision_bits`` 1..8: nothing
    tracked, or delivered but unconfirmed, is lost at a restart; nothing confirmed comes
    back; nothing is delivered before its trimmed time or left undelivered past its time."""
    cfg = TrackerConfig(tick_time_ms=0, precision_bits=bits, min_index_count_per_bucket=4,
                        max_indexes_per_segment=3, max_num_buckets=max_buckets)
    path = tmp_path_factory.mktemp("p")
    clock = FakeClock(1000)
    store = bucketstore.open(path, confirm_sync_ms=0, background=False)
    t = store.tracker("sub", cfg, clock)
    tracked: dict[tuple[int, int], int] = {}  # position -> its real time
    confirmed: set[tuple[int, int]] = set()
    unconfirmed: dict[tuple[int, int], int] = {}
    base = 0

    def add(p, at, cutoff):
        if at <= cutoff:
            tracked.pop(p, None)
            return False
        if p not in tracked:
            tracked[p] = at
            confirmed.discard(p)  # tracked anew: delivering it again is right
            unconfirmed.pop(p, None)  # and its new time replaces its redelivery
        return True

    for kind, a, b, c in ops_list:
        if kind in ("add", "batch"):
            cutoff = max(t._cutoff.value, clock.now)
            if kind == "add":
                p = (base + a, b)
                assert t.add_message(*p, clock.now + c) == add(p, clock.now + c, cutoff)
            else:
                rows = [(base + a, b + i, clock.now + c + 7 * i) for i in range(4)]
                assert t.add_messages(rows) == sum(add((l, e), at, cutoff) for l, e, at in rows)
        elif kind == "roll":
            base += a
        elif kind == "tick":
            clock.advance(a)
        elif kind == "pop":
            got = t.get_scheduled_messages(a)
            confirmed.update(unconfirmed)  # the call confirmed the previous batch
            unconfirmed.clear()
            for p in got:
                assert p not in confirmed, f"{p} redelivered"
                at = tracked.pop(p)
                assert _trimmed(at, bits) <= clock.now, f"{p} delivered before its trimmed time"
                unconfirmed[p] = at
            if len(got) < a:
                late = [p for p, at in tracked.items() if at <= clock.now]
                assert not late, f"due {late} not delivered"
        elif kind == "flush":
            t.flush()
            confirmed.update(unconfirmed)
            unconfirmed.clear()
        else:
            if kind == "crash":
                crash(store)
            else:
                store.close()
            store = bucketstore.open(path, confirm_sync_ms=0, background=False)
            t = store.tracker("sub", cfg, clock)
            for p in confirmed:
                assert not t.contains_message(*p), f"confirmed {p} came back after a {kind}"
            for p in tracked:
                assert t.contains_message(*p), f"tracked {p} lost at a {kind}"
            for p, at in unconfirmed.items():  # not confirmed: delivered again
                assert t.contains_message(*p), f"unconfirmed {p} lost at a {kind}"
                tracked[p] = at
            unconfirmed.clear()
        assert t.number_of_delayed_messages == len(tracked)
        t._check()
    clock.advance(10**6)
    rest = t.get_scheduled_messages(10**6)
    assert sorted(rest) == sorted(tracked)
    store.close()
