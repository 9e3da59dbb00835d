"""What a test's invariant check and a count read see while a background install runs.

Background seals and merges install under the tracker's lock, on the worker's thread; the
check the differential tests call after every step (``_check``) and the public count
(``number_of_delayed_messages``) run on the caller's. Each interleaving is forced here:
a :class:`~bucketstore.testing.SteppedWorker` runs the install on a second thread, paused at
the exact step by a hook, while the first thread asks.
"""

from __future__ import annotations

import dataclasses
import threading

from bucketstore import TrackerConfig
from bucketstore.engine.buckets import index_pager
from bucketstore.engine.queue import index_set
from bucketstore.engine.buckets.sealed_membership import SpilledMembership
from bucketstore.engine.store.store import Store
from bucketstore.testing.stepped_worker import SteppedWorker

from helpers import FakeClock

CONFIG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=3)
#: Buckets of several ledgers (ledger 2 does not roll ledger 1 alone).
CONFIG_WIDE = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=12, max_indexes_per_segment=3)
#: How long the second thread is given to get in while the first is paused: it cannot (the
#: lock is held), so the test waits this long once when the code is right.
GRACE = 0.5


def _run(target, errors: list[BaseException]) -> threading.Thread:
    def body():
        try:
            target()
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def test_the_check_holds_the_lock_while_an_install_settles(tmp_path, monkeypatch):
    """The merging workload's KeyError: ``_check`` settled the index's pending removals
    without the lock while a background install (its journal checkpoint) settled the same
    ones; the install deleted the emptied bitmap of ledger 1 and the check, resuming with its
    copy of the removals, looked it up again."""
    worker = SteppedWorker()
    clock = FakeClock(0)
    with Store(tmp_path / "s", "journal", background=True, maintenance=worker) as store:
        t = store.tracker("t", CONFIG, clock)
        for entry in range(4):
            assert t.add_message(1, entry, 10)
        assert t.add_message(2, 0, 10_000)  # rolls ledger 1: its seal is queued, not run
        assert worker.pending_kinds() == ["create"]
        clock.now = 10
        assert t.get_scheduled_messages(10) == [(1, e) for e in range(4)]
        assert t._index._pending_n == 4  # delivered; the bits leave ledger 1's bitmap at the next settle

        checking = threading.get_ident
        paused, resume = threading.Event(), threading.Event()
        sort = index_set.sort_positions

        def pausing_sort(ledgers, entries):
            if threading.get_ident() == checker_id[0] and not paused.is_set():
                paused.set()  # the check has copied the pending removals ...
                resume.wait(5)  # ... and waits here for the install to come in
            return sort(ledgers, entries)

        monkeypatch.setattr(index_set, "sort_positions", pausing_sort)
        errors: list[BaseException] = []
        checker_id = [0]

        def check():
            checker_id[0] = checking()
            t._check()

        checker = _run(check, errors)
        assert paused.wait(5)
        installer = _run(worker.install, errors)  # the seal's install checkpoints: it settles
        installer.join(GRACE)
        resume.set()
        checker.join(5)
        installer.join(5)
        assert not checker.is_alive() and not installer.is_alive()
        assert errors == []
        assert worker.pending == 0 and t.number_of_delayed_messages == 1
        t._check()


def test_the_count_is_exact_while_an_install_pages_a_bucket_out(tmp_path, monkeypatch):
    """A background install that pages a bucket out moves its positions from the index to the
    spill: the count read meanwhile must still hold them (it read the index's part after the
    bitmaps left and the spill's before they arrived)."""
    monkeypatch.setattr(index_pager, "GROWTH", 0)  # with a budget of 0: sweep at every install
    worker = SteppedWorker()
    with Store(tmp_path / "s", "sealed", background=True, maintenance=worker) as store:
        t = store.tracker("t", dataclasses.replace(CONFIG_WIDE, max_resident_ledgers=0), FakeClock(0))
        for ledger in (1, 2):
            for entry in range(6):
                assert t.add_message(ledger, entry, 5_000 + entry)
        assert t.add_message(3, 0, 9_000)  # rolls: ledgers 1..2 are sealed by the worker
        assert worker.pending_kinds() == ["create"]
        held = t.number_of_delayed_messages
        assert held == 13

        paging, resume = threading.Event(), threading.Event()
        add = SpilledMembership.add

        def pausing_add(self, bucket_id, start, positions, pinned=False):
            if pinned and not paging.is_set():
                paging.set()  # the bitmaps have left the index; the spill is being written
                resume.wait(5)
            return add(self, bucket_id, start, positions, pinned)

        monkeypatch.setattr(SpilledMembership, "add", pausing_add)
        errors: list[BaseException] = []
        installer = _run(worker.install, errors)
        assert paging.wait(5)
        seen: list[int] = []
        reader = _run(lambda: seen.append(t.number_of_delayed_messages), errors)
        reader.join(GRACE)
        resume.set()
        installer.join(5)
        reader.join(5)
        assert errors == []
        assert seen == [held]
        assert t.stats()["membership"]["paged_buckets"] == 1
        t._check()
