"""A delivery call that fails on a transient I/O error loses no row.

The embedder polls ``get_scheduled_messages`` as time passes; a call that meets an I/O error
(``EMFILE`` on every open, ``EIO`` on one read or one durable call) raises, and the embedder
logs it and polls again. Whatever the failed call had taken from the queue must come back:
once the fault clears, the polls deliver every position exactly once, and in journal mode a
restart right after the failure delivers every position not returned before it (at least
once). A fault that lasts (a journal poisoned by a failed write or fsync) is survived by the
restart: nothing is lost.

Faults come from :class:`~bucketstore.testing.faults.FaultyFileSystem` and are swept over every
call index of a small delivery workload: its read calls (the ledger files are read only by
delivery here, recovery keeps the buckets unopened) with read-ahead on and off, and its durable
calls (journal commits, a journal file reopened after the descriptor pool closed it, bucket
deletions), in both durability modes. ``BUCKETSTORE_FAULT_SWEEP`` scales the swept workload
(its number of ledgers; default 2). The issue's case also runs through ``wait_scheduled`` and
``bucketstore.aio.next_due``; a read-ahead thread that cannot start is the last case.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import threading
from pathlib import Path

import pytest

import bucketstore
import bucketstore.aio
import bucketstore.engine.store.store as store_module
from bucketstore import TrackerConfig
from bucketstore.engine.store.store import Store
from bucketstore.errors import BucketStoreError
from bucketstore.testing.faults import FaultyFileSystem, abandon_store

from helpers import FakeClock

START = 1_000

MODES = [pytest.param(d, ra, id=f"{d}-{'readahead' if ra else 'sync'}")
         for d in ("sealed", "journal") for ra in (False, True)]


class Workload:
    """``ledgers`` ledgers of ``per_ledger`` rows, interleaved in time (a batch spans buckets),
    sealed one bucket per ledger in segments of 5, all acknowledged (flushed), then closed;
    polled ``batch`` at a time every ``step_ms``."""

    def __init__(self, root: Path, durability: str, ledgers: int, per_ledger: int, *, batch: int = 7,
                 step_ms: int = 7, delivery: str = "at-least-once") -> None:
        self.durability = durability
        self.delivery = delivery
        self.batch = batch
        self.step_ms = step_ms
        self.config = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=per_ledger, max_indexes_per_segment=5)
        self.rows = [(ledger, entry, START + 7 * entry + ledger) for ledger in range(ledgers)
                     for entry in range(per_ledger)]
        self.until = max(t for _, _, t in self.rows) + step_ms
        self.template = root / "template"
        with bucketstore.open(self.template, durability=durability, background=False, read_ahead=False) as store:
            t = store.tracker("t", self.config, FakeClock(0))
            assert t.add_messages(self.rows) == len(self.rows)
            t.add_message(10_000, 0, 10**12)  # rolls the ledger range: the ledgers above are sealed
            t.flush()
            assert len(t.buckets()) == ledgers
        self._copies = 0
        self._root = root

    def copy(self) -> Path:
        self._copies += 1
        path = self._root / f"run{self._copies}"
        shutil.copytree(self.template, path)
        return path

    @property
    def positions(self) -> list[tuple[int, int]]:
        return sorted((ledger, entry) for ledger, entry, _ in self.rows)


class Poll:
    """The embedder: polls as time passes, logs a failed call and polls again.

    :param noisy: a second tracker adds a row at every poll; with a journal descriptor pool of
        one file (the test patches it), its commit closes the polled tracker's journal file, which
        the polled tracker's next commit reopens (``open_append``): a durable call of every poll.
    """

    def __init__(self, work: Workload, path: Path, read_ahead: bool, *, fs: FaultyFileSystem | None = None,
                 noisy: bool = False, how: str = "get") -> None:
        self.work = work
        self.how = how
        self.path = path
        self.fs = fs or FaultyFileSystem()
        extra = {"delivery": work.delivery} if work.durability == "journal" else {}
        self.store = Store(path, durability=work.durability, fs=self.fs, background=False, read_ahead=read_ahead,
                           confirm_sync_ms=0, **extra)  # every poll commits its confirmation
        self.fs.attach(self.store.catalog)
        self.clock = FakeClock(START)
        self.tracker = self.store.tracker("t", work.config, self.clock)
        self.noise = self.store.tracker("noise", work.config, self.clock) if noisy else None
        self.tracked = self.tracker.number_of_delayed_messages  # at open
        self.got: list[tuple[int, int]] = []
        self.failed = 0
        self.last_failed = False
        self.abandoned = False

    def call(self) -> bool:
        """One poll; False when it raised (the clock moves on either way)."""
        if self.noise is not None:
            try:
                self.noise.add_message(20_000, self.clock.now, 10**12)
            except (OSError, BucketStoreError):
                pass  # the noise's own fault: not what is checked
        try:
            batch = self._take()
        except (OSError, BucketStoreError):
            self.failed += 1
            self.last_failed = True
            return False
        finally:
            self.clock.now += self.work.step_ms
        self.last_failed = False
        self.got.extend(batch)
        return True

    def _take(self) -> list[tuple[int, int]]:
        if self.how == "wait":
            return self.tracker.wait_scheduled(self.work.batch, timeout=0)
        if self.how == "aio":
            return asyncio.run(bucketstore.aio.next_due(self.tracker, self.work.batch, timeout=0))
        return self.tracker.get_scheduled_messages(self.work.batch)

    def drain(self) -> None:
        """Poll until every row is due, then until a call succeeds with nothing left (or fails
        as often as there are rows: a fault that lasts)."""
        while self.clock.now <= self.work.until:
            self.call()
        for _ in range(len(self.work.rows)):
            before = len(self.got)
            if self.call() and len(self.got) == before:
                return

    def check_exactly_once(self) -> None:
        want = self.work.positions
        assert sorted(self.got) == want, (
            f"lost {sorted(set(want) - set(self.got))}, "
            f"twice {sorted(p for p in set(self.got) if self.got.count(p) > 1)}")
        assert self.tracker.number_of_delayed_messages == self.tracked - len(want)

    def restart_delivers_the_rest(self) -> None:
        """The process is abandoned where it stands (nothing confirmed, nothing closed, as a crash);
        the reopened store delivers every position not returned before (at least once)."""
        abandon_store(self.store)
        self.abandoned = True
        after = Poll(self.work, self.path, read_ahead=False)
        try:
            after.clock.now = self.clock.now
            after.drain()
            missing = set(self.work.positions) - set(self.got) - set(after.got)
            assert not missing, f"lost across the restart: {sorted(missing)}"
        finally:
            after.store.close()

    def close(self) -> None:
        if self.abandoned:
            return
        try:
            self.store.close()
        except BucketStoreError:
            abandon_store(self.store)  # a poisoned journal cannot commit at close


def _sweep_ledgers() -> int:
    return int(os.environ.get("BUCKETSTORE_FAULT_SWEEP", "2"))


@pytest.mark.parametrize("durability, read_ahead, how", [
    *[pytest.param(*mode.values, "get", id=mode.id) for mode in MODES],
    pytest.param("journal", False, "wait", id="journal-sync-wait_scheduled"),
    pytest.param("journal", False, "aio", id="journal-sync-aio.next_due"),
])
def test_every_open_failing_during_one_call_loses_nothing(tmp_path, durability, read_ahead, how):
    """The issue's case: 80 acknowledged indexes (4 ledgers, segments of 5) polled 7 at a time;
    during one call every open fails with EMFILE, and the embedder polls again (or, in journal
    mode, the process dies right after). Swept over every call of the drain; the same through
    ``wait_scheduled`` and ``bucketstore.aio.next_due``."""
    work = Workload(tmp_path, durability, 4, 20)
    calls = (work.until - START) // work.step_ms + 1
    restarts = (False, True) if durability == "journal" else (False,)
    raised = 0
    for k in range(calls):
        for restart in restarts:
            poll = Poll(work, work.copy(), read_ahead, how=how)
            try:
                for _ in range(k):
                    assert poll.call()
                rule = poll.fs.fail_reads(errno.EMFILE, ops=["open_read"], times=None)
                ok = poll.call()
                poll.fs.heal()
                raised += not ok
                assert ok or rule.fired, "a call raised without a fault"
                if restart:
                    poll.restart_delivers_the_rest()
                    continue
                poll.drain()
                poll.check_exactly_once()
            finally:
                poll.close()
    assert raised, "no call met the fault: the test tests nothing"
    print(f"\n{durability}, read-ahead {read_ahead}, {how}: {calls} calls swept, {raised} raised")


def _counted(work: Workload, read_ahead: bool, noisy: bool = False) -> tuple[int, int, list[tuple[str, str]]]:
    """A clean drain: how many read calls it makes, and its durable calls (the first one's
    number, and each call's kind and target)."""
    poll = Poll(work, work.copy(), read_ahead, noisy=noisy)
    try:
        first = poll.fs.calls
        poll.drain()
        poll.check_exactly_once()
        return poll.fs.reads, first, poll.fs.log[first:]
    finally:
        poll.close()


@pytest.mark.parametrize("durability, read_ahead", MODES)
def test_a_transient_fault_on_any_read_loses_nothing(tmp_path, durability, read_ahead):
    """One read call fails (EIO), for each read call of the drain in turn: the polls after it
    deliver everything exactly once, and in journal mode a restart right after it loses nothing."""
    work = Workload(tmp_path, durability, _sweep_ledgers(), 10, batch=3, step_ms=7)
    reads, _, _ = _counted(work, read_ahead)
    assert reads >= 4 * len({r[0] for r in work.rows}), reads
    # (The restart is tried once per read, without read-ahead: what it recovers does not depend on it.)
    restarts = (False, True) if durability == "journal" and not read_ahead else (False,)
    fired = ahead_failed = 0
    for k in range(reads):
        for restart in restarts:
            poll = Poll(work, work.copy(), read_ahead)
            try:
                rule = poll.fs.fail_reads(errno.EIO, first_read=k)
                while poll.clock.now <= work.until and not rule.fired:
                    poll.call()
                fired += rule.fired
                if restart:
                    poll.restart_delivers_the_rest()
                    continue
                poll.drain()
                poll.check_exactly_once()
                ahead_failed += poll.tracker.stats()["read_ahead"]["failed"]
            finally:
                poll.close()
    # (With read-ahead a reader thread races the polls, so a read's number may differ between
    # runs; most still fire. Whether one lands in the reader thread is up to the scheduler: a
    # fresh clone's CI run had none, so it is reported, not required. A failed read-ahead is
    # pinned deterministically by tests/engine/buckets/test_read_ahead.py's
    # test_a_failed_read_ahead_falls_back_to_the_synchronous_read.)
    assert fired >= len(restarts) * reads // 2, (fired, reads)
    print(f"\n{durability}, read-ahead {read_ahead}: {reads} read calls swept x {len(restarts)}, {fired} faults fired, "
          f"{ahead_failed} in the reader thread")


@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_a_fault_on_any_durable_call_of_a_drain_loses_nothing(tmp_path, durability, monkeypatch):
    """One durable call of the drain fails (EIO), for each in turn: a journal commit's write or
    fsync (which poisons the journal: the fault lasts until a restart), the reopening of the
    journal file the descriptor pool closed (transient: the retry goes on), a bucket deletion's
    catalog commit or unlink (the bucket is deleted later or at the next open). A transient
    fault: the polls deliver everything exactly once. A lasting one: the restart loses nothing."""
    monkeypatch.setattr(store_module, "JOURNAL_OPEN_FILES", 1)
    work = Workload(tmp_path, durability, _sweep_ledgers(), 10, batch=3, step_ms=7)
    _, first, calls = _counted(work, read_ahead=False, noisy=True)
    # The noise tracker's own calls are left out: their faults are its own.
    swept = [k for k, (_, target) in enumerate(calls) if f"{os.sep}noise-" not in target]
    assert len(swept) >= (10 if durability == "journal" else 2), calls
    outcomes = {"transient": 0, "lasting": 0}
    for k in swept:
        poll = Poll(work, work.copy(), read_ahead=False, noisy=True)
        try:
            assert poll.fs.calls == first
            rule = poll.fs.fail(errno.EIO, first_call=first + k)
            poll.drain()
            assert rule.fired
            if poll.last_failed:
                outcomes["lasting"] += 1
                assert durability == "journal", "only a poisoned journal fails every call"
                poll.restart_delivers_the_rest()
            else:
                outcomes["transient"] += 1
                poll.check_exactly_once()
        finally:
            poll.close()
    assert outcomes["transient"] and (outcomes["lasting"] or durability == "sealed"), outcomes
    print(f"\n{durability}: {len(swept)} durable calls swept, {outcomes}")


def _fail_a_delivery_commit(poll: Poll) -> list[tuple[int, int]]:
    """One batch returned; then a call whose commit cannot reopen the journal file (EMFILE, after
    the descriptor pool closed it) raises OSError, having kept nothing. Returns the first batch."""
    poll.clock.now = START + 30
    assert poll.call()
    first = list(poll.got)
    poll.noise.add_message(20_000, 1, 10**12)  # its commit closes the polled journal's file
    poll.clock.now = START + 60
    rule = poll.fs.fail(errno.EMFILE, ops=["open_append"])
    count = poll.tracker.number_of_delayed_messages
    with pytest.raises(OSError) as info:
        poll.tracker.get_scheduled_messages(poll.work.batch)
    assert rule.fired == 1 and info.value.errno == errno.EMFILE
    assert poll.tracker.number_of_delayed_messages == count, "the failed call kept rows"
    return first


def test_a_journal_that_cannot_reopen_its_file_gives_the_batch_back(tmp_path, monkeypatch):
    """The delivery's commit cannot reopen the journal file: the call raises OSError, having
    recorded nothing and kept nothing; the journal is not poisoned, and the retry delivers the
    batch, once."""
    monkeypatch.setattr(store_module, "JOURNAL_OPEN_FILES", 1)
    work = Workload(tmp_path, "journal", 2, 10, batch=3, step_ms=7)
    poll = Poll(work, work.copy(), read_ahead=False, noisy=True)
    try:
        first = _fail_a_delivery_commit(poll)
        batch = poll.tracker.get_scheduled_messages(work.batch)
        assert len(batch) == work.batch and not set(batch) & set(first)
        assert all(poll.tracker.contains_message(*p) is False for p in batch)
        poll.got.extend(batch)
        poll.drain()
        poll.check_exactly_once()
    finally:
        poll.close()


@pytest.mark.parametrize("delivery", ["at-least-once", "at-most-once"])
def test_a_crash_after_a_failed_delivery_and_a_shorter_retry_loses_nothing(tmp_path, monkeypatch, delivery):
    """The failed call's journal records go with its batch: a retry that takes one row of it
    commits, the process dies, and the restart delivers the others. (An at-most-once frontier
    the failed call left pending would have covered them: lost for good.)"""
    monkeypatch.setattr(store_module, "JOURNAL_OPEN_FILES", 1)
    work = Workload(tmp_path, "journal", 2, 10, batch=3, step_ms=7, delivery=delivery)
    poll = Poll(work, work.copy(), read_ahead=False, noisy=True)
    try:
        _fail_a_delivery_commit(poll)
        retry = poll.tracker.get_scheduled_messages(1)
        assert len(retry) == 1
        poll.got.extend(retry)
        poll.restart_delivers_the_rest()
    finally:
        poll.close()


def test_a_reader_thread_that_cannot_start_costs_only_the_read_ahead(tmp_path, monkeypatch, caplog):
    """The read-ahead thread cannot be started (``RuntimeError: can't start new thread``, the
    process out of threads or memory): the segments are read when needed, as without
    read-ahead; no call raises and every position is delivered once. Once threads can start
    again, the reader starts."""
    start = threading.Thread.start

    def refuse_reader(thread: threading.Thread) -> None:
        if thread.name.startswith("bucketstore-readahead"):
            raise RuntimeError("can't start new thread")
        start(thread)

    work = Workload(tmp_path, "journal", 2, 10, batch=3)
    monkeypatch.setattr(threading.Thread, "start", refuse_reader)
    poll = Poll(work, work.copy(), read_ahead=True)
    try:
        while poll.clock.now <= START + 10:
            assert poll.call()
        assert "the reader thread cannot start" in caplog.text
        reader = f"bucketstore-readahead {poll.store.path}"
        assert not any(t.name == reader for t in threading.enumerate())
        monkeypatch.setattr(threading.Thread, "start", start)
        poll.drain()
        assert poll.failed == 0
        poll.check_exactly_once()
        assert any(t.name == reader for t in threading.enumerate()), "the reader never started once it could"
    finally:
        poll.close()


def test_at_most_once_a_torn_frontier_write_deletes_no_bucket(tmp_path):
    """At-most-once: a call that read a bucket to its end deleted the bucket (key and file) before
    its journal commit, which holds the batch's frontier. When that write failed (a short write:
    the torn group is cut at the restart, so nothing of it counts) the call raised and put the rows
    back in memory, but their only file was gone, and the restart lost them although they were
    never returned. Each journal write of the drain fails in turn; the restart loses nothing. (A
    failed fsync may leave the whole group readable: that batch may count as delivered, as
    docs/durability.md says, so only writes are swept.)"""
    work = Workload(tmp_path, "journal", 2, 5, batch=5, step_ms=7, delivery="at-most-once")
    _, first, calls = _counted(work, read_ahead=False)
    writes = [k for k, (op, target) in enumerate(calls) if op == "write" and ".journal" in target]
    assert len(writes) >= 3, calls
    for k in writes:
        poll = Poll(work, work.copy(), read_ahead=False)
        try:
            rule = poll.fs.fail(errno.EIO, first_call=first + k)
            poll.drain()
            assert rule.fired and poll.last_failed  # the journal is poisoned: the embedder reopens
            poll.restart_delivers_the_rest()
        finally:
            poll.close()
