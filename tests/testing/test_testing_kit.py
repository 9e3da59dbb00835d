"""The public crash-testing kit, ``bucketstore.testing``, as an embedder uses it.

* its doctests run;
* :func:`crash_each_point` visits every numbered call of a workload, under every damage
  mode that leaves a distinct disk, and hands back reopened stores;
* it catches a real loss: a workload that acknowledges sealed-mode adds before they are
  sealed (a promise the engine does not make) fails the embedder's check at some crash point;
* a workload that is not deterministic is refused.
"""

from __future__ import annotations

import doctest
import errno
import itertools
import types
from pathlib import Path

import pytest

import bucketstore
import bucketstore.checking
import bucketstore.testing
from bucketstore.engine.store.store import Store
from bucketstore.testing import DAMAGES, FakeClock, FaultyFileSystem, crash_each_point
from bucketstore.testing import clock as clock_module
from bucketstore.testing import crash_points, oracle

CONFIG = bucketstore.TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=4, max_indexes_per_segment=3)


@pytest.mark.parametrize("module", [clock_module, crash_points, oracle], ids=lambda m: m.__name__)
def test_doctests(module: object) -> None:
    failed, tried = doctest.testmod(module)  # type: ignore[arg-type]
    assert tried and not failed


def test_every_public_name_is_documented() -> None:
    for name in bucketstore.testing.__all__:
        obj = getattr(bucketstore.testing, name)
        if callable(obj) and not isinstance(obj, type(DAMAGES[0])):
            assert (obj.__doc__ or "").strip(), f"bucketstore.testing.{name} has no docstring"


@pytest.mark.parametrize("package", [bucketstore.testing, bucketstore.checking],
                         ids=lambda m: m.__name__)
def test_all_lists_exactly_the_public_names(package: types.ModuleType) -> None:
    """``from bucketstore.testing import *`` and the docs see what the package offers, no less, no more."""
    public = {name for name, value in vars(package).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType) and name != "annotations"}
    assert sorted(public) == sorted(package.__all__)


def _journal_workload(store: bucketstore.Store, acknowledged: list) -> None:
    clock = FakeClock(1_000)
    tracker = store.tracker("orders", CONFIG, clock)
    for ledger in (1, 2, 3):  # each new ledger seals the previous one's bucket
        for entry in range(3):
            tracker.add_message(ledger, entry, 2_000 + 100 * ledger + entry)
            acknowledged.append((ledger, entry))
    clock.advance(1_150)
    delivered = tracker.get_scheduled_messages(2)
    for position in delivered:  # handed to the consumer: no longer ours to keep
        acknowledged.remove(position)


def test_journal_workload_loses_nothing_at_any_crash_point(tmp_path: Path) -> None:
    points: set[int] = set()
    damages: set[str] = set()
    calls = 0
    for state in crash_each_point(_journal_workload, tmp_path, durability="journal"):
        calls = state.calls
        points.add(state.point)
        damages.add(state.damage.name)
        tracker = state.store.tracker("orders", CONFIG, FakeClock(1_000))
        tracker._check()
        lost = [p for p in state.acknowledged if not tracker.contains_message(*p)]
        # A crash inside get_scheduled_messages may have made the delivery durable
        # before the call returned: only those two positions may be missing then.
        if state.acknowledged and lost and state.point < calls:
            assert set(lost) <= {(1, 0), (1, 1)} and len(state.acknowledged) == 9, f"{state}: lost {lost}"
        else:
            assert not lost, f"{state}: lost {lost}"
    assert calls > 20 and points == set(range(calls + 1)), (calls, sorted(points))
    assert {"all-survives", "only-synced", "torn-tails"} <= damages, damages


def _background_journal_workload(store: bucketstore.Store, acknowledged: list) -> None:
    """The journal workload with its seals as background jobs, run when it says so."""
    clock = FakeClock(1_000)
    tracker = store.tracker("orders", CONFIG, clock)
    for ledger in (1, 2, 3):
        for entry in range(3):
            tracker.add_message(ledger, entry, 2_000 + 100 * ledger + entry)
            acknowledged.append((ledger, entry))
        store.maintenance.work()  # the oldest pending seal writes its file, not installed yet
    clock.advance(1_150)
    delivered = tracker.get_scheduled_messages(2)
    for position in delivered:
        acknowledged.remove(position)
    store.maintenance.run_all()  # the installs (catalog commits, checkpoints) come last


def test_crash_each_point_steps_background_jobs_deterministically(tmp_path: Path) -> None:
    kinds = set()
    calls = 0
    for state in crash_each_point(_background_journal_workload, tmp_path, durability="journal", background=True,
                                  damages=DAMAGES[:2]):
        calls = state.calls
        if state.call is not None:
            kinds.add(state.call[0])
        tracker = state.store.tracker("orders", CONFIG, FakeClock(1_000))
        lost = [p for p in state.acknowledged if not tracker.contains_message(*p)]
        if state.acknowledged and lost and state.point < calls:
            assert set(lost) <= {(1, 0), (1, 1)} and len(state.acknowledged) == 9, f"{state}: lost {lost}"
        else:
            assert not lost, f"{state}: lost {lost}"
    assert "catalog_commit" in kinds and "rename" in kinds, kinds  # the seals ran, and were crashed


def test_the_stepped_worker_holds_two_jobs_in_flight_and_installs_in_submission_order(tmp_path: Path) -> None:
    """``work(1)`` runs the second pending job's work first, as the real worker's second thread
    may; installs keep submission order, and a job that worked ahead does not work again."""
    worker = bucketstore.testing.SteppedWorker()
    with Store(tmp_path, "sealed", background=True, maintenance=worker, max_pending_maintenance=4) as store:
        tracker = store.tracker("orders", CONFIG, FakeClock(1_000))
        for ledger in (1, 2, 3):  # ledgers 2 and 3 each freeze the one before: two seals pending
            tracker.add_messages([(ledger, e, 5_000 + e) for e in range(5)])
        assert worker.pending_kinds() == ["create", "create"]
        with pytest.raises(ValueError):
            worker.work(2)  # only two threads: the third job waits for a thread
        assert worker.work(1) and not worker.work(1)  # [2, 2] writes; not twice
        assert worker.worked(1) and not worker.head_worked
        assert worker.side_by_side == [("create", "create")]
        assert len(list(Path(store.ledgers_dir).glob("*.ledger"))) == 1  # [2, 2]'s file only
        assert worker.install()  # [1, 1]: its work, then its install
        assert [(b.start_ledger, b.end_ledger) for b in tracker.buckets()] == [(1, 1)]
        assert worker.head_worked  # [2, 2] worked ahead
        assert worker.install()
        first, second = tracker.buckets()
        assert second.ledger_id < first.ledger_id  # [2, 2] took its ledger id first
        assert worker.history == [("create", "work"), ("create", "work"), ("create", "install"),
                                  ("create", "install")]
        assert [(b.start_ledger, b.end_ledger) for b in tracker.buckets()] == [(1, 1), (2, 2)]
    one = bucketstore.testing.SteppedWorker(threads=1)
    with Store(tmp_path / "one", "sealed", background=True, maintenance=one) as store:
        tracker = store.tracker("orders", CONFIG, FakeClock(1_000))
        for ledger in (1, 2, 3):
            tracker.add_messages([(ledger, e, 5_000 + e) for e in range(5)])
        with pytest.raises(ValueError):
            one.work(1)


def _overpromising_workload(store: bucketstore.Store, acknowledged: list) -> None:
    """Sealed mode makes an index durable when its bucket seals; this workload acknowledges
    every add at once, so a crash before the next seal must show up as a loss."""
    tracker = store.tracker("orders", CONFIG, FakeClock(1_000))
    for ledger, entry in itertools.product((1, 2), range(4)):
        tracker.add_message(ledger, entry, 5_000 + entry)
        acknowledged.append((ledger, entry))


def test_the_enumeration_finds_a_broken_promise(tmp_path: Path) -> None:
    lost_in = []
    for state in crash_each_point(_overpromising_workload, tmp_path, durability="sealed", damages=DAMAGES[:1]):
        tracker = state.store.tracker("orders", CONFIG, FakeClock(1_000))
        if any(not tracker.contains_message(*p) for p in state.acknowledged):
            lost_in.append(state.point)
    assert lost_in, "no crash point showed the loss of an unsealed add"


def test_a_nondeterministic_workload_is_refused(tmp_path: Path) -> None:
    runs = itertools.count()

    def workload(store: bucketstore.Store, acknowledged: list) -> None:
        tracker = store.tracker("orders", CONFIG, FakeClock(1_000))
        for ledger in range(1, 3 + next(runs) % 2):  # one more ledger every other run
            tracker.add_messages([(ledger, e, 5_000) for e in range(4)])

    with pytest.raises(AssertionError, match="not deterministic"):
        for _ in crash_each_point(workload, tmp_path, durability="sealed"):
            pass


def test_read_faults_fail_the_reads_of_ledger_files_until_healed(tmp_path: Path) -> None:
    """``fail_reads`` fails the engine's reads of ledger files (numbered apart from the durable
    calls, which crash enumeration counts), ``times=None`` until ``heal``; the store goes on."""
    with bucketstore.open(tmp_path / "s", durability="sealed", background=False) as store:
        t = store.tracker("t", CONFIG, FakeClock(0))
        t.add_messages([(1, e, 1_000 + e) for e in range(8)])
        t.add_message(2, 0, 10**9)  # rolls ledger 1: sealed
    fs = FaultyFileSystem()
    clock = FakeClock(0)
    store = Store(tmp_path / "s", durability="sealed", fs=fs, background=False, read_ahead=False)
    try:
        t = store.tracker("t", CONFIG, clock)
        clock.now = 2_000
        calls = fs.calls
        with pytest.raises(ValueError, match="unknown read operations"):
            fs.fail_reads(errno.EIO, ops=["write"])
        rule = fs.fail_reads(errno.EMFILE, ops=["open_read"], times=None)
        for _ in range(2):
            with pytest.raises(OSError) as info:
                t.get_scheduled_messages(100)
            assert info.value.errno == errno.EMFILE and "injected EMFILE at read" in str(info.value)
        assert rule.fired == 2 and fs.read_log[-1][0] == "open_read" and fs.calls == calls
        fs.heal()
        assert t.get_scheduled_messages(100) == [(1, e) for e in range(8)]
        assert fs.reads > 2 and {op for op, _ in fs.read_log} == {"open_read", "read"}
    finally:
        store.close()
