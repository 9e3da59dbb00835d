"""Segment read-ahead: a sealed bucket's next segment is read on the store's reader thread.

The reader thread is held, when a test needs a read to stay in flight, by a
request of the test's own queued in front (the reader takes requests in order),
never by sleeps in product code. Waiting for a read to finish polls its ``done``
flag with a generous bound; no assertion depends on timing.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

import bucketstore
from bucketstore import InMemoryTracker, TrackerConfig
from bucketstore.engine.buckets.read_ahead import SegmentRead
from bucketstore.errors import CorruptLedgerError
from bucketstore.format.ledger_file import LedgerReader

from helpers import FakeClock, example_count

CFG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=100, max_indexes_per_segment=20)


class HeldBucket:
    """A stand-in request target that keeps the reader thread busy until released."""

    dead = False

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def read_segment(self, number: int):
        self.started.set()
        assert self.release.wait(60), "test never released the reader"
        return None


def _hold_reader(store) -> HeldBucket:
    held = HeldBucket()
    store.segment_reader.submit(SegmentRead(held, 1))
    assert held.started.wait(60)
    return held


def _wait_done(request: SegmentRead) -> None:
    deadline = time.monotonic() + 60
    while not request.done:
        assert time.monotonic() < deadline, "read-ahead never finished"
        time.sleep(0.001)


def _sealed_store(path, clock, *, background=False, **kw):
    """A store holding one sealed bucket: ledger 1, 100 indexes at 1000..1099, 5 segments of 20."""
    store = bucketstore.open(path, background=background, read_ahead=True, **kw)
    t = store.tracker("t", CFG, clock)
    assert t.add_messages([(1, e, 1000 + e) for e in range(100)]) == 100
    assert t.add_message(2, 0, 10_000)  # rolls ledger 1 over: it is sealed
    t.wait_for_maintenance()
    assert len(t.buckets()) == 1
    return store, t


def _drain(t, clock, upto=10 ** 9):
    clock.now = upto
    out = []
    while True:
        got = t.get_scheduled_messages(1000)
        if not got:
            return out
        out.extend(got)


def test_a_low_segment_is_read_ahead_and_handed_over_without_a_disk_read(tmp_path):
    clock = FakeClock(0)
    store, t = _sealed_store(tmp_path / "s", clock)
    with store:
        clock.now = 1004
        assert t.get_scheduled_messages(100) == [(1, e) for e in range(5)]  # segment 1: kept by the seal
        # The frontier looks ahead of the cutoff to the end of segment 1: all of the loaded
        # run is in it, so the run is low and segment 2 is asked for at once.
        bucket = t.buckets()[0]
        assert bucket.ahead is not None and bucket.ahead.number == 2
        _wait_done(bucket.ahead)
        assert t.stats()["read_ahead"]["held_indexes"] == 20  # segment 2, read, not yet taken
        loads = t.stats()["load"]["succeeded"]
        clock.now = 1039
        assert t.get_scheduled_messages(100) == [(1, e) for e in range(5, 40)]
        ra = t.stats()["read_ahead"]
        assert ra["hits"] == 1 and ra["misses"] == 0 and ra["failed"] == 0  # segment 2 read ahead
        assert t.stats()["load"]["succeeded"] == loads + 1  # still counted as a load
        assert _drain(t, clock) == [(1, e) for e in range(40, 100)] + [(2, 0)]
        ra = t.stats()["read_ahead"]
        assert ra["hits"] + ra["misses"] == 4  # segments 2-5 taken once each, read ahead or not


def test_a_segment_needed_before_its_read_started_is_read_now_and_the_read_is_skipped(tmp_path):
    clock = FakeClock(0)
    store, t = _sealed_store(tmp_path / "s", clock)
    with store:
        held = _hold_reader(store)
        try:
            clock.now = 1010
            assert t.get_scheduled_messages(11) == [(1, e) for e in range(11)]  # low: read queued
            request = t.buckets()[0].ahead
            clock.now = 1030
            assert t.get_scheduled_messages(100) == [(1, e) for e in range(11, 31)]  # needs segment 2 now
            ra = t.stats()["read_ahead"]
            assert (ra["late"], ra["misses"], ra["hits"]) == (1, 1, 0) and request.cancelled
        finally:
            held.release.set()
        _wait_done(request)
        assert not request.started and request.run is None  # skipped, never read
        assert _drain(t, clock) == [(1, e) for e in range(31, 100)] + [(2, 0)]


def test_read_ahead_off_by_default_in_a_synchronous_store(tmp_path):
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", background=False) as store:
        assert store.segment_reader is None
        t = store.tracker("t", CFG, clock)
        t.add_messages([(1, e, 1000 + e) for e in range(100)])
        t.add_message(2, 0, 10_000)
        assert _drain(t, clock) == [(1, e) for e in range(100)] + [(2, 0)]
        ra = t.stats()["read_ahead"]
        assert ra == {"enabled": False, "requested": 0, "hits": 0, "misses": 0, "late": 0, "failed": 0,
                      "dropped": 0, "open_requests": 0, "opened_ahead": 0, "held_indexes": 0}
    with bucketstore.open(tmp_path / "b", background=True) as store:
        assert store.segment_reader is not None and store.read_ahead


def _corrupt_segment(path: str, number: int) -> tuple[int, bytes]:
    with LedgerReader(path) as reader:
        at = reader.entry_payload_offset(number) + 4
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(8)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in old))
    return at, old


def _restore(path: str, at: int, old: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(old)


@pytest.mark.parametrize("background", [False, True])
def test_a_failed_read_ahead_falls_back_to_the_synchronous_read(tmp_path, background):
    """Damage seen only by the read-ahead (repaired before the segment is needed): the
    segment is read again synchronously and delivery is exact."""
    clock = FakeClock(0)
    store, t = _sealed_store(tmp_path / "s", clock, background=background)
    with store:
        bucket = t.buckets()[0]
        at, old = _corrupt_segment(bucket.path, 2)
        clock.now = 1010
        # The frontier reaches to the end of segment 1 (kept by the seal): it is low at once,
        # and segment 2 is read ahead, and is damaged.
        assert len(t.get_scheduled_messages(5)) == 5
        assert len(t.get_scheduled_messages(6)) == 6
        _wait_done(bucket.ahead)
        assert isinstance(bucket.ahead.error, CorruptLedgerError)
        _restore(bucket.path, at, old)
        assert _drain(t, clock) == [(1, e) for e in range(11, 100)] + [(2, 0)]
        ra = t.stats()["read_ahead"]
        assert ra["failed"] == 1 and ra["hits"] >= 0 and t.stats()["load"]["failed"] == 0


@pytest.mark.parametrize("read_ahead", [False, True])
def test_damage_found_during_read_ahead_is_reported_as_without_it(tmp_path, read_ahead):
    """Lasting damage: get_scheduled_messages raises the same typed error, naming the file,
    with and without read-ahead, and nothing after the damaged segment is delivered early."""
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s", read_ahead=read_ahead) as store:
        t = store.tracker("t", CFG, clock)
        t.add_messages([(1, e, 1000 + e) for e in range(100)])
        t.add_message(2, 0, 10_000)
        t.wait_for_maintenance()  # the seal runs on the store's worker
        bucket = t.buckets()[0]
        _corrupt_segment(bucket.path, 2)
        clock.now = 1010
        # The frontier reaches to the end of segment 1 (kept by the seal): it is low at once,
        # and segment 2 is read ahead (if on).
        assert len(t.get_scheduled_messages(5)) == 5
        assert len(t.get_scheduled_messages(6)) == 6
        if read_ahead:
            _wait_done(bucket.ahead)
            assert isinstance(bucket.ahead.error, CorruptLedgerError)
        clock.now = 1050
        assert t.get_scheduled_messages(5) == [(1, e) for e in range(11, 16)]  # the rest of segment 1
        # The rows before the damaged segment are returned (once: they were taken), then the
        # read of the segment raises, at the next call.
        assert t.get_scheduled_messages(100) == [(1, e) for e in range(16, 20)]
        with pytest.raises(CorruptLedgerError) as info:
            t.get_scheduled_messages(100)
        assert bucket.path in str(info.value)
        assert t.stats()["load"]["failed"] >= 1
        assert t.contains_message(1, 20)  # nothing of the damaged segment was taken
        assert t.number_of_delayed_messages == 81  # 80 of the bucket, (2, 0)


@pytest.mark.parametrize("event", ["merge", "mark_delete", "clear", "close", "delete_tracker"])
def test_a_read_in_flight_when_its_bucket_goes_is_never_taken(tmp_path, event):
    """The reader is held with a read of a bucket queued; the bucket is merged away, trimmed,
    cleared or closed meanwhile; then the read finishes. Nothing is delivered twice or lost."""
    clock = FakeClock(0)
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=100, max_indexes_per_segment=20,
                        max_num_buckets=2)
    with bucketstore.open(tmp_path / "s", read_ahead=True) as store:
        t = store.tracker("t", cfg, clock)
        mem = InMemoryTracker(cfg, clock)
        for tr in (t, mem):
            tr.add_messages([(1, e, 1000 + e) for e in range(100)])
            tr.add_messages([(2, e, 1000 + e) for e in range(100)])
            tr.add_message(3, 0, 10_000)
        t.wait_for_maintenance()  # the seals run on the store's worker
        assert len(t.buckets()) == 2
        held = _hold_reader(store)
        try:
            _racing_event(store, t, mem, cfg, clock, held, event)
        finally:
            held.release.set()


def _racing_event(store, t, mem, cfg, clock, held, event):
    clock.now = 1010
    assert t.get_scheduled_messages(22) == mem.get_scheduled_messages(22)  # low now: reads queued
    pending = [b.ahead for b in t.buckets() if b.ahead is not None]
    assert pending and not any(r.done for r in pending)
    if event == "merge":
        for tr in (t, mem):
            tr.add_messages([(3, e, 2000 + e) for e in range(1, 101)])
            tr.add_message(4, 0, 10_000)  # a third bucket: the first two are merged
        t.wait_for_maintenance()
        assert any(r.bucket.dead for r in pending)  # merged away with a read in flight
    elif event == "mark_delete":
        for tr in (t, mem):
            tr.mark_delete(2, 0)  # bucket [1, 1] goes
    elif event == "clear":
        for tr in (t, mem):
            tr.clear()
    elif event in ("close", "delete_tracker"):
        if event == "close":
            t.close()
        else:
            store.delete_tracker("t")
        held.release.set()
        for r in pending:
            _wait_done(r)
        t = store.tracker("t", cfg, clock)  # reopened: recovered from disk
        if event == "delete_tracker":
            mem = InMemoryTracker(cfg, clock)
        else:
            got = _drain(t, clock)
            assert len(got) == len(set(got))
            # Sealed mode keeps what was sealed (the mutable bucket's ledger 3 was not).
            assert {p for p in _drain(mem, clock) if p[0] < 3} <= set(got)
            return
    held.release.set()
    for r in pending:
        _wait_done(r)
    assert t.stats()["read_ahead"]["hits"] == 0
    clock.now = 1500
    assert t.get_scheduled_messages(1000) == mem.get_scheduled_messages(1000)
    assert _drain(t, clock) == _drain(mem, clock)
    assert t.number_of_delayed_messages == 0
    t._check()


@pytest.mark.parametrize("durability,background", [("sealed", False), ("sealed", True), ("journal", True)])
def test_deliveries_match_the_in_memory_tracker_under_threads_while_read_ahead_runs(tmp_path, durability,
                                                                                     background):
    """Adders, a deliverer, a trimmer and (background) the maintenance worker and the reader
    at once. Each call goes to the bucket tracker and to InMemoryTracker under one test lock
    and must give the same answer; the worker and the reader run freely meanwhile, so reads
    ahead finish, go stale or race seals, merges, trims and deletions at random points."""
    rounds = example_count(3)
    totals = {"hits": 0, "requested": 0}
    for seed in range(rounds):
        rng = random.Random(seed)
        clock = FakeClock(0)
        cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=rng.choice([40, 120]),
                            max_indexes_per_segment=rng.choice([8, 30]), max_num_buckets=rng.choice([2, 3]))
        with bucketstore.open(tmp_path / f"s{seed}", durability, background=background, read_ahead=True,
                              sync_interval_ms=5) as store:
            t = store.tracker("t", cfg, clock)
            mem = InMemoryTracker(cfg, clock)
            lock = threading.Lock()
            stop = threading.Event()
            errors: list[BaseException] = []

            def both(call, *args):
                with lock:
                    got, want = getattr(t, call)(*args), getattr(mem, call)(*args)
                    assert got == want, (call, args, got, want)
                    assert t.number_of_delayed_messages == mem.number_of_delayed_messages
                    return got

            def adder(first_ledger: int) -> None:
                try:
                    for ledger in range(first_ledger, first_ledger + 30, 2):
                        adding[0] = ledger
                        for _ in range(rng.randint(1, 4)):
                            n = rng.randint(1, 40)
                            first = rng.randint(0, 60)
                            both("add_messages", [(ledger, first + i, clock.now + rng.randint(1, 300))
                                                  for i in range(n)])
                            time.sleep(0)
                except BaseException as exc:
                    errors.append(exc)
                    stop.set()

            def deliverer() -> None:
                try:
                    while not stop.is_set():
                        with lock:
                            clock.now += rng.randint(0, 4)
                        both("get_scheduled_messages", rng.randint(1, 25))
                        if rng.random() < 0.1:
                            both("next_delivery_time")
                        time.sleep(0)
                except BaseException as exc:
                    errors.append(exc)
                    stop.set()

            adding = [1]

            def trimmer() -> None:
                try:
                    while not stop.is_set():
                        time.sleep(0.002)
                        if rng.random() < 0.3:  # trails the adders: old ledgers are acknowledged
                            both("mark_delete", max(0, adding[0] - rng.randint(4, 12)), rng.randint(0, 30))
                except BaseException as exc:
                    errors.append(exc)
                    stop.set()

            threads = [threading.Thread(target=adder, args=(1,)), threading.Thread(target=adder, args=(2,)),
                       threading.Thread(target=deliverer), threading.Thread(target=trimmer)]
            for th in threads:
                th.start()
            for th in threads[:2]:
                th.join()
            stop.set()
            for th in threads[2:]:
                th.join()
            assert not errors, errors
            t.wait_for_maintenance()
            clock.now += 10 ** 6
            while both("get_scheduled_messages", 100):
                pass
            assert t.number_of_delayed_messages == 0
            ra = t.stats()["read_ahead"]
            assert ra["hits"] + ra["misses"] == t.stats()["load"]["succeeded"] + t.stats()["load"]["failed"]
            totals["hits"] += ra["hits"]
            totals["requested"] += ra["requested"]
            t._check()
    assert totals["requested"] > 0  # read-ahead did run (hits depend on scheduling: not asserted)
