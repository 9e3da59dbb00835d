"""Readers of a topic beside (or after) a journal-mode writer see the adds its journal holds
beyond the index's ``applied``, as the writer's next open applies them (``docs/topics.md``,
"The topic journal"): a read-only open, ``bucketstore stats``, the bulk reader of the Spark
data source. They read the journal only: nothing is written, truncated or checkpointed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import bucketstore
from bucketstore import JournalError, TrackerConfig
from bucketstore.engine.topics.topic_reader import describe_topics
from bucketstore.engine.topics.topic_states import STATES, read_topic_states
from bucketstore.testing.faults import abandon_store

from helpers import FakeClock
from repo_paths import ROOT

CFG = TrackerConfig(tick_time_ms=0)
NOW = 10**12  # every row due


def _files(path) -> dict[str, bytes]:
    """Every file of the topic index and journals, with its bytes (a reader changes none)."""
    out = {}
    for root, _, names in os.walk(os.path.join(path, "topics")):
        for name in names:
            if name == "lock.mdb":
                continue  # a reader registers in LMDB's reader table
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.join(root, name)] = f.read()
    return out


def _states(path) -> list[tuple[tuple[int, ...], dict[str, str]]]:
    out = []
    for chunk in read_topic_states(str(path), "t"):
        for i, row in enumerate(chunk.rows.tolist()):
            out.append((tuple(row), {name: STATES[codes[i]] for name, codes in sorted(chunk.states.items())}))
    return sorted(out)


def _writer_with_journaled_adds(path):
    """A journal-mode topic with two subscriptions, some rows in its index (one subscription with
    a batch delivered, not confirmed), then adds answered and journaled only: new positions, a
    re-add of a position the index holds, a re-add of one in the unconfirmed batch, an add due
    at its call (its position untracked for both)."""
    clock = FakeClock(1_000)
    store = bucketstore.open(path, sync_interval_ms=0, confirm_sync_ms=0)
    topic = store.topic("t", config=CFG, clock=clock)
    a, b = topic.subscription("a"), topic.subscription("b")
    topic.add_messages([(1, e, 1_100 + e) for e in range(10)])
    clock.advance(105)
    assert a.get_scheduled_messages(3) == [(1, 0), (1, 1), (1, 2)]  # written: the index holds 10 adds
    applied = topic._applied
    topic.add_messages([(2, e, 5_000 + e) for e in range(20)])
    b.add_message(1, 7, 6_000)  # b tracks (1, 7) again, later
    topic.add_message(1, 1, 7_000)  # a's unconfirmed batch holds it: a row a does not see
    assert not topic.add_message(1, 5, 1_000)  # due: (1, 5) untracked for both
    assert topic._applied == applied  # the 23 adds are the journal's only
    return store, topic


def test_readers_see_the_adds_only_the_topic_journal_holds(tmp_path) -> None:
    store, topic = _writer_with_journaled_adds(tmp_path)
    try:
        # Another process beside the live writer: `bucketstore stats --json`.
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-m", "bucketstore", "stats", "--json", str(tmp_path)],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        seen = doc["topics"]["t"]
        assert seen["rows"] == 30 and seen["multi_positions"] == 1
        assert {n: s["number_of_delayed_messages"] for n, s in seen["subscriptions"].items()} == {"a": 29, "b": 29}
    finally:
        abandon_store(store)  # a kill: the adds stay in the journal only
    before = _files(tmp_path)
    figures = describe_topics(str(tmp_path), now_ms=NOW)
    states = _states(tmp_path)
    with bucketstore.open(tmp_path, read_only=True) as ro:
        t = ro.topic_stats("t")
        assert t["rows"] == figures["t"]["rows"]
        assert {n: s["number_of_delayed_messages"] for n, s in t["subscriptions"].items()} == {"a": 29, "b": 29}
        assert t["subscriptions"]["a"]["unconfirmed"] == 2  # the re-add of (1, 1) superseded it
    rows = {row[1:3]: state for row, state in states}
    assert (1, 5) not in rows  # due at its add: gone for both
    assert rows[(2, 19)] == {"a": "pending", "b": "pending"}
    assert _files(tmp_path) == before  # nothing written
    # The writer's next open applies the journal: every reader's view was that one.
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=FakeClock(1_000))
        a, b = topic.subscription("a"), topic.subscription("b")
        assert a.contains_message(2, 19) and b.contains_message(1, 7) and not a.contains_message(1, 5)
        replayed = describe_topics(str(tmp_path), now_ms=NOW)
        for doc in (figures, replayed):
            for key in ("file_bytes", "live_bytes", "run_files", "run_bytes"):
                doc["t"].pop(key)
        assert figures == replayed
        assert states == _states(tmp_path)
        assert a.number_of_delayed_messages == 29 and b.number_of_delayed_messages == 29


def test_a_torn_last_journal_group_is_left_out_by_a_reader_and_kept(tmp_path) -> None:
    """A group half written (the writer died in its write, or is writing it now): the readers
    leave it out, as the next open cuts it, and do not cut it themselves."""
    store, topic = _writer_with_journaled_adds(tmp_path)
    abandon_store(store)
    directory = os.path.join(tmp_path, "topics", "journal", f"{0:010d}")
    newest = os.path.join(directory, sorted(os.listdir(directory))[-1])
    whole = describe_topics(str(tmp_path), now_ms=NOW)
    with open(newest, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        f.truncate(size - 3)  # the last group (the due add) torn
    torn = os.path.getsize(newest)
    figures = describe_topics(str(tmp_path), now_ms=NOW)
    assert os.path.getsize(newest) == torn
    assert figures["t"]["rows"] == whole["t"]["rows"] + 1  # (1, 5)'s add lost: its row is back
    assert np.all([s["number_of_delayed_messages"] for s in figures["t"]["subscriptions"].values()])
    with bucketstore.open(tmp_path) as store:
        store.topic("t", config=CFG, clock=FakeClock(1_000))  # the replay
        assert describe_topics(str(tmp_path), now_ms=NOW)["t"]["rows"] == figures["t"]["rows"]


WRITER = """
import sys, bucketstore
from bucketstore.engine.topics import topic_group_commit
topic_group_commit.CHECKPOINT_ROWS = 40  # checkpoints (older files deleted) while the reader reads
cfg = bucketstore.TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=16)
with bucketstore.open(sys.argv[1], sync_interval_ms=0) as store:
    topic = store.topic("t", config=cfg, clock=lambda: 1_000)
    topic.subscription("a")
    for entry in range(int(sys.argv[2])):
        topic.add_message(1, entry, 10**9 + entry)  # durable in the journal at its return
        print(entry + 1, flush=True)
"""


def test_a_reader_beside_a_live_writer_sees_every_acknowledged_add(tmp_path) -> None:
    """A writer in another process adds, its journal applied into runs and checkpointed every
    few adds meanwhile: each read shows at least every add acknowledged before it began, and
    never fails on a file a checkpoint removed or a group being written."""
    adds = 600
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(adds)], stdout=subprocess.PIPE,
                            text=True, env=env)
    acked = 0
    reads = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            acked = int(line)
            if acked % 7:
                continue
            figures = describe_topics(str(tmp_path), now_ms=0)
            seen = figures["t"]["subscriptions"]["a"]["number_of_delayed_messages"]
            assert acked <= seen == figures["t"]["rows"]
            reads += 1
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert acked == adds and reads >= adds // 7 - 1
    assert sum(len(chunk.rows) for chunk in read_topic_states(str(tmp_path), "t")) == adds


def test_a_damaged_topic_journal_is_a_typed_error_of_its_reader(tmp_path) -> None:
    """Damage that is not a torn tail: the figures of the topic are not given from a guess; the
    error names the file, and `bucketstore stats` says so in one line with exit status 1."""
    store, _ = _writer_with_journaled_adds(tmp_path)
    abandon_store(store)
    directory = os.path.join(tmp_path, "topics", "journal", f"{0:010d}")
    path = os.path.join(directory, sorted(os.listdir(directory))[-1])
    data = bytearray(open(path, "rb").read())
    data[-80] ^= 0xFF  # inside a group with groups after it
    open(path, "wb").write(bytes(data))
    with pytest.raises(JournalError) as info:
        describe_topics(str(tmp_path))
    assert info.value.path == path
    with pytest.raises(JournalError):
        list(read_topic_states(str(tmp_path), "t"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bucketstore", "stats", str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 1 and path in done.stderr and "Traceback" not in done.stderr


def _compared(path) -> tuple[dict, list]:
    doc = describe_topics(str(path), now_ms=NOW)["t"]
    for key in ("file_bytes", "live_bytes", "run_files", "run_bytes"):
        doc.pop(key)
    return doc, _states(path)


@pytest.mark.parametrize("seed", range(int(os.environ.get("BUCKETSTORE_TOPIC_VIEW_SEEDS", "6"))))
def test_a_reader_folds_the_journal_as_the_writer_replays_it(tmp_path, seed) -> None:
    """Random histories (seals of 16 rows into runs, deliveries confirmed or not, mark-deletes,
    clears, a subscription started late), then adds only (new positions, re-adds, adds due at
    their call, through the topic or one subscription), then a kill: the figures and the rows'
    states a reader shows equal the writer's after its replay. BUCKETSTORE_TOPIC_VIEW_SEEDS: how many."""
    rng = np.random.default_rng(seed)
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=16)
    clock = FakeClock(1_000)
    store = bucketstore.open(tmp_path, sync_interval_ms=0, confirm_sync_ms=0)
    topic = store.topic("t", config=cfg, clock=clock)
    subs = [topic.subscription("a"), topic.subscription("b")]

    def some_adds(n: int) -> list[tuple[int, int, int]]:
        return [(int(rng.integers(0, 4)), int(rng.integers(0, 30)), clock() + int(rng.integers(-50, 400)))
                for _ in range(n)]

    for step in range(40):
        op = rng.integers(0, 8)
        sub = subs[int(rng.integers(0, len(subs)))]
        if op <= 2:
            topic.add_messages(some_adds(int(rng.integers(1, 12))))
        elif op == 3:
            sub.get_scheduled_messages(int(rng.integers(1, 6)))
        elif op == 4:
            sub.confirm_delivered()
        elif op == 5 and rng.random() < 0.3:
            sub.mark_delete(int(rng.integers(0, 2)), int(rng.integers(0, 30)))
        elif op == 6 and rng.random() < 0.2:
            sub.clear()
        elif op == 7 and len(subs) == 2 and step > 10:
            subs.append(topic.subscription("c", start="latest"))
        clock.advance(int(rng.integers(0, 60)))
    for _ in range(int(rng.integers(5, 30))):  # adds only: the journal's
        if rng.random() < 0.7:
            topic.add_messages(some_adds(int(rng.integers(1, 5))))
        else:
            subs[int(rng.integers(0, len(subs)))].add_message(*some_adds(1)[0])
        clock.advance(int(rng.integers(0, 40)))
    while not topic._pending:  # a seal took them all: at least one add the journal alone holds
        topic.add_messages(some_adds(1))
    abandon_store(store)
    seen = _compared(tmp_path)
    with bucketstore.open(tmp_path) as store:
        store.topic("t", config=cfg, clock=FakeClock(1_000))  # the replay
        assert _compared(tmp_path) == seen
