"""Topics (issue 25): one index per topic, shared by its subscriptions.

The per-call semantics are held against independent trackers by
``test_topics_differential.py``; these tests pin what that cannot see: the rows are stored
once, the handoff across a reopen, what a stalled subscription holds, the listings and
deletions, damage, and that stores without topics are untouched.
"""

from __future__ import annotations

import os
import threading

import lmdb
import pytest

import bucketstore
from bucketstore import CatalogError, StoreClosedError, TrackerConfig
from bucketstore.engine.topics.topic_file import topics_directory

from helpers import FakeClock

CFG = TrackerConfig(tick_time_ms=0)


def fill(topic, n: int, base: int = 2_000) -> None:
    topic.add_messages([(i // 100, i % 100, base + i) for i in range(n)])


def test_rows_are_stored_once_whatever_the_number_of_subscriptions(tmp_path) -> None:
    sizes, rows = {}, {}
    for subs in (1, 20):
        clock = FakeClock(1_000)
        with bucketstore.open(tmp_path / f"s{subs}") as store:
            topic = store.topic("t", config=CFG, clock=clock)
            handles = [topic.subscription(f"sub{i}") for i in range(subs)]
            fill(topic, 3_000)
            assert [h.number_of_delayed_messages for h in handles] == [3_000] * subs
            rows[subs] = topic.stats()["rows"]
            sizes[subs] = topic._file.size_bytes()
    assert rows[1] == rows[20] == 3_000
    assert sizes[20] <= 1.1 * sizes[1], sizes


def test_a_subscription_add_is_an_add_for_all_and_idempotent(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        assert a.add_message(1, 1, 1_500) and b.add_message(1, 1, 1_500)
        assert topic.stats()["rows"] == 1  # the second add found the row: nothing stored again
        clock.advance(600)
        assert a.get_scheduled_messages(10) == [(1, 1)]
        assert b.number_of_delayed_messages == 1 and not a.contains_message(1, 1)
        assert b.get_scheduled_messages(10) == [(1, 1)]
        assert topic.stats()["rows"] == 0  # every subscription is past it


def test_unconfirmed_batches_come_back_after_a_reopen_and_confirmed_ones_do_not(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        topic.add_messages([(1, e, 1_100 + e) for e in range(6)])
        clock.advance(1_000)
        assert a.get_scheduled_messages(2) == [(1, 0), (1, 1)]
        assert a.get_scheduled_messages(2) == [(1, 2), (1, 3)]  # confirms the first batch
        assert b.get_scheduled_messages(3) == [(1, 0), (1, 1), (1, 2)]
        b.confirm_delivered()
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        assert a.number_of_delayed_messages == 4 and a.contains_message(1, 2)
        assert a.get_scheduled_messages(10) == [(1, 2), (1, 3), (1, 4), (1, 5)]
        assert b.get_scheduled_messages(10) == [(1, 3), (1, 4), (1, 5)]


def test_at_most_once_forgets_a_batch_once_returned(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path, delivery="at-most-once") as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a = topic.subscription("a")
        topic.add_messages([(1, e, 1_100) for e in range(3)])
        clock.advance(1_000)
        assert a.get_scheduled_messages(2) == [(1, 0), (1, 1)]
    with bucketstore.open(tmp_path, delivery="at-most-once") as store:
        assert store.topic("t", config=CFG, clock=clock).subscription("a").get_scheduled_messages(9) == [(1, 2)]


def test_a_stalled_subscription_holds_the_rows_until_it_moves_or_is_deleted(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        fast, slow = topic.subscription("fast"), topic.subscription("slow")
        fill(topic, 500, base=1_001)
        clock.advance(10_000)
        assert len(fast.get_scheduled_messages(1_000)) == 500
        stats = topic.stats()
        assert stats["rows"] == 500
        assert stats["subscriptions"]["slow"]["held_rows"] == 500
        assert stats["subscriptions"]["slow"]["due_undelivered"] == 500
        assert stats["subscriptions"]["fast"]["held_rows"] == 0
        assert stats["subscriptions"]["fast"]["due_undelivered"] == 0
        assert slow.stats()["held_rows"] == 500
        assert len(slow.get_scheduled_messages(200)) == 200
        assert topic.stats()["rows"] == 300
        topic.delete_subscription("slow")
        assert topic.stats()["rows"] == 0
        with pytest.raises(StoreClosedError):
            slow.number_of_delayed_messages


def test_mark_delete_by_every_subscription_removes_rows(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        fill(topic, 300)  # ledgers 0..2, far in the future
        a.mark_delete(1, 99)
        assert a.number_of_delayed_messages == 100 and topic.stats()["rows"] == 300
        b.mark_delete(0, 49)
        assert b.number_of_delayed_messages == 250 and topic.stats()["rows"] == 250
        assert not a.add_message(0, 10, 99_999) and b.add_message(1, 150, 99_999)


def test_start_latest_sees_only_later_adds_and_earliest_the_backlog(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        assert topic.add_message(1, 1, 5_000)  # kept without subscriptions, for an earliest one
        late = topic.subscription("late", start="latest")
        early = topic.subscription("early", start="earliest")
        topic.add_message(1, 2, 6_000)
        assert late.number_of_delayed_messages == 1 and not late.contains_message(1, 1)
        assert early.number_of_delayed_messages == 2
        with pytest.raises(ValueError):
            topic.subscription("x", start="middle")


def test_clear_is_per_subscription(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        fill(topic, 50)
        a.clear()
        assert a.number_of_delayed_messages == 0 and b.number_of_delayed_messages == 50
        assert a.next_delivery_time() is None and b.next_delivery_time() == 2_000
        a.add_message(0, 7, 3_000)  # tracked again by a; b still has it at its first time
        clock.advance(1_500)
        assert b.get_scheduled_messages(100) == [(0, e) for e in range(50)]
        assert a.get_scheduled_messages(100) == []
        clock.advance(1_000)
        assert a.get_scheduled_messages(100) == [(0, 7)]


def test_listing_deleting_and_reopening_topics(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        assert store.topics() == []
        for name in ("b", "a"):
            t = store.topic(name, config=CFG, clock=clock)
            t.subscription("s1"), t.subscription("s2")
            fill(t, 10)
        assert store.topics() == ["a", "b"]
        assert store.topic("a", config=CFG) is store.topic("a", config=CFG)
        with pytest.raises(ValueError):
            store.topic("a", config=TrackerConfig(tick_time_ms=5))
        store.delete_topic("a")
        assert store.topics() == ["b"]
        with pytest.raises(KeyError):
            store.delete_topic("a")
    with bucketstore.open(tmp_path) as store:
        assert store.topics() == ["b"]
        b = store.topic("b", config=CFG, clock=clock)
        assert b.subscriptions() == ["s1", "s2"]
        assert b.subscription("s2").number_of_delayed_messages == 10
        a = store.topic("a", config=CFG, clock=clock)  # a new, empty topic of that name
        assert a.subscriptions() == [] and a.stats()["rows"] == 0


def test_a_store_without_topics_gets_no_topic_files(tmp_path) -> None:
    with bucketstore.open(tmp_path) as store:
        store.tracker("plain").add_message(1, 1, 2**40)
        assert store.topics() == []
    assert not os.path.exists(topics_directory(str(tmp_path)))


def test_bad_arguments(tmp_path) -> None:
    with bucketstore.open(tmp_path) as store:
        with pytest.raises(ValueError):
            store.topic("t", config=TrackerConfig(precision_bits=4))
        with pytest.raises(ValueError):
            store.topic("")
        with pytest.raises(TypeError):
            store.topic(3)  # type: ignore[arg-type]
        t = store.topic("t")
        with pytest.raises(ValueError):
            t.subscription("a\x00b")
        with pytest.raises(KeyError):
            t.delete_subscription("nobody")
        s = t.subscription("s")
        with pytest.raises(TypeError):
            s.add_message("1", 1, 1)  # type: ignore[arg-type]
    with pytest.raises(StoreClosedError):
        s.get_scheduled_messages(1)


def test_a_damaged_subscription_record_is_a_catalog_error_naming_the_file(tmp_path) -> None:
    with bucketstore.open(tmp_path) as store:
        store.topic("t").subscription("s")
    env = lmdb.open(topics_directory(str(tmp_path)), max_dbs=8, subdir=True)
    with env.begin(write=True) as txn:
        subs = env.open_db(b"subs", txn=txn)
        key = next(iter(txn.cursor(db=subs).iternext(values=False)))
        txn.put(key, b"\xc1garbage", db=subs)
    env.close()
    with bucketstore.open(tmp_path) as store:
        with pytest.raises(CatalogError, match="topics.*subscription 's'"):
            store.topic("t")


def test_wait_scheduled_wakes_on_an_earlier_add(tmp_path) -> None:
    # The real clock: a fake one wakes every sleeper whenever it moves, which would hide a
    # missing wake-up. The waiter sleeps towards an index an hour away; only the add's
    # wake-up makes it see the one due in 50 ms before its 20 s timeout.
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG)
        sub = topic.subscription("s")
        now = bucketstore.cutoff.system_clock()
        topic.add_message(1, 1, now + 3_600_000)
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(sub.wait_scheduled(10, timeout=20)))
        waiter.start()
        while not topic._due._targets:  # asleep
            threading.Event().wait(0.005)
        topic.add_message(1, 2, bucketstore.cutoff.system_clock() + 50)
        waiter.join(10)
        assert got == [[(1, 2)]]


def test_the_topic_map_grows_as_rows_are_added(tmp_path, monkeypatch) -> None:
    import bucketstore.engine.topics.topic_file as topic_file
    monkeypatch.setattr(topic_file, "_INITIAL_MAP", 256 << 10)  # a few hundred rows fill it
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        sub = topic.subscription("s")
        for k in range(20):
            topic.add_messages([(k, e, 5_000 + e) for e in range(500)])
        for e in range(300):
            topic.add_message(100, e, 6_000)
        assert sub.number_of_delayed_messages == 10_300
        assert topic._file._map_size > 256 << 10


def test_a_subscription_is_a_delayed_delivery_tracker(tmp_path) -> None:
    with bucketstore.open(tmp_path) as store:
        sub = store.topic("t").subscription("s")
        assert isinstance(sub, bucketstore.DelayedDeliveryTracker)
        stats = sub.stats()
        for key in ("immutable_buckets", "number_of_delayed_messages", "loaded_indexes", "snapshot_size_bytes",
                    "memory_bytes", "create", "load", "merge", "delete", "frontier", "held_rows", "due_undelivered"):
            assert key in stats, key


def test_a_checkpoint_holds_the_topics(tmp_path) -> None:
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path / "live", durability="sealed") as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        topic.add_messages([(1, e, 1_100 + e) for e in range(10)])
        clock.advance(104)
        assert len(a.get_scheduled_messages(100)) == 5
        a.confirm_delivered()
        topic.add_message(2, 0, 9_000)  # sealed mode: waits in memory for the seal, or a checkpoint
        store.checkpoint(tmp_path / "copy")
        a.get_scheduled_messages(100)  # after the copy: not in it
    with bucketstore.open(tmp_path / "copy", durability="sealed") as store:
        topic = store.topic("t", config=CFG, clock=clock)
        assert topic.subscription("a").number_of_delayed_messages == 6
        assert topic.subscription("b").number_of_delayed_messages == 11


def test_an_abandoned_store_keeps_what_was_committed_and_loses_the_pending_adds(tmp_path) -> None:
    from bucketstore.testing.faults import abandon_store
    clock = FakeClock(1_000)
    store = bucketstore.open(tmp_path, durability="sealed")
    topic = store.topic("t", config=CFG, clock=clock)
    sub = topic.subscription("s")
    topic.add_message(1, 1, 5_000)
    assert sub.number_of_delayed_messages == 1  # a read writes the adds before it
    topic.add_message(1, 2, 5_000)  # sealed mode: waits for the seal, in memory
    abandon_store(store)  # a kill: nothing more is written
    with bucketstore.open(tmp_path, durability="sealed") as store:
        sub = store.topic("t", config=CFG, clock=clock).subscription("s")
        assert sub.number_of_delayed_messages == 1 and sub.contains_message(1, 1)


def test_a_read_only_open_lists_and_describes_topics_and_changes_nothing(tmp_path) -> None:
    from bucketstore import ReadOnlyError
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        topic.subscription("s")
        fill(topic, 30)
        # The adds wait in the topic's journal; the writer's own settle (below, for the view in
        # its process) would move them into the index: written first, to compare the files.
        topic.flush()
        before = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in (tmp_path / "topics").iterdir())
        with bucketstore.open(tmp_path, read_only=True) as view:  # beside the writer (another handle)
            assert view.topics() == ["t"]
            assert view.topic_stats("t")["subscriptions"]["s"]["number_of_delayed_messages"] == 30
            with pytest.raises(ReadOnlyError):
                view.topic("t")
            with pytest.raises(ReadOnlyError):
                view.topic_stats("u")
            with pytest.raises(ReadOnlyError):
                view.delete_topic("t")
        after = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in (tmp_path / "topics").iterdir())
        assert before == after


def test_a_damaged_topic_record_is_a_catalog_error(tmp_path) -> None:
    with bucketstore.open(tmp_path) as store:
        store.topic("t").subscription("s")
    env = lmdb.open(topics_directory(str(tmp_path)), max_dbs=8, subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"t", b"\x91\x01", db=env.open_db(b"topics", txn=txn))  # a list, not a map
    env.close()
    with bucketstore.open(tmp_path) as store:
        with pytest.raises(CatalogError, match="topic 't'.*not a map"):
            store.topic("t")
        assert store.topics() == ["t"]  # listing still works: names are keys
