"""Journal durability: torn tails, damage, checkpoints, and tracker recovery with a delivery frontier."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import FakeClock, example_count
from hypothesis import given, settings
from hypothesis import strategies as st

import bucketstore
from bucketstore import JournalError, TrackerConfig
from bucketstore.testing import abandon_store
from bucketstore.engine.durability.journal import Journal, has_journal, journal_directory, read_frontier

CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=6, max_indexes_per_segment=3,
                    max_time_step_per_segment_ms=300)


def crash(store) -> None:
    """Throw the process state away: release OS handles without any clean-shutdown write.
    The store's worker threads stop first (a dead process has none): a seal in flight beside
    the next open would otherwise fail against the closed catalog and remove its own file while
    that open lists the orphans."""
    for tracker in list(store._trackers.values()):
        if tracker._journal is not None:
            tracker._journal._pending.clear()
            tracker._journal.close()
    abandon_store(store)
    store._closed = True


def _journal_with_groups(path, groups):
    j = Journal(str(path))
    for ledger in range(groups):
        j.add_one(ledger, 1, 100 + ledger)
        j.commit()
    j.close()
    (name,) = os.listdir(path)
    return os.path.join(path, name)


def test_torn_tail_is_cut_at_every_length(tmp_path):
    full = _journal_with_groups(tmp_path / "ref", 3)
    data = open(full, "rb").read()
    for cut in range(len(data) - 40, len(data)):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        with open(d / os.path.basename(full), "wb") as f:
            f.write(data[:cut])
        state = Journal(str(d)).replay()
        ledgers = [int(r[1][0]) for r in state.records]
        assert ledgers == [0, 1] or ledgers == [0, 1, 2][: len(ledgers)]
        assert state.cut_bytes > 0 or len(ledgers) == 3


def test_zeroed_tail_is_cut_and_middle_damage_is_an_error(tmp_path):
    full = _journal_with_groups(tmp_path / "ref", 3)
    data = bytearray(open(full, "rb").read())
    zeroed = tmp_path / "zeroed"
    zeroed.mkdir()
    tail = data[:-10] + bytes(10)
    (zeroed / os.path.basename(full)).write_bytes(bytes(tail) + bytes(4096))
    state = Journal(str(zeroed)).replay()
    assert [int(r[1][0]) for r in state.records] == [0, 1]
    middle = tmp_path / "middle"
    middle.mkdir()
    damaged = bytearray(data)
    damaged[50] ^= 0x55  # inside the first group's body: later groups are intact
    (middle / os.path.basename(full)).write_bytes(bytes(damaged))
    with pytest.raises(JournalError) as info:
        Journal(str(middle)).replay()
    assert info.value.path.endswith(".journal") and 20 <= info.value.offset < 60


def test_checkpoint_supersedes_older_files_even_if_they_survive(tmp_path):
    j = Journal(str(tmp_path))
    j.add_one(1, 1, 10)
    j.commit()
    old = sorted(os.listdir(tmp_path))
    saved = {name: (tmp_path / name).read_bytes() for name in old}
    j.checkpoint(np.array([2], np.uint64), np.array([2], np.uint64), np.array([20], np.uint64), (5, 0, 0))
    j.close()
    for name, data in saved.items():  # a crash before the old files' unlink became durable
        (tmp_path / name).write_bytes(data)
    state = Journal(str(tmp_path)).replay()
    assert [(int(r[1][0]), int(r[3][0])) for r in state.records] == [(2, 20)]
    assert state.frontier == (5, 0, 0)
    assert len(os.listdir(tmp_path)) == 1  # the superseded file is removed by the replay


def _snapshot(directory):
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


def test_read_frontier_reads_a_torn_journal_without_touching_it(tmp_path):
    store = str(tmp_path)
    directory = journal_directory(store, "t\u00e9")
    j = Journal(directory)
    j.add_one(1, 1, 10)
    j.frontier((10, 1, 1))
    j.commit()
    j.frontier((20, 2**63 + 5, 7))
    j.commit()
    j.close()
    (name,) = os.listdir(directory)
    with open(os.path.join(directory, name), "ab") as f:  # a group whose write never completed
        f.write(bytes.fromhex("40000000deadbeef") + b"partial")
    with open(os.path.join(directory, "00000000000000000009.journal.tmp"), "wb") as f:
        f.write(b"an interrupted checkpoint")
    before = _snapshot(directory)
    assert read_frontier(store, "t\u00e9") == (20, 2**63 + 5, 7)
    assert _snapshot(directory) == before  # nothing cut, nothing removed
    # The writer's replay agrees on the frontier and does repair: the tail was torn indeed.
    state = Journal(directory).replay()
    assert state.frontier == (20, 2**63 + 5, 7) and state.cut_bytes == len(bytes.fromhex("40000000deadbeef")) + 7
    assert _snapshot(directory) != before


def test_read_frontier_ignores_files_a_checkpoint_superseded(tmp_path):
    store = str(tmp_path)
    directory = journal_directory(store, "t")
    j = Journal(directory)
    # A frontier no checkpoint would carry over, so that counting the superseded file shows.
    j.frontier((50, 0, 0))
    j.commit()
    old = _snapshot(directory)
    j.checkpoint(np.array([], np.uint64), np.array([], np.uint64), np.array([], np.uint64), (5, 0, 0))
    j.close()
    for name, data in old.items():  # a crash before the old file's unlink became durable
        (tmp_path / "journal" / os.path.basename(directory) / name).write_bytes(data)
    before = _snapshot(directory)
    assert len(before) == 2
    assert read_frontier(store, "t") == (5, 0, 0)
    assert _snapshot(directory) == before  # the superseded file is left for the writer to remove


def test_read_frontier_without_a_journal_or_a_delivery_is_none(tmp_path):
    store = str(tmp_path)
    assert read_frontier(store, "t") is None and not has_journal(store, "t")  # sealed mode
    j = Journal(journal_directory(store, "t"))
    j.add_one(1, 1, 10)
    j.commit()
    j.close()
    assert read_frontier(store, "t") is None and has_journal(store, "t")  # journal mode, nothing delivered


def test_read_frontier_reports_damage_that_is_not_a_torn_tail(tmp_path):
    full = _journal_with_groups(journal_directory(str(tmp_path), "t"), 3)
    data = bytearray(open(full, "rb").read())
    data[50] ^= 0x55
    open(full, "wb").write(bytes(data))
    with pytest.raises(JournalError) as info:
        read_frontier(str(tmp_path), "t")
    assert info.value.path == full


class Oracle:
    def __init__(self):
        self.tracked: dict[tuple[int, int], int] = {}

    def add(self, ledger, entry, at, cutoff):
        if at <= cutoff:
            self.tracked.pop((ledger, entry), None)
            return False
        self.tracked.setdefault((ledger, entry), at)
        return True


ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 30), st.integers(1, 2000)),
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 30), st.integers(-100, 2000)),
    st.tuples(st.just("roll"), st.integers(1, 2), st.just(0), st.just(0)),
    st.tuples(st.just("tick"), st.integers(0, 300), st.just(0), st.just(0)),
    st.tuples(st.just("pop"), st.integers(0, 12), st.just(0), st.just(0)),
    st.tuples(st.just("crash"), st.just(0), st.just(0), st.just(0)),
), max_size=80)


@settings(max_examples=example_count(120))
@given(ops, st.sampled_from([-1, 2]), st.sampled_from(["at-least-once", "at-most-once"]))
def test_journal_mode_loses_nothing_and_never_redelivers_across_crashes(tmp_path_factory, ops_list, max_buckets,
                                                                        delivery):
    """With every call durable (sync_interval_ms=0), a crash at any point loses no tracked
    index, brings back none whose delivery was confirmed (at-most-once: none delivered),
    brings back every one whose delivery was not (at-least-once: the last batch, unless a
    position of it was tracked again), and delivers everything due."""
    import dataclasses

    cfg = dataclasses.replace(CFG, max_num_buckets=max_buckets)
    path = tmp_path_factory.mktemp("j")
    clock = FakeClock(1000)
    oracle = Oracle()
    store = bucketstore.open(path, durability="journal", delivery=delivery, confirm_sync_ms=0)
    tracker = store.tracker("sub", cfg, clock)
    base = 0
    delivered: set[tuple[int, int]] = set()
    unconfirmed: dict[tuple[int, int], int] = {}  # the last batch, at its times
    for kind, a, b, c in ops_list:
        if kind == "add":
            cutoff = max(tracker._cutoff.value, clock.now)
            expect = oracle.add(base + a, b, clock.now + c, cutoff)
            assert tracker.add_message(base + a, b, clock.now + c) == expect
            if expect:
                delivered.discard((base + a, b))  # tracked anew: delivering it again is right
                unconfirmed.pop((base + a, b), None)  # and its new time replaces its redelivery
        elif kind == "roll":
            base += a
        elif kind == "tick":
            clock.advance(a)
        elif kind == "pop":
            got = tracker.get_scheduled_messages(a)
            delivered.update(unconfirmed)  # the call confirmed the previous batch
            unconfirmed.clear()
            for p in got:
                assert p not in delivered, "redelivered"
                at = oracle.tracked.pop(p)
                assert at <= clock.now, "delivered early"
                if delivery == "at-least-once":
                    unconfirmed[p] = at
                else:
                    delivered.add(p)
        else:
            crash(store)
            store = bucketstore.open(path, durability="journal", delivery=delivery, confirm_sync_ms=0)
            tracker = store.tracker("sub", cfg, clock)
            for p, at in unconfirmed.items():  # not confirmed: delivered again
                assert tracker.contains_message(*p), f"unconfirmed {p} lost"
                oracle.tracked[p] = at
            unconfirmed.clear()
        assert tracker.number_of_delayed_messages == len(oracle.tracked)
        tracker._check()
    clock.advance(10**6)
    rest = tracker.get_scheduled_messages(10**6)
    assert sorted(rest) == sorted(oracle.tracked)
    assert not delivered & set(rest)
    store.close()


WRITER = textwrap.dedent("""
    import sys, bucketstore
    path, seed = sys.argv[1], int(sys.argv[2])
    cfg = bucketstore.TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=200, max_indexes_per_segment=50)
    now = [1_000 + seed * 10**6]  # the writer's clock keeps running across restarts
    store = bucketstore.open(path, durability="journal", sync_interval_ms=5)
    t = store.tracker("sub", cfg, lambda: now[0])
    start = t.number_of_delayed_messages
    i = seed * 10**6
    out = sys.stdout
    while True:
        batch = [(i // 300, i % 300 + j, now[0] + 1 + (i + j) * 7 % 5000) for j in range(20)]
        t.add_messages(batch)
        t.flush()
        out.write(f"A {batch[0][0]} {batch[0][1]} {len(batch)}\\n")
        i += 300 if (i % 300) + 40 >= 300 else 20
        now[0] += 3
        got = t.get_scheduled_messages(15)
        t.flush()
        out.write("D " + " ".join(f"{l}:{e}" for l, e in got) + "\\n")
        out.flush()
""")


def test_sigkill_of_a_journaled_writer_loses_nothing_flushed(tmp_path):
    """A real writer process is SIGKILLed at random moments; whatever it flushed (adds and
    deliveries) must be exactly what recovery sees."""
    kills = int(os.environ.get("BUCKETSTORE_KILLS", 12))
    rng = random.Random(7)
    path = tmp_path / "store"
    added: dict[tuple[int, int], None] = {}
    delivered: set[tuple[int, int]] = set()
    for k in range(kills):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(k)], stdout=subprocess.PIPE, text=True)
        lines = []
        for _ in range(rng.randint(5, 60)):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        proc.kill()
        proc.wait()
        # Lines are whole (each is one small pipe write): take every one the writer got out.
        lines += [line for line in proc.stdout.read().splitlines(keepends=True) if line.endswith("\n")]
        for line in lines:  # a line is printed only after its flush() returned
            parts = line.split()
            if parts[0] == "A":
                ledger, entry, n = map(int, parts[1:])
                for j in range(n):
                    added[(ledger, entry + j)] = None
            else:
                for p in parts[1:]:
                    ledger, entry = map(int, p.split(":"))
                    delivered.add((ledger, entry))
        with bucketstore.open(path, durability="journal") as store:
            t = store.tracker("sub", TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=200,
                                                   max_indexes_per_segment=50), FakeClock(0))
            for p in delivered:
                assert not t.contains_message(*p), f"delivered {p} came back after kill {k}"
            # Only the call in flight at the kill may differ from what the writer reported:
            # a get_scheduled_messages (at most 15) flushed but not yet printed.
            missing = [p for p in added if p not in delivered and not t.contains_message(*p)]
            assert len(missing) <= 15, f"kill {k}: {len(missing)} flushed, undelivered indexes lost"
            delivered.update(missing)
    # Finally everything that was flushed and not delivered comes out, once.
    assert added, "the writer never got to report anything"
    with bucketstore.open(path, durability="journal") as store:
        t = store.tracker("sub", TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=200,
                                               max_indexes_per_segment=50), FakeClock(10**9))
        rest = set(t.get_scheduled_messages(10**7))
        assert not rest & delivered


def test_cutoff_survives_a_restart_with_a_clock_behind(tmp_path):
    """After a restart whose clock is behind the durable frontier, a new index due before
    the frontier is refused as due (dispatched now) rather than tracked and then hidden
    behind the frontier on the next recovery."""
    clock = FakeClock(10_000)
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        t = store.tracker("sub", CFG, clock)
        t.add_message(1, 1, 10_500)
        clock.now = 11_000
        assert t.get_scheduled_messages(10) == [(1, 1)]
        t.confirm_delivered()  # handed on: the frontier is durable
    clock.now = 5_000  # the clock went back across the restart
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        t = store.tracker("sub", CFG, clock)
        assert not t.add_message(1, 2, 10_400)  # before the frontier: due, dispatch now
        assert t.add_message(1, 3, 11_500)
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        t = store.tracker("sub", CFG, clock)
        assert t.contains_message(1, 3) and t.number_of_delayed_messages == 1


def test_re_added_position_is_not_delivered_early_by_its_old_row_after_a_restart(tmp_path):
    """Found while writing the journal crash tests. A position delivered from a sealed
    segment and then re-added with a later time must not come out at its old time after a
    restart. Recovery untracked the delivered rows of the segment the frontier falls in
    without remembering that their rows remain on disk; the replayed re-add then made the
    old row live again, and it was delivered at once, 3900 ms early."""
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=3,
                        max_time_step_per_segment_ms=100)
    clock = FakeClock(1000)
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        t = store.tracker("sub", cfg, clock)
        t.add_messages([(1, e, 1100 + 10 * e) for e in range(6)])
        t.add_message(2, 0, 3000)  # rolls over: seals [1, 1]
        clock.now = 1100
        assert t.get_scheduled_messages(1) == [(1, 0)]
        assert t.add_message(1, 0, 5000)  # tracked anew, due later
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        t = store.tracker("sub", cfg, clock)
        clock.now = 1101
        assert t.get_scheduled_messages(10) == []
        assert t.contains_message(1, 0) and t.next_delivery_time() == 1110
        clock.now = 4999
        assert (1, 0) not in t.get_scheduled_messages(10)
        clock.now = 5000
        assert t.get_scheduled_messages(10) == [(1, 0)]


def test_re_added_position_is_not_merged_back_at_its_old_time_after_a_restart(tmp_path):
    """The same through a skipped segment: recovery does not load a segment wholly before
    the frontier, but a merge reads every segment, and kept the delivered position's old
    row because the re-added position was tracked: the merged bucket delivered it early."""
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=3,
                        max_time_step_per_segment_ms=1000)
    clock = FakeClock(1000)
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        t = store.tracker("sub", cfg, clock)
        t.add_messages([(1, e, 1100 + 10 * e) for e in range(9)])  # three segments of three
        t.add_message(2, 0, 3000)  # seals [1, 1]
        t.wait_for_maintenance()  # installed (background)
        clock.now = 1130
        assert t.get_scheduled_messages(4) == [(1, 0), (1, 1), (1, 2), (1, 3)]  # segment 1 and a row of 2
        t.confirm_delivered()
        assert t.add_message(1, 0, 50_000)
    merging = dataclasses.replace(cfg, max_num_buckets=1)
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        t = store.tracker("sub", merging, clock)
        t.add_messages([(3, e, 2000 + e) for e in range(5)])
        t.add_message(4, 0, 3000)  # seals [2, 3], which merges with [1, 1]
        t.wait_for_maintenance()  # installed (background)
        assert t.stats()["merge"]["succeeded"] >= 1
        clock.now = 1200
        got = t.get_scheduled_messages(100)
        assert (1, 0) not in got, "the re-added position came out at its old time"
        assert sorted(got) == [(1, e) for e in range(4, 9)]
        clock.now = 50_000
        assert (1, 0) in t.get_scheduled_messages(100)


def test_cutting_a_torn_tail_goes_through_the_file_layer(tmp_path):
    """Found while writing the journal crash tests. Replay cut a torn tail on a descriptor
    it opened with ``os.open``, outside the file layer: the cut was not counted or modelled
    by the fault-injecting layer, whose ``truncate`` then failed with a KeyError, so no
    recovery of a torn journal could itself be crashed or damaged."""
    from bucketstore.testing.faults import FaultyFileSystem
    from bucketstore.engine.durability.journal import journal_directory
    from bucketstore.engine.store.store import Store

    with bucketstore.open(tmp_path, durability="journal") as store:
        t = store.tracker("sub", CFG, FakeClock(1000))
        t.add_message(1, 0, 5000)
        t.add_message(1, 1, 5000)
    directory = journal_directory(str(tmp_path), "sub")
    (name,) = os.listdir(directory)
    path = os.path.join(directory, name)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:-3])  # the last group is torn
    fs = FaultyFileSystem()
    store = Store(tmp_path, durability="journal", fs=fs)
    try:
        t = store.tracker("sub", CFG, FakeClock(1000))
        assert t.contains_message(1, 0) and not t.contains_message(1, 1)
        assert ("truncate", path) in fs.log and ("fsync", path) in fs.log
    finally:
        store.close()


def test_an_expired_re_add_of_a_sealed_position_stays_untracked_after_a_checkpoint(tmp_path):
    """Found by the journal crash state machine. An expired re-add of a position held by a
    sealed bucket untracks it (``add_message`` returns False: dispatch now) and journals an
    untrack record. The next checkpoint (a seal, or recovery itself) wrote only the memory-only
    rows and the frontier, so the untrack was lost with the older file, and the following
    recovery tracked the position again from the bucket's bitmap: delivered a second time."""
    clock = FakeClock(1000)
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        t = store.tracker("sub", CFG, clock)
        t.add_messages([(2, e, 5000 + e) for e in range(6)])
        t.add_messages([(3, e, 6000 + e) for e in range(6)])  # seals [2, 2]
        assert not t.add_message(2, 0, 1000)  # due: untracks (2, 0); the caller dispatches it now
        t.add_messages([(4, e, 7000 + e) for e in range(6)])  # seals [3, 3]: a checkpoint
        assert not t.contains_message(2, 0)
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        t = store.tracker("sub", CFG, clock)
        assert not t.contains_message(2, 0), "an untracked position came back from its sealed bucket"
    with bucketstore.open(tmp_path / "s", durability="journal") as store:  # recovery checkpointed too
        t = store.tracker("sub", CFG, clock)
        assert not t.contains_message(2, 0), "an untracked position came back after a second recovery"
        clock.now = 10_000
        assert (2, 0) not in t.get_scheduled_messages(100)


def test_a_sealed_position_re_added_with_a_later_time_keeps_it_across_checkpoints(tmp_path):
    """Found by the state machine's expire_tracked rule: a sealed position untracked by an
    expired re-add and tracked again with a later time (in memory) came back at its old time
    after a second reopen, because the first reopen's checkpoint dropped its untrack."""
    cfg = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=4, max_indexes_per_segment=3,
                        max_time_step_per_segment_ms=100)
    clock = FakeClock(1000)
    path = tmp_path / "s"
    with bucketstore.open(path, "journal") as store:
        t = store.tracker("t", cfg, clock)
        t.add_messages([(2, e, 1020 + e) for e in range(6)])
        t.add_messages([(3, e, 1020 + e) for e in range(6)])  # seals ledger 2
        t.wait_for_maintenance()  # installed (background)
        assert t.stats()["immutable_buckets"] == 1
        assert t.add_message(2, 0, 900) is False  # due: untracked, the caller dispatches it
        assert t.add_message(2, 0, 1500) is True  # tracked again, later
    for _ in range(2):
        with bucketstore.open(path, "journal") as store:
            store.tracker("t", cfg, clock)
    with bucketstore.open(path, "journal") as store:
        t = store.tracker("t", cfg, clock)
        clock.now = 1200
        got = t.get_scheduled_messages(100)
        assert (2, 0) not in got and len(got) == 11
        clock.now = 1500
        assert t.get_scheduled_messages(100) == [(2, 0)]
