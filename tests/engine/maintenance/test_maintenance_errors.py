"""A background failure reaches the writer, not a monitoring thread (issue 24, item 6).

A real seal fails on the store's maintenance thread (the file layer fails its fsync with
ENOSPC). Reads (``stats``, counts, ``contains_message``, ``next_delivery_time``,
``has_message_available``, ``bucketstore.metrics``) never raise it and ``stats()`` shows it;
the next write-side call raises it once as ``bucketstore.MaintenanceError`` having done
nothing, and ``close`` raises it after closing.
"""

from __future__ import annotations

import errno
import threading
import time

import pytest
from helpers import FakeClock

import bucketstore
from bucketstore import BucketStoreError, MaintenanceError, StoreClosedError, TrackerConfig
from bucketstore.engine.store.store import Store
from bucketstore.testing.faults import FaultyFileSystem

CONFIG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=2)


def _failed_seal(path, durability="sealed"):
    """A store whose tracker's background seal of ledger 1 has failed, not yet raised to anyone:
    its file's fsync fails with ENOSPC (sealed), or its catalog commit fails (journal, whose
    own fsyncs must go on working)."""
    fs = FaultyFileSystem()
    store = Store(path, durability=durability, fs=fs, background=True)
    fs.attach(store.catalog)
    clock = FakeClock(0)
    t = store.tracker("sub", CONFIG, clock)
    for e in range(6):
        t.add_message(1, e, 1000 + e)
    fs.fail(errno.ENOSPC, ops=["fsync"] if durability == "sealed" else ["catalog_commit"], times=None)
    t.add_message(2, 0, 5000)  # rolls ledger 1: its seal runs, and fails, on the worker
    deadline = time.monotonic() + 30
    while t.stats()["maintenance_failures"] == 0:  # a read: waits without taking the error
        assert time.monotonic() < deadline, "the seal never failed"
        time.sleep(0.005)
    fs.rules.clear()
    return store, t, clock


def test_reads_never_raise_it_and_stats_shows_it(tmp_path):
    store, t, clock = _failed_seal(tmp_path / "s")
    try:
        for _ in range(3):  # any number of scrapes
            st = t.stats()
            assert "No space left on device" in st["maintenance_failure"]
            assert st["maintenance_failures"] == 1 and st["maintenance"]["failed"] == 1
            assert t.number_of_delayed_messages == 7
            assert t.contains_message(1, 3) and t.next_delivery_time() == 1000
            assert not t.has_message_available()
            assert bucketstore.metrics.collect(store)["trackers"]["sub"]["maintenance_failures"] == 1
            assert "bucketstore_tracker_maintenance_failures_total" in bucketstore.metrics.prometheus_text(store)
        # The writer's next call gets it, once, and that call did nothing.
        with pytest.raises(MaintenanceError) as info:
            t.add_message(3, 0, 9000)
        assert isinstance(info.value, BucketStoreError) and isinstance(info.value.__cause__, OSError)
        assert "tracker 'sub'" in str(info.value) and "No space left" in str(info.value)
        assert not t.contains_message(3, 0)
        assert t.stats()["maintenance_failure"] is None and t.stats()["maintenance_failures"] == 1
        assert t.add_message(3, 0, 9000)  # raised once: the tracker goes on
        t.flush()
        clock.now = 10**6
        assert t.get_scheduled_messages(100) == [(1, e) for e in range(6)] + [(2, 0), (3, 0)]  # lost nothing
    finally:
        store.close()


def test_a_gauge_counts_the_failures_not_yet_raised(tmp_path):
    store, t, _ = _failed_seal(tmp_path / "s")
    gauge = "bucketstore_tracker_pending_maintenance_failures"
    try:
        assert t.stats()["pending_maintenance_failures"] == 1
        assert f'{gauge}{{tracker="sub"}} 1\n' in bucketstore.metrics.prometheus_text(store)
        with pytest.raises(MaintenanceError):
            t.flush()
        assert t.stats()["pending_maintenance_failures"] == 0
        assert f'{gauge}{{tracker="sub"}} 0\n' in bucketstore.metrics.prometheus_text(store)
    finally:
        store.close()


def test_a_metrics_thread_does_not_take_the_writers_error(tmp_path):
    store, t, _ = _failed_seal(tmp_path / "s")
    stop = threading.Event()
    scraped = []

    def scrape():
        while not stop.is_set():
            scraped.append(bucketstore.metrics.collect(store)["trackers"]["sub"]["maintenance_failures"])
            t.stats()

    thread = threading.Thread(target=scrape)
    thread.start()
    try:
        while len(scraped) < 50:
            time.sleep(0.001)
        with pytest.raises(MaintenanceError):
            t.flush()
    finally:
        stop.set()
        thread.join()
        store.close()
    assert set(scraped) == {1}


WRITES = {
    "add_message": lambda t: t.add_message(9, 0, 10**7),
    "add_messages": lambda t: t.add_messages([(9, 0, 10**7), (9, 1, 10**7)]),
    "get_scheduled_messages": lambda t: t.get_scheduled_messages(10),
    "wait_scheduled": lambda t: t.wait_scheduled(10, timeout=0),
    "confirm_delivered": lambda t: t.confirm_delivered(),
    "mark_delete": lambda t: t.mark_delete(1, 2),
    "clear": lambda t: t.clear(),
    "flush": lambda t: t.flush(),
    "wait_for_maintenance": lambda t: t.wait_for_maintenance(),
}


@pytest.mark.parametrize("call", sorted(WRITES))
def test_every_write_side_call_raises_it_having_done_nothing(tmp_path, call):
    store, t, clock = _failed_seal(tmp_path / "s", durability="journal")
    try:
        clock.now = 1002  # (1, 0..2) are due: a delivery would change state
        before = (t.number_of_delayed_messages, [t.contains_message(1, e) for e in range(6)])
        with pytest.raises(MaintenanceError):
            WRITES[call](t)
        assert (t.number_of_delayed_messages, [t.contains_message(1, e) for e in range(6)]) == before
        WRITES[call](t)  # once per failure
    finally:
        store.close()


def test_close_raises_it_once_closed_and_the_store_closes_everything(tmp_path):
    store, t, _ = _failed_seal(tmp_path / "s", durability="journal")
    other = store.tracker("other", CONFIG, FakeClock(0))
    other.add_message(1, 0, 10**6)
    with pytest.raises(MaintenanceError):
        store.close()
    with pytest.raises(StoreClosedError):
        t.stats()
    with pytest.raises(StoreClosedError):
        other.stats()
    store.close()  # idempotent, nothing left to raise
    with bucketstore.open(tmp_path / "s", "journal") as again:  # the lock was released
        assert again.tracker("other", CONFIG, FakeClock(0)).contains_message(1, 0)
        assert again.tracker("sub", CONFIG, FakeClock(0)).number_of_delayed_messages == 7


def test_tracker_close_raises_it_after_closing(tmp_path):
    store, t, _ = _failed_seal(tmp_path / "s", durability="journal")
    try:
        with pytest.raises(MaintenanceError):
            t.close()
        with pytest.raises(StoreClosedError):
            t.add_message(5, 0, 10**6)
        assert t.close() is True
    finally:
        store.close()


def test_a_with_block_already_failing_keeps_its_own_error(tmp_path):
    store, t, _ = _failed_seal(tmp_path / "s", durability="journal")
    with pytest.raises(KeyError):
        with store:
            raise KeyError("the application's own error")
    with pytest.raises(StoreClosedError):
        t.stats()


def test_maintenance_error_is_exported():
    assert bucketstore.MaintenanceError is MaintenanceError and "MaintenanceError" in bucketstore.__all__
    assert issubclass(MaintenanceError, BucketStoreError)
