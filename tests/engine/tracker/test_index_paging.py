"""Sealed buckets paged out of the tracker-wide index (engine/buckets/index_pager.py) stay exact.

The differential workloads run again with the pager sweeping at every chance (after every
install and delivery call, and at every step they check), so buckets go out and come back in
between every kind of step: adds to covered ledgers, expiries, deliveries, trims, merges,
checkpoints; the tests below aim at each entry point and at a journal reopen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.buckets import index_pager
from bucketstore.engine.tracker.tracker import BucketTracker
from bucketstore.format import bucket_summary

import test_tracker_differential as differential
from helpers import FakeClock, example_count
from repo_paths import TESTS


def _crash_module(name: str):
    """A test module of tests/crash/ (another folder: not on this one's import path)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TESTS / "crash" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@contextlib.contextmanager
def _paging():
    """Sweep at every install and delivery call, and at every step the differential checks."""
    with pytest.MonkeyPatch.context() as mp:
        # Every tracker's budget (TrackerConfig.max_resident_ledgers) 0, whatever config the
        # workload chose, and no growth rule.
        init = index_pager.IndexPager.__init__
        mp.setattr(index_pager.IndexPager, "__init__", lambda self, budget: init(self, 0))
        mp.setattr(index_pager, "GROWTH", 0)
        check = BucketTracker._check

        def sweep_then_check(tracker):
            with tracker._lock:
                tracker._pager.sweep(tracker)
                check(tracker)

        mp.setattr(BucketTracker, "_check", sweep_then_check)
        yield


@pytest.fixture
def page_always():
    with _paging():
        yield


# The differential workloads, fewer examples than in their own module (they run there too).
@settings(max_examples=example_count(40), deadline=None)
@given(differential.ops, st.sampled_from(differential.CONFIGS))
def test_differential_with_paging(tmp_path_factory, ops_list, config):
    with _paging():
        differential.test_bucket_tracker_matches_model_and_in_memory.hypothesis.inner_test(
            tmp_path_factory, ops_list, config)


@settings(max_examples=example_count(8), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), max_buckets=st.integers(1, 3))
def test_merging_workload_with_paging(tmp_path_factory, seed, max_buckets):
    with _paging():
        differential.test_merging_workload_matches_model.hypothesis.inner_test(tmp_path_factory, seed, max_buckets)


@settings(max_examples=example_count(25), deadline=None)
@given(differential.ops, st.sampled_from([3, 6]), st.sampled_from([-1, 2]))
def test_time_bucketed_with_paging(tmp_path_factory, ops_list, bits, max_buckets):
    with _paging():
        differential.test_time_bucketed_tracker_matches_model_and_time_bucket_tracker.hypothesis.inner_test(
            tmp_path_factory, ops_list, bits, max_buckets)


CONFIG = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=20, max_indexes_per_segment=8)


def _fill(tracker, model, rng, clock, ledgers, start=0):
    for ledger in range(start, start + ledgers):
        for entry in rng.sample(range(200), 12):
            at = clock.now + rng.randint(1_000, 50_000)
            if tracker.add_message(ledger, entry, at):
                model[(ledger, entry)] = at


@pytest.mark.parametrize("budget, paged", [(8, True), (TrackerConfig().max_resident_ledgers, False)])
def test_max_resident_ledgers_decides_when_buckets_leave_the_index(tmp_path, budget, paged):
    """The option alone, with the pager's own growth rule: 40 ledgers sealed into buckets of
    about two go past a budget of 8 (sweeps leave the index near the budget, and answers stay
    exact) but not past the default."""
    rng = random.Random(3)
    clock = FakeClock(1_000)
    model: dict[tuple[int, int], int] = {}
    with bucketstore.open(tmp_path, durability="sealed", background=False) as store:
        t = store.tracker("sub", dataclasses.replace(CONFIG, max_resident_ledgers=budget), clock)
        _fill(t, model, rng, clock, 40)
        t.flush()
        t._check()
        stats = t.stats()["membership"]
        assert (stats["paged_buckets"] > 0) == paged and (stats["sweeps"] > 0) == paged, stats
        if paged:
            assert t._index.ledger_count() <= 2 * budget + 4  # the growth rule's slack, a bucket's span
        assert t.number_of_delayed_messages == len(model)
        for ledger, entry in list(model)[::5]:
            assert t.contains_message(ledger, entry)


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1 << 63, ValueError), (True, TypeError),
                                        (8.0, TypeError), ("8192", TypeError)])
def test_max_resident_ledgers_rejects_bad_values(bad, error):
    with pytest.raises(error, match="TrackerConfig.max_resident_ledgers"):
        TrackerConfig(max_resident_ledgers=bad)


@pytest.mark.parametrize("durability", ["journal", "sealed"])
def test_paged_buckets_answer_count_trim_and_deliver_exactly(tmp_path, page_always, durability):
    """Buckets sealed by this process leave the index (their bitmaps are in the spill) and every
    question, count, re-add, expiry, trim and delivery stays exact; reopening agrees."""
    rng = random.Random(7)
    clock = FakeClock(1_000)
    model: dict[tuple[int, int], int] = {}
    with bucketstore.open(tmp_path, durability=durability, background=False) as store:
        t = store.tracker("sub", CONFIG, clock)
        _fill(t, model, rng, clock, 40)
        t.flush()
        t._check()
        stats = t.stats()
        assert stats["membership"]["paged_buckets"] >= 5, stats["membership"]
        paged = [b for b in t.buckets() if b.paged is not None]
        # Their ledgers are out of the index, their positions still counted and answered.
        assert not any(paged[0].start_ledger <= l <= paged[0].end_ledger for l in t._index.ledger_ids().tolist())
        assert t.number_of_delayed_messages == len(model)
        for ledger in range(40):
            for entry in range(0, 200, 7):
                assert t.contains_message(ledger, entry) == ((ledger, entry) in model)
        # A re-add to a paged bucket's ledger at another time, an expiry, a duplicate.
        b = paged[1]
        (l1, e1), (l2, e2) = [p for p in sorted(model) if b.start_ledger <= p[0] <= b.end_ledger][:2]
        assert t.add_message(l1, e1, clock.now + 77_000)
        model[(l1, e1)] = clock.now + 77_000
        assert not t.add_message(l2, e2, clock.now - 5)  # already due: untracked, dispatch now
        del model[(l2, e2)]
        assert b.paged is None  # paged back in to change it
        t._check()
        assert t.number_of_delayed_messages == len(model)
        # A trim through a paged bucket.
        cut = paged[2]
        mid = (cut.start_ledger + cut.end_ledger) // 2
        t.mark_delete(mid, 100)
        model = {p: at for p, at in model.items() if p > (mid, 100)}
        t._check()
        assert t.number_of_delayed_messages == len(model)
        # Deliver half (buckets page in as the queue reaches them), then more adds and a sweep.
        clock.advance(25_000)
        due = sorted(p for p, at in model.items() if at <= clock.now + CONFIG.tick_time_ms)
        got = t.get_scheduled_messages(10**6)
        assert got == due
        for p in got:
            del model[p]
        _fill(t, model, rng, clock, 20, start=40)
        t.flush()
        t._check()
        assert t.number_of_delayed_messages == len(model)
        for (ledger, entry) in list(model)[::5]:
            assert t.contains_message(ledger, entry)
        assert t.stats()["membership"]["paged_in"] >= 1
    if durability == "sealed":
        return  # (sealed mode keeps only what seals wrote, and skips due segments at open)
    with bucketstore.open(tmp_path, durability=durability) as store:
        t = store.tracker("sub", CONFIG, clock)
        assert t.number_of_delayed_messages == len(model)
        clock.advance(10**6)
        assert t.get_scheduled_messages(10**6) == sorted(model)


def test_a_bucket_being_delivered_stays_in_the_index(tmp_path, page_always):
    """A bucket whose loaded segment has been read from is the frontier's: not paged out."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, background=False) as store:
        t = store.tracker("sub", CONFIG, clock)
        for ledger in range(4):
            for entry in range(30):
                t.add_message(ledger, entry, clock.now + 1_000 + 1_000 * ledger + 10 * entry)
        t.add_message(10, 0, clock.now + 10**6)  # rolls: seals the last of ledgers 0..3
        t.flush()
        b = t.buckets()[0]
        assert b.paged is not None  # idle: its untouched segment 1 went back to disk
        clock.advance(1_100)
        assert len(t.get_scheduled_messages(3)) == 3  # pages it in, reads from segment 1
        assert b.paged is None
        t._pager.sweep(t)
        assert b.paged is None and t.stats()["unopened_buckets"] == 0
        t._check()


@pytest.mark.parametrize("queued", [False, True])
def test_a_bucket_whose_ledger_has_loose_adds_stays_in_the_index(tmp_path, page_always, queued):
    """An add to a covered ledger waits in the direct buffer, then in a run of the queue, until
    it is delivered; the index must hold its bucket's bitmaps meanwhile."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, background=False) as store:
        t = store.tracker("sub", CONFIG, clock)
        for ledger in range(4):
            for entry in range(30):
                t.add_message(ledger, entry, clock.now + 10**6)
        t.add_message(10, 0, clock.now + 10**6)
        t.flush()
        b = t.buckets()[0]
        assert b.paged is not None
        assert t.add_message(b.start_ledger, 500, clock.now + 100)  # pages it in; buffered
        if queued:
            assert t.next_delivery_time() == clock.now + 100  # the buffer becomes a run of the queue
        t._pager.sweep(t)
        assert b.paged is None
        clock.advance(200)
        assert t.get_scheduled_messages(10) == [(b.start_ledger, 500)]
        t._check()


def test_a_checkpoint_asks_the_spill_about_a_paged_out_ghost(tmp_path, page_always):
    """A position expired and added again before its ledger was sealed is a ghost whose live row
    is in the bucket: a journal checkpoint taken while the bucket is paged out must not write
    an untrack for it (the index alone would say it is not tracked), or a reopen loses it."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, background=False) as store:
        t = store.tracker("sub", CONFIG, clock)
        assert t.add_message(0, 5, clock.now + 50_000)
        assert not t.add_message(0, 5, clock.now - 1)  # due: untracked, a ghost now
        assert t.add_message(0, 5, clock.now + 60_000)  # tracked again, live at this time
        for entry in range(6, 40):
            t.add_message(0, entry, clock.now + 70_000)
        for ledger in (1, 2):  # each roll seals the ledger before; each seal checkpoints
            for entry in range(30):
                t.add_message(ledger, entry, clock.now + 70_000)
        t.flush()
        first = t.buckets()[0]
        assert first.start_ledger == 0 and first.paged is not None
        assert t.contains_message(0, 5)
        t._checkpoint()
        held = t.number_of_delayed_messages
    with bucketstore.open(tmp_path) as store:
        t = store.tracker("sub", CONFIG, clock)
        assert t.contains_message(0, 5)
        assert t.number_of_delayed_messages == held
        clock.advance(60_000)
        assert t.get_scheduled_messages(10) == [(0, 5)]


@pytest.mark.parametrize("wide", [False, True])
def test_a_pinned_spill_gives_back_every_position(wide):
    """What a page-in reads back is what was paged out, whatever form each ledger was spilled in
    (sorted ids; a run-heavy ledger as a serialized bitmap; a long one of few runs held in memory;
    64-bit ids), and a pinned directory survives a budget that drops every other one."""
    from pyroaring import BitMap, BitMap64

    from bucketstore.engine.buckets.sealed_membership import SpilledMembership

    rng = random.Random(3)
    positions = {
        100: BitMap(rng.sample(range(50_000), 40)),                          # sparse: ids
        101: BitMap(list(range(10, 90)) + list(range(200, 260))),            # runs, spilled as a bitmap
        102: BitMap(range(5_000, 9_000)),                                    # few runs, held in memory
        105: BitMap([7]),
    }
    if wide:
        positions[106] = BitMap64([1, 2**40 + 5])
    m = SpilledMembership(None, budget=1)
    assert m.add(1, 100, positions, pinned=True)
    assert m.add(2, 200, {200: BitMap([1, 5, 9])})  # unpinned: dropped under the budget ...
    assert m.add(3, 300, {300: BitMap([2, 4])})
    assert m.contains(2, 200, 5) is None and m.contains(1, 100, 7) is False  # ... the pinned one stays
    back = m.positions(1)
    assert sorted(back) == sorted(positions)
    for ledger, ids in back.items():
        assert sorted(int(v) for v in ids) == sorted(positions[ledger]), ledger
    m.close()


def test_sigkill_journal_writer_with_paging(tmp_path, monkeypatch):
    """The SIGKILL journal test (test_sigkill.py) with the pager sweeping at every chance in the
    killed writers (forked: they inherit it) and in the checks: what was added and not
    confirmed comes back, nothing confirmed does, whatever was paged out when the kill came.
    Background maintenance: the kills land inside seals and merges too."""
    test_sigkill = _crash_module("test_sigkill")
    monkeypatch.setattr(test_sigkill, "JOURNAL_KILLS", int(os.environ.get("BUCKETSTORE_PAGING_KILLS", "15")))
    with _paging():
        test_sigkill.test_sigkill_journal_writer_at_least_once(tmp_path, True, 0)


# Buckets of one ledger each, their segments 120, 120 and 8 rows, summaries keeping 8 rows.
# A prefix run then has its bucket's last segment's length: going by length alone, it would
# pass for that bucket's loaded segment, untouched.
_PREFIX, _SEG, _LEDGERS = 8, 120, 16
_PER_LEDGER = 2 * _SEG + _PREFIX


def _first_due(rows: dict[tuple[int, int], int], n: int, cutoff: int) -> list[tuple[int, int]]:
    due = sorted((at, ledger, entry) for (ledger, entry), at in rows.items() if at <= cutoff)[:n]
    return sorted((ledger, entry) for _, ledger, entry in due)


def test_buckets_with_queued_prefixes_stay_exact_under_paging(tmp_path, monkeypatch):
    """After a reopen each bucket's first rows are a run from its catalog summary, tracked in the
    index while its file is unread (bucket_prefix). Some are delivered, every bucket is then
    opened (an add of a due row), and the pager sweeps at every step: a bucket whose prefix run
    is still queued must keep its bitmaps in the index (delivering the run untracks them there);
    once its segments load it may go out and come back. Deliveries, counts and membership
    (delivered and held prefix rows too) must equal the model's at every step."""
    monkeypatch.setattr(bucket_summary, "PREFIX_ROWS", _PREFIX)
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=_PER_LEDGER, max_indexes_per_segment=_SEG)
    rng = random.Random(11)
    rows: dict[tuple[int, int], int] = {}
    with bucketstore.open(tmp_path / "s", "sealed", background=False) as store:
        t = store.tracker("t", cfg, FakeClock(1_000))
        for ledger in range(_LEDGERS):
            for entry in range(_PER_LEDGER):
                rows[(ledger, entry)] = at = rng.randrange(2_000, 12_000)
                t.add_message(ledger, entry, at)
        t.add_message(_LEDGERS, 0, 90_000)  # roll: the last full ledger is sealed (sealed mode
        t.flush()                            # keeps no row of the mutable bucket)
        assert [b.counts.tolist() for b in t.buckets()] == [[_SEG, _SEG, _PREFIX]] * _LEDGERS
    clock = FakeClock(1_000)
    with _paging(), bucketstore.open(tmp_path / "s", "sealed", background=False) as store:
        t = store.tracker("t", cfg, clock)
        assert t.stats()["unopened_buckets"] == _LEDGERS
        clock.now = 2_200  # in the prefixes' time span (each bucket's first rows of 248 in 10 s)
        delivered: list[tuple[int, int]] = []

        def deliver(n: int) -> int:
            batch = t.get_scheduled_messages(n)
            assert batch == _first_due(rows, n, clock.now)
            for p in batch:
                del rows[p]
            delivered.extend(batch)
            return len(batch)

        def check() -> None:
            t._check()  # sweeps first (see _paging), then the pager's and the counters' invariants
            assert t.number_of_delayed_messages == len(rows)
            held = list(rows)
            asked = delivered[-40:] + held[:: max(1, len(held) // 200)] + \
                [(ledger, entry) for ledger in range(_LEDGERS) for entry in range(0, _PER_LEDGER, 17)]
            for p in asked:
                assert t.contains_message(*p) == (p in rows), p

        deliver(_LEDGERS * _PREFIX // 4)  # part of the prefixes: no file read
        assert delivered
        assert t.stats()["unopened_buckets"] == _LEDGERS
        check()
        for ledger in range(_LEDGERS):
            assert not t.add_message(ledger, _PER_LEDGER + 5, 5)  # due: nothing tracked, the bucket opened
        assert t.stats()["unopened_buckets"] == 0
        assert any(b.head is not None and b.current == 0 for b in t.buckets())  # prefix runs still queued
        check()
        while rows:
            # Time goes by in steps: a bucket whose loaded segment is delivered waits idle for
            # its next one (then pageable), while others still deliver their prefix.
            clock.now += 300
            while deliver(37) == 37:
                check()
            check()
        assert t.number_of_delayed_messages == 0
        assert t.get_scheduled_messages(10**6) == []
        pager = t.stats()["membership"]
        assert pager["paged_out"] > 0 and pager["paged_in"] > 0, pager
