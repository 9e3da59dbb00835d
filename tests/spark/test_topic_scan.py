"""The topic side of the Spark reader without Spark (pyarrow only): a run file that a live writer
drops while a task reads the topic is a stale view (run the query again), one missing while
still listed is damage."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pyarrow", reason="the spark extra is not installed (pip install '.[spark]')")

import bucketstore  # noqa: E402
from bucketstore import CatalogError, StaleSnapshotError  # noqa: E402
from bucketstore.spark.topic_scan import TopicPart, plan_topic_scan, read_topic_part  # noqa: E402
from helpers import FakeClock  # noqa: E402
from repo_paths import ROOT  # noqa: E402

# Seals of 4,096 rows (the level's cap), 8 of which merge into a run of several segments (8,192
# rows each): a task reads that run's first segment long before its last.
SEAL = 4_096
ROWS = 9 * SEAL
CFG = bucketstore.TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=SEAL)


def make_store(path: str) -> list[str]:
    with bucketstore.open(path) as store:
        topic = store.topic("t", config=CFG, clock=FakeClock(1_000))
        topic.subscription("a")
        for start in range(0, ROWS, 4_096):
            topic.add_messages([(i // 1_000, i % 1_000, 2_000 + i) for i in range(start, start + 4_096)])
    runs = os.path.join(path, "topics", "runs")
    return sorted(os.path.join(runs, n) for n in os.listdir(runs) if n.endswith(".run"))


DRAIN = textwrap.dedent("""
    import sys, bucketstore
    with bucketstore.open(sys.argv[1]) as store:
        topic = store.topic("t", config=bucketstore.TrackerConfig(tick_time_ms=0, min_index_count_per_bucket={seal}),
                            clock=lambda: 10**12)
        sub = topic.subscription("a")
        while sub.get_scheduled_messages(5_000):
            pass
        sub.confirm_delivered()
        topic.flush()
""")


def test_a_run_dropped_by_the_writer_mid_read_is_stale_and_a_missing_listed_run_is_damage(tmp_path) -> None:
    path = str(tmp_path / "s")
    runs = make_store(path)
    assert runs and os.path.getsize(runs[0]) > 0
    [part] = plan_topic_scan(path)
    batches = read_topic_part(part, chunk_rows=100)
    assert next(batches).num_rows == 100  # the run's first segment is read, its second not yet
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", DRAIN.format(seal=SEAL), path], check=True, env=env, timeout=120)
    assert not any(os.path.exists(r) for r in runs)  # every row passed: the writer dropped the runs
    with pytest.raises(StaleSnapshotError, match="run the query again") as caught:
        for _ in batches:
            pass
    assert caught.value.path in runs

    path = str(tmp_path / "damaged")
    runs = make_store(path)
    os.unlink(runs[0])  # still listed: damage, not a stale view
    with pytest.raises(CatalogError) as caught:
        list(read_topic_part(TopicPart(path, "t")))
    assert not isinstance(caught.value, StaleSnapshotError) and caught.value.path == runs[0]


def test_a_task_reads_the_adds_only_the_topic_journal_holds(tmp_path) -> None:
    """Journal mode: adds acknowledged (durable in the topic's journal, not in its index yet),
    then the writer killed: a task's rows and states hold them, as the writer's reopen has them."""
    from bucketstore.testing.faults import abandon_store

    store = bucketstore.open(tmp_path, sync_interval_ms=0)
    topic = store.topic("t", config=CFG, clock=FakeClock(1_000))
    topic.subscription("a")
    b = topic.subscription("b")
    topic.add_messages([(7, e, 2_000 + e) for e in range(50)])
    b.add_message(7, 3, 3_000)  # tracked already: no second row
    assert not topic.add_message(7, 4, 900)  # due at its call: (7, 4) untracked for both
    assert topic._applied == 0  # the journal's alone
    abandon_store(store)

    def read() -> list[tuple]:
        (part,) = plan_topic_scan(str(tmp_path))
        return sorted(tuple(r.values()) for batch in read_topic_part(part) for r in batch.to_pylist())
    rows = read()
    assert len(rows) == 98 and {r[-1] for r in rows} == {"pending"}
    assert not [r for r in rows if r[4] == 4]
    with bucketstore.open(tmp_path) as store:
        store.topic("t", config=CFG, clock=FakeClock(1_000))  # the replay
        assert read() == rows
