"""A seal written beside another, whose rows are all delivered before it installs, crashed at every call.

Two seals in flight (the second one's file written first, as the store's second maintenance
thread may): every row of both is delivered in one batch, not confirmed yet, so the first
seal's install finds its bucket consumed (it journals the unconfirmed rows, deletes the
bucket, checkpoints the journal) while the second seal is still in flight and consumed too;
then the batch is confirmed. Crashed before every numbered call (the embedder's kit,
``crash_each_point``, with ``SteppedWorker.work(1)``): every acknowledged add comes back
unless its delivery was confirmed durably, and none whose confirmation returned.
"""

from __future__ import annotations

from pathlib import Path

from bucketstore import TrackerConfig
from bucketstore.engine.store.store import Store
from bucketstore.testing import FakeClock, crash_each_point

CONFIG = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=4, max_indexes_per_segment=3)
#: Every position the workload adds (an add in flight at the crash may survive or not).
UNIVERSE = {(ledger, e) for ledger in (1, 2, 3) for e in range(5)} | {(4, 0)}


def _workload(store: Store, log: list) -> None:
    clock = FakeClock(1_000)
    tracker = store.tracker("orders", CONFIG, clock)
    worker = store.maintenance
    for ledger in (1, 2, 3):  # ledgers 2 and 3 each freeze the one before: two seals pending
        rows = [(ledger, e, (2_000 if ledger < 3 else 5_000) + 10 * ledger + e) for e in range(5)]
        tracker.add_messages(rows)
        log.extend(("added", (ledger, e)) for ledger, e, _ in rows)
    worker.work(1)  # [2, 2]'s file first
    clock.advance(1_100)  # every row of ledgers 1 and 2 is due
    batch = tracker.get_scheduled_messages(100)
    assert len(batch) == 10
    log.extend(("delivered", p) for p in batch)
    worker.work()
    worker.install()  # [1, 1]: consumed, deleted; the journal checkpointed with [2, 2] in flight
    worker.install()  # [2, 2]: consumed too
    assert not tracker.buckets() and not worker.pending
    log.append(("confirming", None))
    tracker.confirm_delivered()
    log.append(("confirmed", None))
    tracker.add_message(4, 0, 9_000)
    log.append(("added", (4, 0)))


def test_a_seal_consumed_beside_another_loses_nothing_and_confirmed_never_comes_back(tmp_path: Path) -> None:
    states = 0
    for state in crash_each_point(_workload, tmp_path, durability="journal", background=True):
        tracker = state.store.tracker("orders", CONFIG, FakeClock(1_000))
        log = state.acknowledged
        added = {p for what, p in log if what == "added"}
        delivered = {p for what, p in log if what == "delivered"}
        confirmed = ("confirmed", None) in log
        settling = ("confirming", None) in log and not confirmed  # died inside confirm_delivered
        tracked = {p for p in UNIVERSE if tracker.contains_message(*p)}
        assert added - delivered <= tracked, f"{state}: lost {sorted(added - delivered - tracked)}"
        if confirmed:
            assert not delivered & tracked, f"{state}: confirmed deliveries came back: {sorted(delivered & tracked)}"
        elif not settling:
            assert delivered <= tracked, f"{state}: unconfirmed deliveries lost: {sorted(delivered - tracked)}"
        assert tracker.number_of_delayed_messages == len(tracked), f"{state}: a phantom"
        tracker._check()
        states += 1
    assert states > 40, states  # the seals' writes, installs, deletes and checkpoints were crashed
