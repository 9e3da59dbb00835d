"""A topic's sealed runs (``docs/topics.md``, "Sealed runs"): rows not due leave the LMDB level
for immutable run files, are delivered from them, answer lookups through their bitmaps without
reading every run, and leave with their files once every subscription is past them; a file no
entry names is removed at open; a damaged run is reported, never read as rows."""

from __future__ import annotations

import os

import numpy as np
import pytest

import bucketstore
from bucketstore import CatalogError, TrackerConfig
from bucketstore.engine.topics.topic_reader import describe_topics, verify_topics
from bucketstore.engine.topics.topic_rows import RowTables
from bucketstore.engine.topics.topic_runs import RunSet
from bucketstore.engine.topics.topic_windows import WindowBudget
from bucketstore.format.fs import FileSystem

from helpers import FakeClock

SEAL = 50
CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=SEAL)


def runs_dir(path) -> str:
    return os.path.join(path, "topics", "runs")


def run_files(path) -> list[str]:
    return sorted(f for f in os.listdir(runs_dir(path)) if f.endswith(".run")) if os.path.isdir(runs_dir(path)) else []


def level_rows(topic) -> int:
    """The rows of the LMDB level once the adds waiting in memory (journal mode: in the topic's
    journal, until a seal's worth or a call that reads) are written."""
    with topic._lock:
        topic._apply()
    with topic._file.read() as txn:
        return topic._file.tables.count(txn, topic._id)


def fill(topic, n: int, ledger_size: int = 100, base: int = 2_000) -> list[tuple[int, int, int]]:
    rows = [(i // ledger_size, i % ledger_size, base + (i * 7919) % 9_000) for i in range(n)]
    for start in range(0, n, 10):
        topic.add_messages(rows[start:start + 10])
    return rows


def test_rows_not_due_are_sealed_then_delivered_from_the_runs_and_the_files_go(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        rows = fill(topic, 500)
        assert run_files(tmp_path) and level_rows(topic) < SEAL
        assert topic.stats()["rows"] == 500 and verify_topics(str(tmp_path)) == []
        doc = describe_topics(str(tmp_path))["t"]  # what `bucketstore stats` prints of them
        assert doc["run_files"] == len(run_files(tmp_path)) and doc["run_bytes"] == sum(
            os.path.getsize(os.path.join(runs_dir(tmp_path), f)) for f in run_files(tmp_path))
        clock.advance(20_000)
        want = [(lg, en) for _, lg, en in sorted((ts, lg, en) for lg, en, ts in rows)]
        for sub in (a, b):
            got = []
            while batch := sub.get_scheduled_messages(37):
                got.extend(batch)
            assert sorted(got) == sorted(want) and sub.number_of_delayed_messages == 0
        topic.flush()  # the runs' drop is synced: their files go
        assert run_files(tmp_path) == [] and topic.stats()["rows"] == 0


def test_delivery_merges_runs_and_level_in_time_order(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        sub = topic.subscription("s")
        fill(topic, 230)  # 4 runs and a level
        assert level_rows(topic) and run_files(tmp_path)
        order = []
        for step in range(0, 10_000, 500):
            clock.advance(500)
            got = sub.get_scheduled_messages(1_000)
            order.extend(got)
            assert all(ts <= clock() for ts in [2_000 + ((lg * 100 + en) * 7919) % 9_000 for lg, en in got])
        assert len(order) == len(set(order)) == 230


def test_runs_merge_by_tiers_and_drop_the_rows_no_subscription_can_see(tmp_path) -> None:
    """30 seals of 50 rows merge 8 at a time: at most 7 runs a tier. A merge drops the rows
    gone (a due add of a sealed row) and the rows every frontier passed; the answers stay."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        rows = [(i // 100, i % 100, 2_000 + i) for i in range(1_500)]
        topic.add_messages(rows[:50])
        topic.add_message(0, 7, 500)  # due: (0, 7) gone from its run
        topic.flush()  # written (it waited in the journal)
        assert topic._dead == {(0, 7): 7}
        clock.advance(1_100)  # the first 100 rows due
        assert len(a.get_scheduled_messages(1_000)) == len(b.get_scheduled_messages(1_000)) == 49
        a.confirm_delivered(), b.confirm_delivered()
        for start in range(100, 1_500, 50):  # (rows 50 to 100 are due by now: never stored)
            topic.add_messages(rows[start:start + 50])
        sizes = sorted(run.rows for run in topic._runs.runs.values())
        assert len(sizes) <= 2 * 7 and max(sizes) >= 8 * SEAL, sizes
        assert topic._dead == {} and topic.stats()["rows"] == 1_399 == sum(sizes) + level_rows(topic)
        assert verify_topics(str(tmp_path)) == []
        assert not a.contains_message(0, 7) and a.contains_message(14, 99)
        clock.advance(5_000)
        assert len(a.get_scheduled_messages(10_000)) == len(b.get_scheduled_messages(10_000)) == 1_399


def test_membership_reads_the_bitmaps_of_the_run_that_may_hold_it_only(tmp_path, monkeypatch) -> None:
    """Runs of disjoint positions (positions grow, even entries only): a lookup reads the bitmaps
    of the one run whose range holds the position, and that run's rows only when its bitmap
    holds the position."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        topic.subscription("s")
        rows = [(0, 2 * i, 2_000 + (i * 7919) % 9_000) for i in range(350)]  # 7 runs: one fewer than a merge
        for start in range(0, 350, 10):
            topic.add_messages(rows[start:start + 10])
    with bucketstore.open(tmp_path) as store:  # cold: nothing of the runs read yet
        topic = store.topic("t", config=CFG, clock=clock)
        sub = topic.subscription("s")
        read: list[str] = []
        real = RunSet._read
        monkeypatch.setattr(RunSet, "_read", lambda self, path, n, at: read.append(os.path.basename(path))
                            or real(self, path, n, at))
        decoded: list[int] = []
        real_segment = RunSet.segment
        monkeypatch.setattr(RunSet, "segment", lambda self, run, i: decoded.append(run.run_id)
                            or real_segment(self, run, i))
        runs = sorted(topic._runs.runs.values(), key=lambda r: r.min_pos)
        assert len(runs) == 7
        third = runs[3]
        ledger, entry = third.min_pos
        assert not sub.contains_message(ledger, entry + 1)  # in its range, not in its bitmap
        assert set(read) == {os.path.basename(topic._runs.path(third.run_id))} and decoded == []
        read.clear()
        assert sub.contains_message(ledger, entry + 2)
        assert set(read) <= {os.path.basename(topic._runs.path(third.run_id))} and set(decoded) == {third.run_id}
        read.clear()
        assert not sub.contains_message(0, 5_000)  # past every run's range: no file read
        assert read == []
        # An acknowledgement reads the runs whose positions it covers, not those past it: here
        # only their bitmaps (the subscription is before every row: engine/topics/topic_marks.py).
        decoded.clear()
        read.clear()
        sub.mark_delete(*runs[0].min_pos)
        assert set(read) == {os.path.basename(topic._runs.path(runs[0].run_id))} and decoded == []
        assert not sub.contains_message(*runs[0].min_pos) and sub.number_of_delayed_messages == 349


def test_a_due_add_of_a_sealed_row_untracks_it_for_every_subscription(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        fill(topic, 120)
        assert topic._runs.runs and a.contains_message(0, 7)
        assert topic.add_message(0, 7, 500) is False  # due: gone for all, though its run stays
        assert not a.contains_message(0, 7) and not b.contains_message(0, 7)
        assert a.number_of_delayed_messages == b.number_of_delayed_messages == 119
        assert topic.stats()["rows"] == 119 and verify_topics(str(tmp_path)) == []
    with bucketstore.open(tmp_path) as store:  # the run row stays gone across a restart
        topic = store.topic("t", config=CFG, clock=clock)
        a = topic.subscription("a")
        assert not a.contains_message(0, 7)
        clock.advance(20_000)
        got = a.get_scheduled_messages(1_000)
        assert len(got) == 119 and (0, 7) not in got


def test_files_no_entry_names_are_removed_at_open(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        topic.subscription("s")
        fill(topic, 120)
        kept = run_files(tmp_path)
    # A seal killed before its commit (a renamed file, a temporary one) and a deleted topic's run.
    stray = ["0000000000-00000000000000000900.run", "0000000000-00000000000000000901.run.tmp",
             "0000000042-00000000000000000000.run"]
    for name in stray:
        with open(os.path.join(runs_dir(tmp_path), name), "wb") as f:
            f.write(b"partial")
    with bucketstore.open(tmp_path) as store:
        store.topic("t", config=CFG, clock=clock)
        assert sorted(os.listdir(runs_dir(tmp_path))) == kept


def test_a_damaged_run_is_reported_and_never_read_as_rows(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        topic.subscription("s")
        fill(topic, 120)
        victim = os.path.join(runs_dir(tmp_path), run_files(tmp_path)[0])
    with open(victim, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    problems = verify_topics(str(tmp_path))
    assert len(problems) == 1 and victim in problems[0] and "offset" in problems[0]
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        sub = topic.subscription("s")
        clock.advance(20_000)
        with pytest.raises(CatalogError, match=os.path.basename(victim)):
            sub.get_scheduled_messages(1_000)


def test_checkpoint_copies_the_runs_and_delete_topic_removes_them(tmp_path) -> None:
    clock = FakeClock(1_000)
    src, dest = tmp_path / "src", tmp_path / "copy"
    with bucketstore.open(src) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        topic.subscription("s")
        fill(topic, 120)
        store.checkpoint(dest)
        assert run_files(dest) == run_files(src) != []
        store.delete_topic("t")
        assert run_files(src) == []
    with bucketstore.open(dest) as store:
        assert verify_topics(str(dest)) == []
        sub = store.topic("t", config=CFG, clock=clock).subscription("s")
        clock.advance(20_000)
        assert len(sub.get_scheduled_messages(1_000)) == 120


def test_sealed_mode_writes_a_seal_s_new_positions_straight_into_a_run(tmp_path, monkeypatch) -> None:
    """Sealed mode's adds wait for ``min_index_count_per_bucket`` of them; those of new
    positions then go into a run by their own transaction, never through the LMDB level (whose
    file would keep that size for good)."""
    inserted: list[int] = []
    real = RowTables.insert_records
    monkeypatch.setattr(RowTables, "insert_records", lambda self, txn, rows, positions: inserted.append(len(rows))
                        or real(self, txn, rows, positions))
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, durability="sealed") as store:
        topic = store.topic("t", config=CFG, clock=clock)
        sub = topic.subscription("s")
        rows = fill(topic, 500)
        assert inserted == [] and level_rows(topic) == 0 and topic._runs.runs
        assert topic.stats()["rows"] == 500 and verify_topics(str(tmp_path)) == []
        clock.advance(20_000)
        assert sorted(sub.get_scheduled_messages(1_000)) == sorted((lg, en) for lg, en, _ in rows)


def test_a_wide_entry_id_asked_of_a_run_whose_ledger_holds_narrow_ids_is_simply_absent(tmp_path) -> None:
    """A run's range can cover (ledger, 2**40) while that ledger's bitmap is 32-bit: the question
    has the answer "no", not pyroaring's OverflowError (found by the mixed-store differential)."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        sub = topic.subscription("a")
        fill(topic, 500)  # ledgers 0..4, entries below 100, sealed into runs
        assert run_files(tmp_path)
        assert not sub.contains_message(2, 2**40)
        topic.add_message(2, 2**40, 5_000)
        assert sub.contains_message(2, 2**40) and sub.number_of_delayed_messages == 501


def test_a_written_runs_entry_names_its_least_and_greatest_position(tmp_path) -> None:
    """A run's position range (what lookups and mark-deletes skip runs by) is its rows' least and
    greatest (ledger, entry), whatever their delivery order."""
    rng = np.random.default_rng(7)
    runs = RunSet(str(tmp_path / "runs"), 3, WindowBudget(), FileSystem())
    for _ in range(20):
        n = int(rng.integers(1, 40))
        cols = np.unique(np.column_stack([rng.integers(0, 50, n), rng.integers(0, 4, n), rng.integers(0, 6, n),
                                          np.arange(n)]).astype(np.uint64), axis=0)
        cols = cols[np.lexsort((cols[:, 3], cols[:, 2], cols[:, 1], cols[:, 0]))]
        positions = sorted((int(lg), int(en)) for lg, en in cols[:, 1:3])
        run = runs.write(cols)
        assert (run.min_pos, run.max_pos) == (positions[0], positions[-1])
