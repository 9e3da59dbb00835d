"""A topic delivers a window of rows at a time (``engine/topics/topic_windows.py``) and group-commits
its subscriptions' progress (``docs/topics.md``, "Delivery" and "Durability").

The per-call semantics are held against independent trackers by
``test_topics_differential.py``; these pin what it cannot see: a window is decoded once for
every subscription, the cache keeps to its budget and forgets a window written to, rows
leave whole and partial windows, the group commit's window after a kill, the writer's own
readers, and the positions put when LMDB refuses an append.
"""

from __future__ import annotations

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.topics import topic_windows
from bucketstore.engine.topics.topic_reader import describe_topics, verify_topics
from bucketstore.testing.faults import abandon_store

from helpers import FakeClock

CFG = TrackerConfig(tick_time_ms=0)
WINDOW = 1 << 12  # ms of delivery times under one ``rows`` key


def rows(n: int, base: int = 10_000, step: int = 10) -> list[tuple[int, int, int]]:
    return [(i // 100, i % 100, base + i * step) for i in range(n)]


def table_rows(topic) -> int:
    with topic._file.read() as txn:
        return topic._file.tables.count(txn, topic._id)


def test_a_window_is_decoded_once_for_every_subscription(tmp_path, monkeypatch) -> None:
    decoded = []
    original = topic_windows.Window.decode.__func__

    def spy(cls, raw):
        decoded.append(len(raw))
        return original(cls, raw)

    monkeypatch.setattr(topic_windows.Window, "decode", classmethod(spy))
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        subs = [topic.subscription(f"s{i}") for i in range(20)]
        topic.add_messages(rows(1_000))  # 10 s of rows: three windows
        clock.now = 10_000 + 10_000
        for _ in range(4):
            for sub in subs:
                sub.get_scheduled_messages(300)
        windows = len({(10_000 + i * 10) // WINDOW for i in range(1_000)})
        assert len(decoded) == windows  # not windows x 20
        assert all(sub.number_of_delayed_messages == 0 for sub in subs)


def test_the_cache_keeps_to_its_budget_and_forgets_a_window_written_to(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        sub = topic.subscription("s")
        topic.add_messages(rows(2_000))  # five windows
        cache = topic._file.windows  # one budget for the store's topics
        cache.budget = 1  # at most the window in use
        clock.now = 10_000 + 20_000
        got = []
        while batch := sub.get_scheduled_messages(150):
            got += batch
            assert len(cache.windows) <= 1 and cache.held == sum(w.nbytes for w in cache.windows.values())
        assert len(got) == 2_000
        # A window read (cached) and then written to: the next delivery sees the new row.
        cache.budget = topic_windows.DEFAULT_BUDGET
        topic.add_messages([(500, 0, 40_001), (500, 1, 40_002)])
        clock.now = 40_001
        assert sub.get_scheduled_messages(10) == [(500, 0)]
        assert (topic._id, 40_001 >> 12) in cache.windows
        topic.add_message(500, 2, 40_002)  # into the window cached, after the frontier
        clock.now = 40_002
        assert sub.get_scheduled_messages(10) == [(500, 1), (500, 2)]


def test_rows_every_subscription_passed_leave_by_whole_and_partial_windows(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, confirm_sync_ms=0) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        ahead, behind = topic.subscription("ahead"), topic.subscription("behind")
        topic.add_messages(rows(1_500))  # 15 s: four windows
        clock.now = 10_000 + 15_000
        assert len(ahead.get_scheduled_messages(1_500)) == 1_500
        assert topic.stats()["rows"] == 1_500  # behind holds them all
        assert len(behind.get_scheduled_messages(1_000)) == 1_000  # into the third window
        assert topic.stats()["rows"] == 500 == table_rows(topic)
        assert verify_topics(tmp_path) == []
        assert len(behind.get_scheduled_messages(1_000)) == 500
        assert topic.stats()["rows"] == 0 == table_rows(topic)


def _deliver_twice(path, confirm_sync_ms: int) -> tuple[list, list]:
    clock = FakeClock(1_000)
    store = bucketstore.open(path, durability="journal", sync_interval_ms=0, confirm_sync_ms=confirm_sync_ms)
    sub = store.topic("t", config=CFG, clock=clock).subscription("s")
    sub.add_messages(rows(30))
    clock.now = 20_000
    first = sub.get_scheduled_messages(10)
    second = sub.get_scheduled_messages(10)  # confirms the first (the handoff)
    abandon_store(store)  # a kill: nothing more is written
    with bucketstore.open(path, durability="journal") as store:
        sub = store.topic("t", config=CFG, clock=clock).subscription("s")
        back = sub.get_scheduled_messages(30)
        return first + second, back


def test_deliveries_are_group_committed_and_a_kill_in_the_window_brings_them_back(tmp_path) -> None:
    delivered, back = _deliver_twice(tmp_path / "grouped", 60_000)
    # Nothing written since the adds: both batches come back, the confirmed one too (the
    # documented window); none is lost.
    assert sorted(back) == sorted(p[:2] for p in rows(30))
    delivered, back = _deliver_twice(tmp_path / "each", 0)
    # Written with each call: only the unconfirmed batch comes back, then the rest.
    assert back == sorted(delivered[10:] + [p[:2] for p in rows(30)[20:]])


def test_the_writer_s_own_readers_and_checkpoints_see_progress_in_the_window(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path / "s", confirm_sync_ms=60_000) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        topic.add_messages(rows(40))
        clock.now = 20_000
        a.get_scheduled_messages(40)
        b.get_scheduled_messages(15)
        assert topic._unsaved == {"a", "b"}  # in memory only
        doc = describe_topics(tmp_path / "s", now_ms=clock())["t"]
        assert doc["subscriptions"]["b"]["frontier"][1:3] == [0, 14] and doc["rows"] == 25
        assert not topic._unsaved
        b.get_scheduled_messages(5)
        store.checkpoint(tmp_path / "copy")
    with bucketstore.open(tmp_path / "copy") as copy:
        sub = copy.topic("t", config=CFG, clock=clock).subscription("b")
        # The copy has b's last batch as unconfirmed: it comes back first, then the rest.
        assert sub.get_scheduled_messages(100) == [(0, i) for i in range(15, 40)]


def test_a_lower_topic_s_new_positions_are_appended_before_a_higher_topic_s(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        low, high = store.topic("low", config=CFG, clock=clock), store.topic("high", config=CFG, clock=clock)
        low_sub, high_sub = low.subscription("s"), high.subscription("s")
        high.add_messages(rows(200))
        low.add_messages(rows(200))  # its positions sort before high's: not at the table's end
        assert low_sub.contains_message(1, 99) and low_sub.number_of_delayed_messages == 200
        assert verify_topics(tmp_path) == []
        clock.now = 100_000
        assert len(low_sub.get_scheduled_messages(500)) == 200 == len(high_sub.get_scheduled_messages(500))


def test_records_lmdb_refuses_to_append_are_put(tmp_path) -> None:
    from bucketstore.format.topic_codec import position_parts, row_parts
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=FakeClock(1_000))
        tables, tid = topic._file.tables, topic._id
        later = [(5_000, 1, 9, 0)]
        earlier = [(5_000, 1, 3, 1), (5_000, 1, 4, 2)]  # below the ledger's last value: refused as an append
        for batch in (later, earlier):
            with topic._file.write() as txn:
                tables.insert_records(txn, [row_parts(tid, *r) for r in batch],
                                      [position_parts(tid, *r) for r in batch])
        with topic._file.read() as txn:
            assert [tables.versions(txn, tid, 1, e) for e in (3, 4, 9)] == [[(1, 5_000)], [(2, 5_000)], [(0, 5_000)]]


def test_a_window_read_in_a_transaction_undone_is_forgotten(tmp_path) -> None:
    import pytest

    from bucketstore.format.topic_codec import MAX_KEY, position_parts, row_parts
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        sub = topic.subscription("s")
        sub.add_message(1, 1, 5_000)
        topic.flush()  # written into the level (it waited in the journal)
        phantom = (5_001, 1, 2, 99)
        with pytest.raises(RuntimeError):
            with topic._write() as txn:
                topic._file.tables.insert_records(txn, [row_parts(topic._id, *phantom)],
                                                  [position_parts(topic._id, *phantom)])
                assert sum(hi - lo for _, lo, hi in topic._windows.scan(txn, None, MAX_KEY)) == 2  # cached
                raise RuntimeError("undone")
        clock.now = 6_000
        assert sub.get_scheduled_messages(10) == [(1, 1)]  # not the phantom row


def test_the_store_s_topics_share_one_window_budget(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        first, second = store.topic("a", config=CFG, clock=clock), store.topic("b", config=CFG, clock=clock)
        subs = [first.subscription("s"), second.subscription("s")]
        for topic in (first, second):
            topic.add_messages(rows(300, step=1))  # one window each
        clock.now = 20_000
        shared = first._file.windows
        assert second._file.windows is shared
        subs[0].get_scheduled_messages(10)
        assert [k[0] for k in shared.windows] == [first._id]
        shared.budget = shared.held  # room for one window
        subs[1].get_scheduled_messages(10)
        assert [k[0] for k in shared.windows] == [second._id]  # the other topic's went first
        shared.budget = topic_windows.DEFAULT_BUDGET
        subs[0].get_scheduled_messages(10)
        assert sorted(k[0] for k in shared.windows) == sorted([first._id, second._id])
        first.close()
        assert [k[0] for k in shared.windows] == [second._id]  # a closed topic keeps none
