"""The Spark reader's planning and reading beside a live writer that retires bucket files
(issue 29, item 3). Needs pyarrow only: ``plan_scan`` and ``read_segment_range`` run without Spark.

A file the catalog snapshot names and the writer retires (key first, file second) before the
planner reads its sizes is no damage: planning starts again from a newer snapshot. A planned
file retired before a task reads it is a ``StaleSnapshotError`` (run the query again), never a
raw ``FileNotFoundError``. A file missing while the catalog still names it stays damage.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("pyarrow", reason="the spark extra is not installed (pip install '.[spark]')")

import bucketstore  # noqa: E402
from bucketstore import CatalogError, StaleSnapshotError  # noqa: E402
from bucketstore.spark import scan  # noqa: E402
from helpers import SMALL, FakeClock, fill_and_seal  # noqa: E402


@pytest.fixture
def live(tmp_path):
    store = bucketstore.open(tmp_path / "s", durability="journal")
    tracker = store.tracker("t", SMALL, FakeClock(0))
    fill_and_seal(tracker, ledgers=4)
    assert len(tracker.buckets()) >= 3
    yield store, tracker
    store.close()


def _paths(plan) -> set[str]:
    return {part.path for partition in plan for part in partition}


def test_planning_starts_again_when_the_writer_retires_a_file_it_was_about_to_read(live, monkeypatch) -> None:
    store, tracker = live
    victim = tracker.buckets()[0]
    real = scan.LedgerReader
    retired: list[str] = []

    def reader(path):
        if path == victim.path and not retired:
            # The writer acknowledges past the first bucket: key removed, then file unlinked.
            tracker.mark_delete(victim.end_ledger + 1, 0)
            retired.append(path)
        return real(path)

    monkeypatch.setattr(scan, "LedgerReader", reader)
    plan = scan.plan_scan(store.path)  # raised CatalogError("... which is missing")
    assert retired and not os.path.exists(victim.path)
    assert _paths(plan) == {b.path for b in tracker.buckets()}


def test_a_planned_file_retired_before_its_task_reads_it_is_a_stale_snapshot(live) -> None:
    store, tracker = live
    plan = scan.plan_scan(store.path)
    victim = tracker.buckets()[0]
    part = next(p for partition in plan for p in partition if p.path == victim.path)
    tracker.mark_delete(victim.end_ledger + 1, 0)
    with pytest.raises(StaleSnapshotError, match="after the scan was planned") as info:
        list(scan.read_segment_range(part))  # raised FileNotFoundError
    assert info.value.path == victim.path


def test_a_file_missing_while_the_catalog_names_it_is_still_damage(live) -> None:
    store, tracker = live
    plan = scan.plan_scan(store.path)
    victim = tracker.buckets()[0]
    part = next(p for partition in plan for p in partition if p.path == victim.path)
    os.unlink(victim.path)  # behind the writer's back
    with pytest.raises(CatalogError, match="which is missing"):
        list(scan.read_segment_range(part))
    with pytest.raises(CatalogError, match="which is missing"):
        scan.plan_scan(store.path)
