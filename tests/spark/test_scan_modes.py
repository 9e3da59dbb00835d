"""The Spark reader's plan takes each tracker's recorded durability: journal files beside a
tracker recorded as sealed (a deleted tracker's of that name) lend it no delivery frontier.
Planning needs no Spark session."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install '.[spark]')")
pytest.importorskip("pyarrow", reason="the spark extra is not installed (pip install '.[spark]')")

import bucketstore  # noqa: E402
from bucketstore import TrackerConfig  # noqa: E402
from bucketstore.engine.durability.journal import journal_directory, list_files  # noqa: E402
from bucketstore.spark.scan import plan_scan  # noqa: E402

CFG = TrackerConfig(min_index_count_per_bucket=5, tick_time_ms=0)


def test_a_sealed_tracker_is_planned_without_a_stale_journals_frontier(tmp_path: Path) -> None:
    clock = [1_000]
    with bucketstore.open(tmp_path, durability="journal", background=False, confirm_sync_ms=0) as store:
        t = store.tracker("t", CFG, lambda: clock[0])
        t.add_messages([(1, e, 2_000 + e) for e in range(5)] + [(2, 0, 9_000)])
        clock[0] = 5_000
        assert len(t.get_scheduled_messages(10)) == 5
        t.confirm_delivered()
        store.catalog.delete_tracker("t")  # its deletion stopped after the catalog commit
    assert list_files(journal_directory(str(tmp_path), "t"))[0]
    with bucketstore.open(tmp_path, durability="sealed", background=False) as store:
        t = store.tracker("t", CFG, lambda: clock[0])  # a new tracker of that name
        t.add_messages([(3, e, 9_000 + e) for e in range(5)] + [(4, 0, 9_000)])  # ledger 3 sealed
        assert t.stats()["immutable_buckets"] == 1
    ranges = [r for part in plan_scan(str(tmp_path)) for r in part]
    assert ranges and {(r.journaled, r.frontier) for r in ranges} == {(False, None)}
