"""The store: locking, recovery from damage, orphans, tracker lifecycle, and its CLI commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FakeClock

import bucketstore
from bucketstore import CatalogError, CorruptLedgerError, StoreLockedError, TrackerConfig
from bucketstore.cli.commands import main
from bucketstore.cli.simulate import SimulationConfig, run_simulation
from helpers import SMALL, fill_and_seal, prefix_positions

def _ledger_files(path):
    return sorted(f for f in os.listdir(path / "ledgers"))


def test_second_open_in_same_process_is_refused(tmp_path):
    with bucketstore.open(tmp_path / "s"):
        with pytest.raises(StoreLockedError, match="this process"):
            bucketstore.open(tmp_path / "s")
    with bucketstore.open(tmp_path / "s"):  # released on close
        pass


def test_second_process_is_refused_and_lock_dies_with_holder(tmp_path):
    path = tmp_path / "s"
    code = ("import bucketstore, sys, time; s = bucketstore.open(sys.argv[1]); "
            "print('ready', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLockedError, match=f"process {holder.pid}"):
            bucketstore.open(path)
    finally:
        holder.kill()
        holder.wait()
    with bucketstore.open(path):  # a killed holder's flock is gone with it
        pass


def test_sealed_buckets_survive_reopen(tmp_path):
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)
        fill_and_seal(t)
        sealed = t.stats()["immutable_buckets"]
        assert sealed >= 1
        held = t.number_of_delayed_messages
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:
        t = store.tracker("sub", SMALL, clock)
        assert t.stats()["immutable_buckets"] == sealed
        # the mutable bucket (the last ledger) is gone in sealed mode, as in Pulsar
        assert t.number_of_delayed_messages == held - 1
        assert store.trackers() == ["sub"]


def test_damaged_bucket_file_is_a_typed_error_and_repair_drops_it(tmp_path):
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="sealed") as store:  # the last ledger is not kept
        t = store.tracker("sub", SMALL, clock)
        fill_and_seal(t)
        sealed = t.stats()["immutable_buckets"]
        # The file of the bucket holding ledger 0 (keys sort by range): with two maintenance
        # threads, ledger ids need not follow the buckets' order, so not the lowest-numbered file.
        victim = Path(store.ledger_path(sorted(store.catalog.buckets("sub").items())[0][1]))
    data = bytearray(victim.read_bytes())
    data[40] ^= 0xFF  # inside the header properties: the header CRC fails
    victim.write_bytes(bytes(data))
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("sub", SMALL, clock)  # reads the catalog only
        assert t.number_of_delayed_messages == 36
        # (a position a summary's prefix holds is the index's to answer: one past it needs the file)
        pos = next(p for p in ((0, e) for e in range(1, 12)) if p not in prefix_positions(t))
        for _ in range(2):  # found when the bucket is first needed, and again on every retry
            with pytest.raises(CorruptLedgerError) as info:
                t.contains_message(*pos)
            assert info.value.path == str(victim) and info.value.offset == 0
    with bucketstore.open(tmp_path / "s", repair=True) as store:
        t = store.tracker("sub", SMALL, clock)
        assert len(t.recovery_report["dropped"]) == 1
        assert t.stats()["immutable_buckets"] == sealed - 1
    assert main(["verify", str(tmp_path / "s")]) == 1  # the damaged file is now an orphan


def test_missing_bucket_file_is_a_catalog_error(tmp_path):
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s") as store:
        fill_and_seal(store.tracker("sub", SMALL, clock))
    path = tmp_path / "s"
    assert main(["verify", str(path)]) == 0
    os.unlink(path / "ledgers" / _ledger_files(path)[0])
    assert main(["verify", str(path)]) == 1
    with bucketstore.open(path) as store:
        t = store.tracker("sub", SMALL, clock)  # reads the catalog only
        clock.now = 10**9
        with pytest.raises(CatalogError, match="missing"):  # after the rows the summaries' prefixes hold, if any
            for _ in range(1 + len(prefix_positions(t))):
                t.get_scheduled_messages(100)


def _orphan_ledger(path, ledger_id, store_id):
    """A complete bucket file no catalog key references (a seal that crashed before its commit)."""
    import numpy as np
    from bucketstore.format.snapshot import build_bucket, write_bucket
    meta, payloads = build_bucket(5000, 5000, np.array([1, 2], np.uint64), np.array([5000, 5000], np.uint64),
                                  np.array([0, 1], np.uint64), time_step_ms=1000, max_indexes_per_segment=10)
    props = {"tracker": "sub"} if store_id is None else {"tracker": "sub", "store_id": store_id}
    return write_bucket(path / "ledgers", ledger_id, meta, payloads, props)


def test_orphans_and_temporaries_are_removed_on_open(tmp_path):
    path = tmp_path / "s"
    with bucketstore.open(path) as store:
        fill_and_seal(store.tracker("sub", SMALL, FakeClock(0)))
        store_id = store.store_id
    kept = _ledger_files(path)
    _orphan_ledger(path, 997, store_id)
    _orphan_ledger(path, 996, None)  # written before store ids: the healthy catalog alone decides
    (path / "ledgers" / f"{999:020d}.ledger").write_bytes(b"half a seal")
    (path / "ledgers" / f"{998:020d}.ledger.tmp").write_bytes(b"torn")
    (path / "ledgers" / "README").write_text("not ours")
    with bucketstore.open(path) as store:
        assert store.stats()["orphans_removed_on_open"] == 3
        # A damaged file cannot prove it is garbage: a crash never leaves one under a final name.
        assert store.stats()["orphans_kept"] == 1
        assert store.allocate_ledger_id() >= 1000  # never reuse an id a file had
    assert _ledger_files(path) == sorted(kept + [f"{999:020d}.ledger", "README"])


def test_an_orphan_that_vanishes_before_its_unlink_does_not_stop_the_open(tmp_path):
    """Another hand removed an orphan between the listing and the unlink (in the tests, a dead
    store's seal cleaning up the file it could not commit): the open goes on."""
    from bucketstore.format.fs import FileSystem

    class RemovedFirst(FileSystem):
        def unlink(self, path: str) -> None:
            if path.endswith(f"{997:020d}.ledger"):
                os.unlink(path)  # someone else got there first
            super().unlink(path)

    path = tmp_path / "s"
    with bucketstore.open(path) as store:
        fill_and_seal(store.tracker("sub", SMALL, FakeClock(0)))
        store_id = store.store_id
    _orphan_ledger(path, 997, store_id)
    with bucketstore.Store(path, fs=RemovedFirst()) as store:
        assert store.stats()["orphans_removed_on_open"] == 0
        assert store.tracker("sub", SMALL, FakeClock(0)).number_of_delayed_messages > 0
    assert f"{997:020d}.ledger" not in _ledger_files(path)


def test_clear_and_delete_tracker_remove_files_and_keys(tmp_path):
    path = tmp_path / "s"
    clock = FakeClock(0)
    with bucketstore.open(path) as store:
        a = store.tracker("a", SMALL, clock)
        b = store.tracker("b", SMALL, clock)
        fill_and_seal(a)
        fill_and_seal(b, base=2000)
        assert len(_ledger_files(path)) >= 2
        a.clear()
        assert a.number_of_delayed_messages == 0 and store.catalog.buckets("a") == {}
        store.delete_tracker("b")
        assert store.trackers() == ["a"]
        assert _ledger_files(path) == []
        with pytest.raises(bucketstore.StoreClosedError):
            b.add_message(1, 1, 10**6)


def test_tracker_handle_is_shared_and_config_checked(tmp_path):
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("sub", SMALL)
        assert store.tracker("sub", SMALL) is t
        with pytest.raises(ValueError):
            store.tracker("sub", TrackerConfig())
        with pytest.raises(ValueError):
            store.tracker("")
        with pytest.raises(TypeError):
            store.tracker("x", config={"tick_time_ms": 1})


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="max_indexes_per_segment"):
        TrackerConfig(max_indexes_per_segment=0)
    with pytest.raises(ValueError, match="max_num_buckets"):
        TrackerConfig(max_num_buckets=0)
    with pytest.raises(TypeError, match="tick_time_ms"):
        TrackerConfig(tick_time_ms="1000")
    assert TrackerConfig().min_index_count_per_bucket == 50000


def test_cli_store_commands(tmp_path, capsys):
    path = tmp_path / "s"
    with bucketstore.open(path) as store:
        fill_and_seal(store.tracker("sub", SMALL, FakeClock(0)))
    assert main(["catalog", str(path)]) == 0
    out = capsys.readouterr().out
    assert "tracker 'sub'" in out and "[2, 2]" in out and "not open" in out
    assert main(["stats", str(path), "--json"]) == 0
    assert '"trackers"' in capsys.readouterr().out
    assert main(["dump", str(path)]) == 0
    assert main(["catalog", str(tmp_path / "nope")]) == 2
    assert main(["catalog", str(tmp_path)]) == 2  # a directory that is not a store


def test_simulate_small_run_has_no_violations(tmp_path):
    cfg = SimulationConfig(messages=30_000, rate_per_s=2_000, delay_window_ms=120_000, entries_per_ledger=1_000,
                           tracker=TrackerConfig(min_index_count_per_bucket=1_000, max_indexes_per_segment=300,
                                                 max_time_step_per_segment_ms=20_000, max_num_buckets=3))
    report = run_simulation(str(tmp_path / "sim"), cfg, progress=False)
    assert report.violations == 0
    assert report.delivered == report.published == 30_000
    assert report.sealed > 3 and report.merged > 0 and report.deleted > 0
    assert report.recovered_indexes > 0
    # the day's events each ran and were checked: long stop, second subscription, crash, clock step, stop
    assert report.restarts == 5
    assert [s.split(":")[0].split(",")[0] for s in report.steps] == [
        "stopped 180 s (longer than every delay)", "second subscription",
        "main subscription after the second one's deletions", "crash at 50%", "clock stepped 24 s forward at once",
        "read-only open beside the writer", "stop"]
    assert report.look_violations == 0
    assert report.step_mismatches == report.side_violations == 0
