"""Scraping a live store (issue 29, item 3): ``Store.stats()``, ``metrics.prometheus_text`` and
the read-only views beside trackers that seal, merge and delete buckets.

A listing of ``ledgers/`` or of a journal directory is past by the time its files are sized:
a file the writer retires in between must be left out, never raise. The first tests make that
moment happen every time (the listing's victim is unlinked right after the listing returns,
before any of its files is sized); the last one scrapes from a thread while a tracker rolls,
seals, merges, delivers and trims for ``BUCKETSTORE_SCRAPE_SECONDS`` (default 2) seconds.
Before the fix, ``Store.stats()`` raised ``FileNotFoundError`` from ``os.path.getsize``, and
a journal directory with one vanished file counted 0 bytes in all.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest

import bucketstore
from bucketstore import metrics
from bucketstore.checking.store_check import describe_store
from bucketstore.engine.directory.disk_usage import dir_usage
from bucketstore.engine.durability.journal import journal_directory
from bucketstore.format.ledger_file import ledger_file_name
from helpers import SMALL, FakeClock, fill_and_seal

SECONDS = float(os.environ.get("BUCKETSTORE_SCRAPE_SECONDS", "2"))


def _vanish_after_listing(monkeypatch, victim: str) -> list[str]:
    """Unlink ``victim`` right after the first listing of its directory returns (``os.listdir``
    or ``os.scandir``): the file a writer retires between a reader's listing and its stat.
    Returns a list that records each listing that did it."""
    directory = os.path.dirname(victim)
    real_listdir, real_scandir = os.listdir, os.scandir
    done: list[str] = []

    def vanish(path) -> None:
        if not done and os.path.abspath(os.fspath(path)) == directory and os.path.exists(victim):
            os.unlink(victim)
            done.append(os.fspath(path))

    def listdir(path="."):
        names = real_listdir(path)
        vanish(path)
        return names

    class _Listed:
        def __init__(self, entries):
            self._entries = entries

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def __iter__(self):
            return iter(self._entries)

        def close(self) -> None:
            pass

    def scandir(path="."):
        with real_scandir(path) as it:
            entries = list(it)
        vanish(path)
        return _Listed(entries)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    return done


def _retired_copy(store) -> str:
    """A ledger file a writer is about to retire: a copy of a sealed bucket under an unused id."""
    ledgers = store.ledgers_dir
    some = sorted(n for n in os.listdir(ledgers) if n.endswith(".ledger"))[0]
    victim = os.path.join(ledgers, ledger_file_name(10**12))
    shutil.copyfile(os.path.join(ledgers, some), victim)
    return victim


def _ledger_usage(store_path: str) -> tuple[int, int]:
    d = os.path.join(store_path, "ledgers")
    names = [n for n in os.listdir(d) if n.endswith(".ledger")]
    return len(names), sum(os.path.getsize(os.path.join(d, n)) for n in names)


@pytest.fixture
def sealed_store(tmp_path):
    store = bucketstore.open(tmp_path / "s", durability="journal")
    tracker = store.tracker("t", SMALL, FakeClock(0))
    fill_and_seal(tracker)
    assert tracker.stats()["immutable_buckets"] >= 2
    yield store
    store.close()


def test_store_stats_leaves_out_a_ledger_file_retired_after_the_listing(sealed_store, monkeypatch) -> None:
    store = sealed_store
    victim = _retired_copy(store)
    done = _vanish_after_listing(monkeypatch, victim)
    st = store.stats()  # raised FileNotFoundError
    assert done, "the hook never ran: stats() no longer lists ledgers/"
    monkeypatch.undo()
    assert (st["ledger_files"], st["ledger_bytes"]) == _ledger_usage(store.path)


@pytest.mark.parametrize("read_only", [False, True], ids=["live", "read-only"])
def test_a_scrape_leaves_out_a_ledger_file_retired_after_the_listing(sealed_store, monkeypatch, read_only) -> None:
    store = sealed_store
    handle = bucketstore.open(store.path, read_only=True) if read_only else store
    try:
        if read_only:
            handle.tracker("t")
        victim = _retired_copy(store)
        done = _vanish_after_listing(monkeypatch, victim)
        doc = metrics.collect(handle)
        text = metrics.prometheus_text(handle)
        assert done
        monkeypatch.undo()
        files, size = _ledger_usage(store.path)
        assert (doc["store"]["ledger_files"], doc["store"]["ledger_bytes"]) == (files, size)
        assert f"bucketstore_store_ledger_files {files}\n" in text
    finally:
        if read_only:
            handle.close()


def test_journal_bytes_leave_out_only_the_journal_file_that_vanished(sealed_store, monkeypatch) -> None:
    store = sealed_store
    journal_dir = journal_directory(store.path, "t")
    victim = os.path.join(journal_dir, "99999999999999999999.journal")
    with open(victim, "wb") as f:
        f.write(b"x" * 1000)  # a journal file a checkpoint is about to replace
    before = sum(os.path.getsize(os.path.join(journal_dir, n)) for n in os.listdir(journal_dir))
    done = _vanish_after_listing(monkeypatch, victim)
    doc = metrics.collect(store)
    assert done
    monkeypatch.undo()
    # Before the fix the whole directory counted 0 bytes once one file of it vanished.
    assert doc["trackers"]["t"]["journal_bytes"] == before - 1000 > 0
    assert doc["store"]["journal_bytes"] == before - 1000


def test_dir_usage_counts_what_vanished_and_tolerates_a_missing_directory(tmp_path, monkeypatch) -> None:
    for i in range(3):
        (tmp_path / f"f{i}").write_bytes(b"y" * (10 + i))
    (tmp_path / "sub").mkdir()  # not a file: not counted
    done = _vanish_after_listing(monkeypatch, str(tmp_path / "f1"))
    usage = dir_usage(str(tmp_path))
    assert done
    assert (usage.files, usage.bytes, usage.vanished) == (2, 22, 1)
    assert dir_usage(str(tmp_path / "gone")).files == 0
    assert dir_usage(str(tmp_path / "f0")).files == 0  # a file, not a directory


def test_scrapes_beside_a_tracker_that_seals_merges_and_deletes(tmp_path) -> None:
    """A thread scrapes (metrics text and stats, of the store and of a read-only handle) without
    pause while the tracker works."""
    clock = FakeClock(0)
    store = bucketstore.open(tmp_path / "s", durability="journal")
    config = bucketstore.TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=6, max_indexes_per_segment=2,
                                       max_num_buckets=3)
    tracker = store.tracker("t", config, clock)
    view = bucketstore.open(store.path, read_only=True)
    view.tracker("t")  # its snapshot goes stale as the writer retires files: left out then
    stop = threading.Event()
    errors: list[BaseException] = []
    scrapes = [0]

    def scrape() -> None:
        while not stop.is_set():
            try:
                metrics.prometheus_text(store)
                store.stats()
                metrics.prometheus_text(view)
                view.stats()
            except BaseException as exc:  # noqa: BLE001 - the test reports what leaked
                errors.append(exc)
                return
            scrapes[0] += 1

    thread = threading.Thread(target=scrape)
    thread.start()
    ledger = 0
    try:
        deadline = time.monotonic() + SECONDS
        # At least 23 ledgers (two trims, seals, merges) however slow the machine is, and on until
        # seals, merges and deletions have all happened (a loaded machine's worker lags: a flush
        # every 23 ledgers lets it catch up), within a bound.
        def all_kinds_ran() -> bool:
            done = tracker.operation_metrics()["operations"]
            return bool(done["create"]["ok"] and done["merge"]["ok"] and done["delete"]["ok"])

        while (time.monotonic() < deadline or ledger < 23 or not all_kinds_ran()) and ledger < 2_000 \
                and not errors:
            if ledger and ledger % 23 == 0:
                tracker.flush()
            # Half due soon (deliveries delete read-out buckets), half far ahead (buckets pile
            # up past max_num_buckets: merges), and a trim now and then (mark_delete deletes buckets).
            for entry in range(8):
                tracker.add_message(ledger, entry, clock.now + (50 if entry % 2 else 10**9) + entry)
            ledger += 1
            if ledger % 3 == 0:
                clock.now += 40
                tracker.get_scheduled_messages(100)
            if ledger % 11 == 0:
                tracker.mark_delete(ledger - 3, 0)
    finally:
        stop.set()
        thread.join()
        view.close()
    ops = tracker.operation_metrics()["operations"]
    store.close()
    assert not errors, f"a scrape raised after {scrapes[0]} scrapes: {errors[0]!r}"
    assert scrapes[0] > 10
    # The scrapes ran beside real maintenance: seals, merges and deletions all happened.
    assert ops["create"]["ok"] and ops["merge"]["ok"] and ops["delete"]["ok"], ops


def test_a_scrape_of_a_read_only_handle_leaves_out_a_tracker_whose_snapshot_went_stale(tmp_path) -> None:
    """A read-only tracker that found a file of its snapshot retired answers nothing more
    (StaleSnapshotError); the handle's scrape goes on without it instead of failing whole."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", durability="journal") as store:
        writer = store.tracker("t", SMALL, clock)
        fill_and_seal(writer)
        store.tracker("other", SMALL, clock).add_message(1, 1, 10**9)
        with bucketstore.open(store.path, read_only=True) as view:
            stale, fresh = view.tracker("t"), view.tracker("other")
            first = writer.buckets()[0]
            writer.mark_delete(first.end_ledger + 1, 0)  # retires the first bucket, key then file
            with pytest.raises(bucketstore.StaleSnapshotError):
                stale.contains_message(first.start_ledger, 0)
            doc = metrics.collect(view)  # raised StaleSnapshotError
            text = metrics.prometheus_text(view)
            assert set(doc["trackers"]) == {"other"} and fresh.number_of_delayed_messages == 1
            assert 'tracker="other"' in text and 'tracker="t"' not in text


def test_the_stats_command_leaves_out_a_ledger_file_retired_after_the_listing(sealed_store, monkeypatch) -> None:
    """``bucketstore stats`` (``describe_store``, another process's view: the store is closed
    here, LMDB refusing a second handle in one process) counts the files as ``Store.stats()``."""
    store = sealed_store
    victim = _retired_copy(store)
    store.close()
    done = _vanish_after_listing(monkeypatch, victim)
    doc = describe_store(store.path)
    assert done
    monkeypatch.undo()
    assert doc["ledger_files"] == _ledger_usage(store.path)[0]
    assert metrics.from_description(doc)["store"]["ledger_files"] == doc["ledger_files"]
