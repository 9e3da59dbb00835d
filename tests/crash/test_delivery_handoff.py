"""The delivery handoff in journal mode (issue 12): at-least-once by default, at-most-once on request.

A batch returned by ``get_scheduled_messages`` becomes durably delivered only once the
embedder confirms it: at its next ``get_scheduled_messages``, at ``flush()``, or by
``confirm_delivered()``. A crash before that brings the batch back; a crash after it
never does. Every test here kills the tracker with the fault-injecting file layer at a
deterministic call number (the first durable call after the point of interest), so the
crash image holds exactly what was durable there.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from helpers import FakeClock, example_count
from hypothesis import example, given, settings
from hypothesis import strategies as st

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.store.store import Store
from bucketstore.testing.faults import (DAMAGES, ONLY_SYNCED, DataLoss, FaultyFileSystem, SimulatedCrash,
                                       abandon_store)

CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=6, max_indexes_per_segment=3,
                    max_time_step_per_segment_ms=300)


class Process:
    """One simulated process: a journal-mode store on the fault layer; ``die()`` crashes it
    right now (before its next durable call) and leaves only what was fsynced."""

    def __init__(self, path, clock, cfg=CFG, **open_args):
        self.path, self.clock, self.cfg, self.open_args = path, clock, cfg, open_args
        self.fs = FaultyFileSystem()
        self.store = Store(path, durability="journal", fs=self.fs, **{"confirm_sync_ms": 0, **open_args})
        self.fs.attach(self.store.catalog)
        self.tracker = self.store.tracker("sub", cfg, clock)

    def die(self) -> None:
        self.fs.crash_at = self.fs.calls  # the very next durable call would crash
        abandon_store(self.store)
        self.fs.materialize(ONLY_SYNCED, random.Random(0))

    def reopen(self) -> "Process":
        return Process(self.path, self.clock, self.cfg, **self.open_args)


def _delivered_again(proc: Process) -> list[tuple[int, int]]:
    proc.clock.now += 10**6
    return proc.tracker.get_scheduled_messages(10**6)


@pytest.fixture
def clock():
    return FakeClock(1000)


def test_a_batch_returned_right_before_a_crash_comes_back(tmp_path, clock):
    """The issue's failure: the call fsynced its frontier before returning, so a crash
    between the return and the embedder's use of the batch lost it."""
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(5)])
    clock.now = 1102
    batch = p.tracker.get_scheduled_messages(10)
    assert batch == [(1, 0), (1, 1), (1, 2)]
    p.die()
    q = p.reopen()
    assert all(q.tracker.contains_message(*pos) for pos in batch), "the unconfirmed batch was lost"
    assert sorted(_delivered_again(q)) == [(1, e) for e in range(5)]
    q.store.close()


def _tracked(tracker, positions):
    return {p for p in positions if tracker.contains_message(*p)}


# -- the confirmation point, crashed before every numbered call around it ------------------------
def _handoff_workload(tracker, clock, fs, marks):
    tracker.add_messages([(1, e, 1100 + e) for e in range(6)])
    clock.now = 1102
    marks["first"] = tracker.get_scheduled_messages(10)
    marks["returned"] = fs.calls  # the first call after this one is the kill point
    clock.now = 1104
    marks["second"] = tracker.get_scheduled_messages(10)  # confirms the first batch
    marks["confirmed"] = fs.calls


@pytest.mark.parametrize("damage", DAMAGES, ids=str)
def test_kill_points_between_the_return_and_the_confirming_call(tmp_path, damage):
    """Crash before every numbered durable call from the return of a batch up to the return
    of the call that confirms it: until the confirmation's journal group is durable the
    batch comes back, after it never does; the second batch (unconfirmed) always does."""
    dry = FaultyFileSystem()
    store = Store(tmp_path / "dry", durability="journal", fs=dry, confirm_sync_ms=0)
    dry.attach(store.catalog)
    marks: dict = {}
    dry_clock = FakeClock(1000)
    _handoff_workload(store.tracker("sub", CFG, dry_clock), dry_clock, dry, marks)
    store.close()
    first, second = marks["first"], marks["second"]
    assert first == [(1, 0), (1, 1), (1, 2)] and second == [(1, 3), (1, 4)]
    between = dry.log[marks["returned"]:marks["confirmed"]]
    assert [op for op, _ in between] == ["write", "fsync"], between  # one journal group: the frontier
    write_call, fsync_call = marks["returned"], marks["returned"] + 1
    everything = {(1, e) for e in range(6)}
    for n in range(marks["returned"], marks["confirmed"] + 1):
        path = tmp_path / f"crash{n}"
        clock = FakeClock(1000)
        fs = FaultyFileSystem(crash_at=n)
        store = Store(path, durability="journal", fs=fs, confirm_sync_ms=0)
        fs.attach(store.catalog)
        got: dict = {}
        with pytest.raises(SimulatedCrash):
            _handoff_workload(store.tracker("sub", CFG, clock), clock, fs, got)
            fs.crash_at = fs.calls  # killed right after the confirming call returned
            fs._call("write", "after the return")
        abandon_store(store)
        fs.materialize(damage, random.Random(n))
        with bucketstore.open(path, durability="journal") as reopened:
            t = reopened.tracker("sub", CFG, FakeClock(1000))
            held = _tracked(t, everything)
            assert everything - set(first) <= held, f"crash before call {n}: an unconfirmed index was lost"
            back = set(first) & held
            if n <= write_call or (n <= fsync_call and damage.data is not DataLoss.KEEP):
                assert back == set(first), f"crash before call {n}: the unconfirmed batch was lost"
            elif n > fsync_call:
                assert not back, f"crash before call {n}: the confirmed batch came back"
            else:
                assert back in (set(), set(first)), f"crash before call {n}: part of a batch came back"


def test_at_most_once_loses_the_batch_a_crash_interrupts_and_never_repeats_it(tmp_path, clock):
    """The explicit option keeps the old contract and its cost."""
    p = Process(tmp_path, clock, delivery="at-most-once")
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(5)])
    clock.now = 1102
    batch = p.tracker.get_scheduled_messages(10)
    p.die()
    q = p.reopen()
    assert not _tracked(q.tracker, batch), "at-most-once delivered a batch twice"
    assert sorted(_delivered_again(q)) == [(1, 3), (1, 4)]
    q.store.close()


def test_at_most_once_needs_a_journal(tmp_path):
    with pytest.raises(ValueError, match="at-most-once"):
        bucketstore.open(tmp_path, durability="sealed", delivery="at-most-once")
    with pytest.raises(ValueError, match="delivery"):
        bucketstore.open(tmp_path, durability="journal", delivery="exactly-once")


# -- what confirms, and what does not ---------------------------------------------------------------
@pytest.mark.parametrize("how", ["next-get", "empty-get", "flush", "confirm_delivered", "close", "nothing"])
def test_what_confirms_a_batch(tmp_path, clock, how):
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(5)])
    clock.now = 1102
    batch = p.tracker.get_scheduled_messages(10)
    if how == "next-get":
        assert p.tracker.get_scheduled_messages(10) == []
    elif how == "empty-get":
        assert p.tracker.get_scheduled_messages(0) == []
    elif how == "flush":
        p.tracker.flush()
    elif how == "confirm_delivered":
        p.tracker.confirm_delivered()
    if how == "close":
        p.store.close()  # a clean close does not confirm: the batch may not have been handled
        q = Process(tmp_path, clock)
    else:
        p.die()
        q = p.reopen()
    confirmed = how not in ("close", "nothing")
    assert _tracked(q.tracker, batch) == (set() if confirmed else set(batch))
    q.store.close()


def test_in_memory_trackers_have_confirm_delivered(clock):
    for tracker in (bucketstore.InMemoryTracker(CFG, clock), bucketstore.TimeBucketTracker(CFG, clock)):
        tracker.add_message(1, 0, 1100)
        clock.now = 1100
        assert tracker.get_scheduled_messages(10) == [(1, 0)]
        tracker.confirm_delivered()
        assert not tracker.contains_message(1, 0)
        tracker.close()
        with pytest.raises(bucketstore.StoreClosedError):
            tracker.confirm_delivered()
        clock.now = 1000


def test_sync_interval_widens_only_the_redelivery_window(tmp_path, clock):
    """With group commit, a confirmation made by a call can be lost with the window: the
    batch is then delivered again; nothing is ever lost."""
    p = Process(tmp_path, clock, sync_interval_ms=10**9)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(6)])
    p.tracker.flush()
    clock.now = 1101
    first = p.tracker.get_scheduled_messages(10)
    clock.now = 1103
    second = p.tracker.get_scheduled_messages(10)  # confirms the first, within the window
    p.die()
    q = p.reopen()
    assert _tracked(q.tracker, first + second) == set(first + second)
    assert sorted(_delivered_again(q)) == [(1, e) for e in range(6)]
    q.store.close()


# -- grouped confirmations (confirm_sync_ms): one fsync per window, a wider redelivery window ---------
def _journal_syncs(fs, since):
    return [op for op, target in fs.log[since:] if op in ("write", "fsync") and "journal" in target]


def test_a_drain_writes_nothing_until_its_confirmation_window_ends(tmp_path, clock):
    """With ``confirm_sync_ms`` longer than the drain, polls only confirm in memory: no journal
    write or fsync per call; a crash brings back every batch since the last commit (never
    loses one); the next add's commit (adds never wait) carries the confirmations, and from
    then on they never come back."""
    p = Process(tmp_path, clock, confirm_sync_ms=10**9)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(6)] + [(1, e, 9000) for e in range(6, 9)])
    before = p.fs.calls
    batches = []
    for now in (1100, 1101, 1102, 1103):
        clock.now = now
        batches.append(p.tracker.get_scheduled_messages(1))
    assert batches == [[(1, 0)], [(1, 1)], [(1, 2)], [(1, 3)]]
    assert _journal_syncs(p.fs, before) == [], "a poll committed although its window had not ended"
    assert p.tracker._journal.has_pending and not p.tracker._journal.urgent
    assert len(p.tracker._journal._pending) == 1, "consecutive confirmations must collapse to one record"
    p.die()
    q = p.reopen()
    assert _tracked(q.tracker, [b[0] for b in batches]) == {b[0] for b in batches}, "a batch was lost"
    clock.now = 1103
    assert q.tracker.get_scheduled_messages(10) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    clock.now = 1104
    assert q.tracker.get_scheduled_messages(1) == [(1, 4)]  # confirms the first batch, lazily
    q.tracker.add_message(3, 0, 9000)  # durable when it returns: its group carries the frontier
    assert q.tracker._journal.durable_frontier == (1103, 1, 3)
    q.die()
    r = q.reopen()
    clock.now = 1200
    assert sorted(r.tracker.get_scheduled_messages(10)) == [(1, 4), (1, 5)]  # (1, 4): not confirmed
    r.store.close()


def test_a_confirmation_window_commits_once_it_has_passed(tmp_path, clock, monkeypatch):
    """The window is measured from the last commit: the first poll after it commits (one write,
    one fsync), the polls inside it do not."""
    p = Process(tmp_path, clock, confirm_sync_ms=50)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(5)])
    now = [0.0]
    monkeypatch.setattr("bucketstore.engine.tracker.tracker.time.monotonic", lambda: now[0])
    p.tracker.flush()  # the last commit at t=0
    ops = []
    for t, at in ((0.010, 1100), (0.030, 1101), (0.060, 1102), (0.070, 1103)):
        now[0] = t
        clock.now = at
        before = p.fs.calls
        p.tracker.get_scheduled_messages(1)
        ops.append(_journal_syncs(p.fs, before))
    assert ops == [[], [], ["write", "fsync"], []]
    assert p.tracker._journal.durable_frontier == (1101, 1, 1)  # what the 60 ms poll confirmed
    p.store.close()


@pytest.mark.parametrize("how", ["flush", "close", "seal"])
def test_what_makes_grouped_confirmations_durable(tmp_path, clock, how):
    """``flush()`` (which also confirms), a clean ``close()`` (which commits what is pending) and
    a seal's checkpoint (which records the confirmed frontier) settle grouped confirmations."""
    p = Process(tmp_path, clock, confirm_sync_ms=10**9)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(4)])
    clock.now = 1101
    first = p.tracker.get_scheduled_messages(10)
    clock.now = 1102
    second = p.tracker.get_scheduled_messages(10)  # confirms the first, in memory only
    if how == "flush":
        p.tracker.flush()  # confirms the second too
    elif how == "close":
        p.store.close()
        p = p.reopen()
    else:
        p.tracker.add_messages([(2, e, 5000) for e in range(6)])  # fills the mutable bucket
        p.tracker.add_message(3, 0, 5000)  # rolls the ledger over: seal, checkpoint
        p.tracker.wait_for_maintenance()
        assert p.tracker.stats()["immutable_buckets"] == 1
    p.die()
    q = p.reopen()
    assert not _tracked(q.tracker, first), "a confirmation settled by %s came back" % how
    assert _tracked(q.tracker, second) == (set() if how == "flush" else set(second))
    q.store.close()


def test_at_most_once_frontiers_never_wait_for_the_confirmation_window(tmp_path, clock):
    """An at-most-once batch is durably delivered before it is returned, whatever the window:
    losing that frontier would deliver the batch twice."""
    p = Process(tmp_path, clock, confirm_sync_ms=10**9, delivery="at-most-once")
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(3)])
    clock.now = 1101
    before = p.fs.calls
    assert p.tracker.get_scheduled_messages(10) == [(1, 0), (1, 1)]
    assert _journal_syncs(p.fs, before) == ["write", "fsync"]
    p.die()
    q = p.reopen()
    assert not _tracked(q.tracker, [(1, 0), (1, 1)])
    q.store.close()


def test_confirm_sync_ms_is_validated(tmp_path):
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="confirm_sync_ms"):
            bucketstore.open(tmp_path, durability="journal", confirm_sync_ms=bad)


# -- every place that drops delivered rows durably keeps the unconfirmed ones ------------------------
def test_a_seal_checkpoint_carries_unconfirmed_rows_of_the_mutable_bucket(tmp_path, clock):
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(12)])
    clock.now = 1103
    batch = p.tracker.get_scheduled_messages(10)  # from the mutable bucket: in memory only
    assert batch == [(1, e) for e in range(4)]
    p.tracker.add_message(2, 0, 5000)  # rolls over: seals [1, 1] and checkpoints the journal
    p.tracker.wait_for_maintenance()  # installed (background): confirms nothing
    assert p.tracker.stats()["create"]["succeeded"] == 1
    p.die()
    q = p.reopen()
    assert _tracked(q.tracker, batch) == set(batch), "the checkpoint dropped the unconfirmed batch"
    assert sorted(_delivered_again(q)) == [(1, e) for e in range(12)] + [(2, 0)]
    q.store.close()


def test_a_seal_checkpoint_carries_unconfirmed_rows_of_a_sealed_bucket(tmp_path, clock):
    """Delivered rows of a sealed bucket are ghosts: the checkpoint's untrack for them
    must be followed by their rows, or recovery would untrack them for good."""
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(6)])
    p.tracker.add_messages([(2, e, 2100 + e) for e in range(6)])  # seals [1, 1]
    clock.now = 1101
    batch = p.tracker.get_scheduled_messages(10)
    assert batch == [(1, 0), (1, 1)]
    p.tracker.add_messages([(3, e, 3100 + e) for e in range(6)])  # seals [2, 2]: a checkpoint
    p.tracker.wait_for_maintenance()  # installed (background): confirms nothing
    assert p.tracker.stats()["create"]["succeeded"] == 2
    p.die()
    q = p.reopen()
    assert _tracked(q.tracker, batch) == set(batch), "the checkpoint untracked the unconfirmed batch"
    assert len(_delivered_again(q)) == 18
    q.store.close()


@pytest.mark.parametrize("background", [False, True], ids=["synchronous", "background"])
def test_a_merge_keeps_unconfirmed_rows(tmp_path, clock, background):
    cfg = dataclasses.replace(CFG, max_num_buckets=1)
    p = Process(tmp_path, clock, cfg, background=background)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(6)])
    p.tracker.add_messages([(2, e, 2100 + e) for e in range(6)])  # seals [1, 1]
    assert p.tracker.wait_for_maintenance(60)
    clock.now = 1101
    batch = p.tracker.get_scheduled_messages(10)
    assert batch == [(1, 0), (1, 1)]
    p.tracker.add_messages([(3, e, 3100 + e) for e in range(6)])  # seals [2, 2], merges [1, 2]
    assert p.tracker.wait_for_maintenance(60)  # confirms nothing, unlike flush()
    assert p.tracker.stats()["merge"]["succeeded"] == 1
    # The seal's checkpoint carries the batch too; the merged file must not count on it.
    (merged,) = p.tracker.buckets()
    assert merged.start_ledger == 1 and int(merged.counts.sum()) == 12, "the merge left out unconfirmed rows"
    p.die()
    q = p.reopen()
    assert _tracked(q.tracker, batch) == set(batch), "the merge left out the unconfirmed batch"
    assert len(_delivered_again(q)) == 18
    q.store.close()


def test_a_merge_still_leaves_out_confirmed_rows(tmp_path, clock):
    cfg = dataclasses.replace(CFG, max_num_buckets=1)
    p = Process(tmp_path, clock, cfg)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(6)])
    p.tracker.add_messages([(2, e, 2100 + e) for e in range(6)])
    clock.now = 1101
    batch = p.tracker.get_scheduled_messages(10)
    p.tracker.confirm_delivered()
    p.tracker.add_messages([(3, e, 3100 + e) for e in range(6)])  # merges [1, 2]
    p.tracker.wait_for_maintenance()  # installed (background): confirms nothing
    (merged,) = p.tracker.buckets()
    assert merged.start_ledger == 1 and int(merged.counts.sum()) == 10  # (1, 0) and (1, 1) left out
    p.die()
    q = p.reopen()
    assert not _tracked(q.tracker, batch)
    q.store.close()


def test_a_bucket_read_to_its_end_journals_its_unconfirmed_rows_before_it_is_deleted(tmp_path, clock):
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(6)])
    p.tracker.add_messages([(2, e, 2100 + e) for e in range(6)])  # seals [1, 1]
    clock.now = 1200
    batch = p.tracker.get_scheduled_messages(10)  # all of [1, 1]: the bucket is deleted
    assert batch == [(1, e) for e in range(6)]
    assert not p.tracker.buckets() and p.store.catalog.buckets("sub") == {}
    p.die()
    q = p.reopen()
    assert _tracked(q.tracker, batch) == set(batch), "deleting the bucket lost the unconfirmed batch"
    q.store.close()


# -- a position tracked again before its delivery is confirmed --------------------------------------
@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("sealed", [False, True])
def test_a_re_added_unconfirmed_position_comes_back_once_at_its_new_time(tmp_path, clock, sealed, checkpoint):
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(8)])
    if sealed:
        p.tracker.add_messages([(2, e, 2100 + e) for e in range(6)])  # seals [1, 1]
    clock.now = 1101
    assert p.tracker.get_scheduled_messages(10) == [(1, 0), (1, 1)]
    assert p.tracker.add_message(1, 0, 50_000)  # tracked again, due later
    if checkpoint:
        p.tracker.add_messages([(3 if sealed else 2, e, 3100 + e) for e in range(6)])  # a seal
        p.tracker.wait_for_maintenance()  # installed (background): confirms nothing
        assert p.tracker.stats()["create"]["succeeded"] == 1 + sealed
    p.die()
    q = p.reopen()
    assert q.tracker.contains_message(1, 0) and q.tracker.contains_message(1, 1)
    clock.now = 49_999
    got = q.tracker.get_scheduled_messages(100)
    assert (1, 1) in got and (1, 0) not in got, "the re-added position came out at its old time"
    clock.now = 50_000
    assert q.tracker.get_scheduled_messages(100) == [(1, 0)]
    q.store.close()


def test_a_second_crash_before_any_confirmation_still_brings_the_batch_back(tmp_path, clock):
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(6)])
    p.tracker.add_messages([(2, e, 2100 + e) for e in range(6)])
    clock.now = 1102
    batch = p.tracker.get_scheduled_messages(10)
    p.die()
    q = p.reopen()  # recovery checkpoints the journal
    assert q.tracker.get_scheduled_messages(10) == batch  # delivered again, not yet confirmed
    q.die()
    r = q.reopen()
    assert _tracked(r.tracker, batch) == set(batch)
    r.store.close()


def test_clear_forgets_unconfirmed_deliveries(tmp_path, clock):
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(6)])
    clock.now = 1102
    batch = p.tracker.get_scheduled_messages(10)
    p.tracker.clear()
    p.die()
    q = p.reopen()
    assert q.tracker.number_of_delayed_messages == 0 and not _tracked(q.tracker, batch)
    q.store.close()


def test_a_superseded_position_sealed_at_its_new_time_survives_a_checkpoint(tmp_path, clock):
    """Expired, re-added, delivered from the mutable bucket, re-added again, then sealed at the
    new time: the checkpoint must not untrack it (its live row is in the new bucket)."""
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(1, e, 1100 + e) for e in range(8)])
    assert not p.tracker.add_message(1, 0, 900)  # due: untracked (a ghost), dispatch now
    assert p.tracker.add_message(1, 0, 1050)  # tracked again, at a new time
    clock.now = 1050
    assert p.tracker.get_scheduled_messages(10) == [(1, 0)]  # from the mutable bucket, unconfirmed
    assert p.tracker.add_message(1, 0, 5000)  # superseded
    p.tracker.add_message(2, 0, 6000)  # rolls over: seals [1, 1] with (1, 0) at 5000; checkpoints
    p.tracker.wait_for_maintenance()  # installed (background): confirms nothing
    assert p.tracker.stats()["create"]["succeeded"] == 1
    p.die()
    q = p.reopen()
    assert q.tracker.contains_message(1, 0), "the checkpoint untracked a position sealed at its new time"
    clock.now = 4999
    assert (1, 0) not in q.tracker.get_scheduled_messages(100)
    clock.now = 5000
    assert q.tracker.get_scheduled_messages(100) == [(1, 0)]
    q.store.close()


# -- group commit: a wider redelivery window, never a loss -------------------------------------------
_add = st.tuples(st.just("add"), st.integers(3, 9), st.integers(1, 400))
_get = st.tuples(st.just("get"), st.integers(0, 10), st.just(0))
handoff_ops = st.lists(st.one_of(
    _add, _add, _get, _get,
    st.tuples(st.just("tick"), st.integers(0, 150), st.just(0)),
    st.tuples(st.just("confirm"), st.just(0), st.just(0)),
    st.tuples(st.just("flush"), st.just(0), st.just(0)),
    st.tuples(st.just("crash"), st.just(0), st.just(0)),
), max_size=60)


@settings(max_examples=example_count(100), deadline=None)
@given(handoff_ops, st.sampled_from([-1, 2]), st.sampled_from(["adds-grouped", "confirmations-grouped"]))
# A seal's checkpoint right after a delivery of flushed adds, then a crash: at-most-once's
# frontier would become durable there and lose the batch.
@example([("add", 9, 100), ("flush", 0, 0), ("tick", 150, 0), ("get", 10, 0), ("add", 9, 100), ("crash", 0, 0)], -1,
         "adds-grouped")
@example([("add", 9, 100), ("tick", 150, 0), ("get", 2, 0), ("get", 2, 0), ("get", 2, 0), ("crash", 0, 0),
          ("tick", 10, 0), ("get", 10, 0), ("get", 0, 0), ("add", 3, 100), ("crash", 0, 0)], -1, "confirmations-grouped")
def test_group_commit_widens_only_the_redelivery_window(tmp_path_factory, ops_list, max_buckets, policy):
    """``adds-grouped``: ``sync_interval_ms`` far away (commits only at flush, seals and bucket
    deletions). ``confirmations-grouped``: every add durable when it returns, confirmations
    (``confirm_sync_ms`` far away) durable at the next add or flush. Either way a crash keeps
    every add made durable and not since durably confirmed, and never brings back a delivery
    whose confirmation a commit made durable."""
    cfg = dataclasses.replace(CFG, max_num_buckets=max_buckets)
    path = tmp_path_factory.mktemp("gc")
    clock = FakeClock(1000)
    adds_commit = policy == "confirmations-grouped"
    p = Process(path, clock, cfg, **({"confirm_sync_ms": 10**9} if adds_commit else {"sync_interval_ms": 10**9}))
    ledger = 1
    added: set[tuple[int, int]] = set()  # since the last flush
    durable: set[tuple[int, int]] = set()  # added before a flush, not durably confirmed since
    delivered: list[tuple[int, int]] = []  # since the last confirmation
    confirmed: set[tuple[int, int]] = set()  # confirmed, not yet flushed
    gone: set[tuple[int, int]] = set()  # confirmed and flushed: never to come back
    for kind, a, b in ops_list:
        if kind == "add":
            rows = [(ledger, i, clock.now + b + (i * 53) % 300) for i in range(a)]  # spread: part falls due
            ledger += 1  # each batch rolls the log over: the previous ledger seals if big enough
            assert p.tracker.add_messages(rows) == a
            added.update((l, e) for l, e, _ in rows)
            if adds_commit:  # the add's group, fsynced before it returned, carries the confirmations
                durable = (durable | added) - confirmed
                gone |= confirmed
                added, confirmed = set(), set()
        elif kind == "tick":
            clock.advance(a)
        elif kind in ("get", "confirm", "flush"):
            confirmed.update(delivered)
            delivered = []
            if kind == "get":
                delivered = p.tracker.get_scheduled_messages(a)
                assert not set(delivered) & (gone | confirmed), "delivered twice in one lifetime"
            elif kind == "confirm":
                p.tracker.confirm_delivered()
            else:
                p.tracker.flush()
                durable = (durable | added) - confirmed
                gone |= confirmed
                added, confirmed = set(), set()
        else:
            p.die()
            p = p.reopen()
            tracked = _tracked(p.tracker, durable | added | confirmed | gone | set(delivered))
            # (A confirmation not yet flushed may have been made durable by a seal's checkpoint.)
            must = durable - confirmed
            assert must <= tracked, f"lost {sorted(must - tracked)[:5]}"
            assert not tracked & gone, f"durably confirmed deliveries came back: {sorted(tracked & gone)[:5]}"
            durable, added, confirmed, delivered = tracked, set(), set(), []
    p.store.close()


# -- found by the journal crash state machine ----------------------------------------------------------
def test_a_position_re_added_before_confirmation_keeps_its_new_time_across_two_recoveries(tmp_path, clock):
    """Delivered from a sealed bucket, re-added (superseded) and the tracker reopened: the first
    recovery tracked it at its new time, but its checkpoint wrote only the new row, without an
    untrack: the second recovery tracked it again from the bucket's bitmap at its old time,
    delivered it early, and left the frontier behind what had been confirmed."""
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(2, e, 1015 + 11 * e) for e in range(6)])
    p.tracker.add_message(3, 0, 1015)  # rolls over: seals [2, 2]
    clock.now = 1015
    assert p.tracker.get_scheduled_messages(2) == [(2, 0), (3, 0)]
    assert p.tracker.add_message(2, 0, 1016)  # tracked again, before the batch is confirmed
    p.store.close()  # a close does not confirm: (3, 0) comes back
    q = p.reopen()
    q.die()
    r = q.reopen()
    assert r.tracker.get_scheduled_messages(1) == [(3, 0)], "the re-added position came out at its old time"
    clock.now = 1016
    assert r.tracker.get_scheduled_messages(1) == [(2, 0)]
    r.store.close()


def test_an_expired_re_add_of_a_sealed_position_keeps_its_new_time_across_two_recoveries(tmp_path, clock):
    """The same through an expired re-add (the open finding of docs/crash_safety.md): the
    first recovery's checkpoint lost the untrack of a position tracked again at a new time."""
    p = Process(tmp_path, clock)
    p.tracker.add_messages([(2, e, 5000 + e) for e in range(6)])
    p.tracker.add_message(3, 0, 9000)  # seals [2, 2]
    assert not p.tracker.add_message(2, 0, 900)  # due: untracked, dispatched now
    assert p.tracker.add_message(2, 0, 7000)  # tracked again, later
    p.store.close()
    q = p.reopen()
    q.die()
    r = q.reopen()
    clock.now = 6000
    assert (2, 0) not in r.tracker.get_scheduled_messages(100), "delivered at its old time"
    clock.now = 7000
    assert r.tracker.get_scheduled_messages(100) == [(2, 0)]
    r.store.close()
