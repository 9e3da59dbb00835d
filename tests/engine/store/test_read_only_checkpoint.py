"""``ReadOnlyStore.checkpoint``: an online backup taken by a handle that only looks.

Beside a writer in another process it is ``bucketstore checkpoint``'s copy
(``test_checkpoint.py`` takes one of its checkpoints beside a live writer this way);
here: beside a writer in this same process (LMDB allows one open of an environment per
process, so the catalog is copied through the writer's), with no writer at all, and its
refusals. The source is never changed but for LMDB's reader slot.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import bucketstore
from bucketstore import StoreClosedError, TrackerConfig

from helpers import FakeClock

CFG = TrackerConfig(min_index_count_per_bucket=10, tick_time_ms=0)
FAR = 10**12


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != "lock.mdb"}


def _held(path: Path) -> set[tuple[int, int]]:
    with bucketstore.open(path, durability="journal", background=False) as copy:
        tracker = copy.tracker("t", clock=FakeClock(FAR))
        out: set[tuple[int, int]] = set()
        while batch := tracker.get_scheduled_messages(10_000):
            out |= set(batch)
        return out


def test_a_read_only_handle_checkpoints_beside_its_writer_in_this_process(tmp_path: Path) -> None:
    src = tmp_path / "src"
    clock = FakeClock(1_000)
    with bucketstore.open(src, durability="journal", background=False) as store:
        t = store.tracker("t", CFG, clock)
        t.add_messages([(ledger, e, 50_000 + ledger * 1_000 + e) for ledger in (1, 2, 3) for e in range(10)])  # two sealed
        clock.now = 51_004
        assert len(t.get_scheduled_messages(100)) == 5
        t.confirm_delivered()
        t.flush()
        with bucketstore.open(src, read_only=True) as looking:
            before = _tree(src)
            report = looking.checkpoint(tmp_path / "copy")
            assert _tree(src) == before  # the looking handle wrote nothing into the store
        assert report.trackers == ["t"] and report.ledger_files == 2
        t.add_message(4, 0, 60_000)  # the writer goes on; not in the copy
    expected = {(ledger, e) for ledger in (1, 2, 3) for e in range(10)} - {(1, e) for e in range(5)}
    assert _held(tmp_path / "copy") == expected


def test_a_read_only_checkpoint_without_a_writer_copies_and_changes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    with bucketstore.open(src, durability="journal", background=False) as store:
        store.tracker("t", CFG, FakeClock(1_000)).add_messages([(1, e, 50_000 + e) for e in range(3)])
    before = _tree(src)
    with bucketstore.open(src, read_only=True) as looking:
        looking.checkpoint(tmp_path / "copy")
        with pytest.raises(ValueError, match="not empty"):
            looking.checkpoint(tmp_path / "copy")
        with pytest.raises(ValueError, match="inside the store"):
            looking.checkpoint(src / "inner")
    assert _tree(src) == before
    assert _held(tmp_path / "copy") == {(1, e) for e in range(3)}
    with pytest.raises(StoreClosedError):
        looking.checkpoint(tmp_path / "later")
