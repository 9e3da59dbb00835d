"""A topic's journal in journal mode (``docs/topics.md``, "Durability"; ``formats/journal.md``):
an add is made durable by one append and one fsync of the topic's journal, not by LMDB commits;
a reopen after a kill rebuilds what was acknowledged, each add once; a store written before the
journal opens; damage is a typed error."""

from __future__ import annotations

import os

import msgpack
import pytest

import bucketstore
from bucketstore import JournalError, TrackerConfig
from bucketstore.engine.store.store import Store
from bucketstore.engine.topics import topic_file, topic_group_commit
from bucketstore.engine.topics.topic_journal import journal_root, topic_journal_directory
from bucketstore.engine.topics.topic_reader import verify_topics
from bucketstore.format.topic_codec import decode_topic
from bucketstore.testing.faults import abandon_store
from bucketstore.testing.topic_crash import DurableSteps

from helpers import FakeClock

CFG = TrackerConfig(tick_time_ms=0)


def journal_files(store_path, topic_id: int = 0) -> list[str]:
    directory = topic_journal_directory(os.path.join(store_path, "topics"), topic_id)
    return sorted(f for f in os.listdir(directory) if f.endswith(".journal")) if os.path.isdir(directory) else []


def test_an_add_is_one_journal_append_and_one_fsync_not_an_index_commit(tmp_path) -> None:
    """sync_interval_ms=0: each add is durable at its return by one write and one fsync of the
    topic's journal; the index (LMDB) commits and syncs nothing until a seal's worth waits."""
    steps = DurableSteps()
    store = Store(tmp_path, durability="journal", sync_interval_ms=0, fs=steps.file_system())
    try:
        topic = store.topic("t", config=CFG, clock=FakeClock(1_000))
        for i in range(3):
            topic.subscription(f"s{i}")
        topic.add_message(1, 0, 5_000)  # creates the journal's first file
        seen: list[tuple[str, str]] = []
        steps.on_step = lambda k, kind, target: seen.append((kind, target))
        topic_file.durable_step_hook = steps.step
        try:
            for entry in range(1, 21):
                assert topic.add_message(1, entry, 5_000 + entry)
        finally:
            topic_file.durable_step_hook = None
        assert [kind for kind, _ in seen] == ["write", "fsync"] * 20
        assert all(target.endswith(".journal") for _, target in seen)
        assert topic._applied == 0  # nothing in the index yet: the adds are the journal's
        assert topic.subscription("s1").number_of_delayed_messages == 21  # a read writes them in
        assert topic._applied == 21
    finally:
        store.close()


def test_acknowledged_adds_come_back_from_the_journal_after_a_kill(tmp_path) -> None:
    """Adds only in the journal (one re-added due: untracked for all), then a kill: the reopened
    topic holds what every subscription was answered, and its cutoff is where the adds left it."""
    clock = FakeClock(1_000)
    store = bucketstore.open(tmp_path, sync_interval_ms=0)
    topic = store.topic("t", config=CFG, clock=clock)
    a, b = topic.subscription("a"), topic.subscription("b")
    assert a.number_of_delayed_messages == 0
    added = [(2, e, 3_000 + 10 * e) for e in range(9)] + [(2**64 - 1, 2**64 - 1, 3_095)]  # all 64 bits
    topic.add_messages(added[:5])
    for row in added[5:]:
        b.add_message(*row)
    clock.advance(500)
    assert not topic.add_message(2, 3, 1_200)  # due at its call: (2, 3) untracked for all
    assert topic._applied == 0 and journal_files(tmp_path)
    abandon_store(store)  # a kill: nothing more is written
    clock = FakeClock(1_000)  # a clock behind the cutoff of the adds: the cutoff does not move back
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        assert topic._cutoff.value == 1_500
        assert topic._applied == 11
        want = sorted((lg, en) for lg, en, _ in added if (lg, en) != (2, 3))
        for name in ("a", "b"):
            sub = topic.subscription(name)
            assert sub.number_of_delayed_messages == 9
            assert not sub.contains_message(2, 3) and sub.contains_message(2, 8)
            assert sub.contains_message(2**64 - 1, 2**64 - 1)
        clock.advance(10_000)
        assert topic.subscription("a").get_scheduled_messages(100) == want
    with bucketstore.open(tmp_path) as store:  # the replay is not repeated
        assert store.topic("t", config=CFG, clock=clock).subscription("b").number_of_delayed_messages == 9


def test_a_reopen_applies_each_journaled_add_once(tmp_path) -> None:
    """The journal still holds adds the index holds too (moved in by a read, delivered and
    confirmed since): a reopen after a kill skips them by the index's count of adds held, so
    nothing confirmed comes back and nothing counts twice."""
    clock = FakeClock(1_000)
    store = bucketstore.open(tmp_path, sync_interval_ms=0, confirm_sync_ms=0)
    topic = store.topic("t", config=CFG, clock=clock)
    sub = topic.subscription("s")
    topic.add_messages([(3, e, 1_100 + e) for e in range(6)])
    topic.add_messages([(4, e, 9_000 + e) for e in range(4)])
    clock.advance(500)
    assert sub.get_scheduled_messages(100) == [(3, e) for e in range(6)]
    sub.confirm_delivered()
    assert sub.number_of_delayed_messages == 4
    abandon_store(store)
    with bucketstore.open(tmp_path) as store:
        sub = store.topic("t", config=CFG, clock=clock).subscription("s")
        assert sub.number_of_delayed_messages == 4
        assert sub.get_scheduled_messages(100) == []
        clock.advance(10_000)
        assert sub.get_scheduled_messages(100) == [(4, e) for e in range(4)]


def test_the_journal_starts_afresh_once_the_synced_index_holds_its_adds(tmp_path, monkeypatch) -> None:
    """A checkpoint (a new file, the older ones deleted) once the journal holds CHECKPOINT_ROWS
    adds and the index is synced with them; a clean close leaves a journal with nothing to replay."""
    monkeypatch.setattr(topic_group_commit, "CHECKPOINT_ROWS", 12)
    config = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=5)
    with bucketstore.open(tmp_path, sync_interval_ms=0) as store:
        topic = store.topic("t", config=config, clock=FakeClock(1_000))
        topic.subscription("s")
        numbers = set()
        for e in range(40):
            topic.add_message(1, e, 5_000 + e)
            numbers.update(journal_files(tmp_path))
            assert len(journal_files(tmp_path)) == 1  # the older one deleted
        assert len(numbers) >= 3  # started afresh (40 adds, 12 at most per file)
    assert len(journal_files(tmp_path)) == 1
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=config, clock=FakeClock(1_000))
        assert topic._journal.rows == 0 and topic.subscription("s").number_of_delayed_messages == 40


def _as_written_before_the_journal(path) -> None:
    """Make a closed store's topics what the code before the topic journal left: no journal
    directory, topic records without ``applied``."""
    import lmdb
    import shutil
    shutil.rmtree(journal_root(os.path.join(path, "topics")))
    env = lmdb.open(os.path.join(path, "topics"), max_dbs=topic_file.MAX_DBS)
    try:
        topics = env.open_db(b"topics")
        with env.begin(write=True) as txn:
            for key, value in list(txn.cursor(db=topics)):
                record = decode_topic(value)
                del record["applied"]
                txn.put(key, msgpack.packb(record, use_bin_type=True), db=topics)
    finally:
        env.close()


def test_a_store_written_before_the_topic_journal_opens_and_journals(tmp_path) -> None:
    clock = FakeClock(1_000)
    config = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=20)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=config, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        topic.add_messages([(1, e, 2_000 + e) for e in range(50)])  # a run and a level
        clock.advance(1_010)
        assert len(a.get_scheduled_messages(5)) == 5
        a.confirm_delivered()
    _as_written_before_the_journal(tmp_path)
    store = bucketstore.open(tmp_path, sync_interval_ms=0)
    topic = store.topic("t", config=config, clock=clock)
    assert topic._applied == 0
    a, b = topic.subscription("a"), topic.subscription("b")
    assert (a.number_of_delayed_messages, b.number_of_delayed_messages) == (45, 50)
    topic.add_messages([(2, e, 9_000 + e) for e in range(3)])  # journaled from add 0 on
    abandon_store(store)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=config, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        assert (a.number_of_delayed_messages, b.number_of_delayed_messages) == (48, 53)
        clock.advance(10_000)
        assert a.get_scheduled_messages(100) == [(1, e) for e in range(5, 50)] + [(2, e) for e in range(3)]
        assert len(b.get_scheduled_messages(100)) == 53


def test_a_damaged_topic_journal_is_an_error_naming_the_file_and_offset(tmp_path) -> None:
    clock = FakeClock(1_000)
    store = bucketstore.open(tmp_path, sync_interval_ms=0)
    topic = store.topic("t", config=CFG, clock=clock)
    topic.subscription("s")
    for e in range(3):
        topic.add_message(1, e, 5_000)
    abandon_store(store)
    (name,) = journal_files(tmp_path)
    path = os.path.join(topic_journal_directory(os.path.join(tmp_path, "topics"), 0), name)
    data = bytearray(open(path, "rb").read())
    data[-80] ^= 0xFF  # inside the second-to-last group: damage with data after it, not a torn tail
    open(path, "wb").write(bytes(data))
    (problem,) = verify_topics(str(tmp_path))  # `bucketstore verify` reports it too
    assert problem.startswith(path) and "not a torn tail" in problem
    with bucketstore.open(tmp_path) as store:
        with pytest.raises(JournalError) as info:
            store.topic("t", config=CFG, clock=clock)
    assert info.value.path == path and info.value.offset > 0


def test_deleting_a_topic_deletes_its_journal_and_a_left_over_one_goes_at_open(tmp_path) -> None:
    with bucketstore.open(tmp_path, sync_interval_ms=0) as store:
        for name in ("t", "u"):
            topic = store.topic(name, config=CFG, clock=FakeClock(1_000))
            topic.add_message(1, 0, 5_000)
        root = journal_root(os.path.join(tmp_path, "topics"))
        assert sorted(os.listdir(root)) == ["0000000000", "0000000001"]
        store.delete_topic("t")
        assert os.listdir(root) == ["0000000001"]
        os.makedirs(os.path.join(root, "0000000007"))  # a topic deleted by a process killed mid-way
        open(os.path.join(root, "0000000007", f"{0:020d}.journal"), "wb").close()
    with bucketstore.open(tmp_path) as store:
        assert store.topics() == ["u"]
        assert os.listdir(root) == ["0000000001"]


def test_a_sealed_mode_open_applies_what_a_journal_mode_run_left(tmp_path) -> None:
    """Adds acknowledged in journal mode, then a kill, then an open in sealed mode: the adds are
    applied (sealed mode appends to no journal, so the journal goes once the index holds them)."""
    clock = FakeClock(1_000)
    store = bucketstore.open(tmp_path, sync_interval_ms=0)
    topic = store.topic("t", config=CFG, clock=clock)
    topic.subscription("s")
    topic.add_messages([(1, e, 5_000 + e) for e in range(4)])
    abandon_store(store)
    with bucketstore.open(tmp_path, durability="sealed") as store:
        sub = store.topic("t", config=CFG, clock=clock).subscription("s")
        assert sub.number_of_delayed_messages == 4
        assert not os.path.exists(topic_journal_directory(os.path.join(tmp_path, "topics"), 0))
    with bucketstore.open(tmp_path) as store:  # not applied twice
        assert store.topic("t", config=CFG, clock=clock).subscription("s").number_of_delayed_messages == 4


def test_a_checkpoint_of_a_store_copies_the_adds_only_its_topic_journal_holds(tmp_path) -> None:
    """A store left by a kill, its topic not opened again: a checkpoint copies the topic's journal
    beside its index, so the copy holds the acknowledged adds."""
    clock = FakeClock(1_000)
    store = bucketstore.open(tmp_path / "s", sync_interval_ms=0)
    topic = store.topic("t", config=CFG, clock=clock)
    topic.subscription("s")
    topic.add_messages([(1, e, 5_000 + e) for e in range(4)])
    abandon_store(store)
    with bucketstore.open(tmp_path / "s") as store:
        store.checkpoint(tmp_path / "copy")
    with bucketstore.open(tmp_path / "copy") as store:
        assert store.topic("t", config=CFG, clock=clock).subscription("s").number_of_delayed_messages == 4
