"""What ``stats``, ``catalog``, ``verify`` and ``stats --prometheus`` show of a store's topics."""

from __future__ import annotations

import json
import os
import re

import lmdb

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.cli import commands as cli
from bucketstore.engine.topics.topic_file import topics_directory
from bucketstore.engine.topics.topic_reader import describe_topics, verify_topics

from helpers import FakeClock


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def make(path) -> None:
    """A topic whose subscription 'stalled' never takes a batch while 'fast' drains half the rows."""
    clock = FakeClock(1_000)
    with bucketstore.open(path) as store:
        topic = store.topic("orders", config=TrackerConfig(tick_time_ms=0), clock=clock)
        topic.subscription("stalled")
        fast = topic.subscription("fast")
        topic.add_messages([(1, e, 1_100 + e) for e in range(40)])
        clock.advance(119)  # 20 rows due (1,100 to 1,119)
        assert len(fast.get_scheduled_messages(100)) == 20
        fast.confirm_delivered()


def test_stats_catalog_and_prometheus_show_each_subscription(tmp_path, capsys) -> None:
    make(tmp_path)
    doc = describe_topics(tmp_path, now_ms=1_119)
    subs = doc["orders"]["subscriptions"]
    assert doc["orders"]["rows"] == 40
    assert subs["stalled"]["held_rows"] == 20 and subs["stalled"]["due_undelivered"] == 20
    assert subs["fast"]["held_rows"] == 0 and subs["fast"]["due_undelivered"] == 0
    assert subs["fast"]["number_of_delayed_messages"] == 20 and subs["fast"]["frontier"][:3] == [1119, 1, 19]
    for command in ("stats", "catalog"):
        code, out, err = run(capsys, command, str(tmp_path))
        assert code == 0 and err == ""
        assert "topic 'orders': 40 row(s), 2 subscription(s)" in out
        # The command line's clock is the system's: every row is due by now.
        assert "subscription 'stalled': 40 tracked, 20 held alone, 40 due and undelivered, frontier 1000" in out
        assert "subscription 'fast': 20 tracked, 0 held alone, 20 due and undelivered, frontier (1119, 1:19)" in out
        # The file keeps the pages deletes freed: what is in use is told apart from its size.
        sizes = re.search(r"topic index file (\d+) bytes \((\d+) in use\)", out)
        assert sizes and 0 < int(sizes[2]) <= int(sizes[1]) == os.path.getsize(tmp_path / "topics" / "data.mdb")
    code, out, _ = run(capsys, "stats", "--json", str(tmp_path))
    assert code == 0 and json.loads(out)["topics"]["orders"]["subscriptions"]["stalled"]["held_rows"] == 20
    assert json.loads(out)["topics"]["orders"]["live_bytes"] == int(sizes[2])
    code, out, _ = run(capsys, "stats", "--prometheus", str(tmp_path))
    assert code == 0
    assert 'bucketstore_topic_rows{topic="orders"} 40' in out
    assert 'bucketstore_subscription_held_rows{topic="orders",subscription="stalled"} 20' in out
    assert 'bucketstore_subscription_frontier_ms{topic="orders",subscription="fast"} 1119' in out


def test_verify_checks_the_topic_index(tmp_path, capsys) -> None:
    make(tmp_path)
    code, out, _ = run(capsys, "verify", str(tmp_path))
    assert code == 0 and out.rstrip().endswith(": ok")
    env = lmdb.open(topics_directory(str(tmp_path)), max_dbs=8, subdir=True)
    with env.begin(write=True) as txn:  # lose one row's twin, and damage the topic record
        positions = env.open_db(b"positions", txn=txn)
        key = next(iter(txn.cursor(db=positions).iternext(values=False)))
        txn.delete(key, db=positions)
        txn.put(b"orders", b"\xc1", db=env.open_db(b"topics", txn=txn))
    env.close()
    code, out, _ = run(capsys, "verify", str(tmp_path))
    assert code == 1
    assert "has no position record" in out and "topic b'orders'" in out and topics_directory(str(tmp_path)) in out
    code, out, err = run(capsys, "stats", str(tmp_path))
    assert code == 1 and "topics: ERROR" in out and "Traceback" not in out + err


def test_the_reader_works_beside_this_process_writer(tmp_path, capsys) -> None:
    # LMDB allows one open of an environment per process: the reader borrows the writer's.
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=TrackerConfig(tick_time_ms=0), clock=FakeClock(1_000))
        topic.subscription("s")
        topic.add_messages([(1, e, 5_000) for e in range(7)])
        assert describe_topics(tmp_path)["t"]["rows"] == 7
        assert verify_topics(tmp_path) == []
        topic.add_message(2, 0, 5_000)
        assert describe_topics(tmp_path)["t"]["subscriptions"]["s"]["number_of_delayed_messages"] == 8
