"""Small test helpers shared by several test modules."""

from __future__ import annotations

import os

import lmdb

from bucketstore import TrackerConfig
from bucketstore.testing.clock import FakeClock

__all__ = ["SMALL", "FakeClock", "example_count", "fill_and_seal", "as_format1_catalog", "prefix_positions"]

#: Small buckets and segments: a few adds seal a bucket of several segments.
SMALL = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=4)


def prefix_positions(tracker) -> set[tuple[int, int]]:
    """The positions the catalog summaries' prefixes of the tracker's unopened buckets hold. None
    with the shipped 32-row prefix and these tests' short segments; under
    BUCKETSTORE_TEST_PREFIX_ROWS=1 every bucket's first row: a batch, or a membership test, that
    needs only those is answered from the catalog, so damage in the file shows only after them."""
    return {(int(ledger), int(entry)) for b in tracker.buckets() if b.head is not None
            for ledger, entry in zip(*b.head.prefix()[1:])}


def example_count(default: int) -> int:
    """Hypothesis example budget; BUCKETSTORE_EXAMPLES scales it for long runs."""
    return int(os.environ.get("BUCKETSTORE_EXAMPLES", default))


def fill_and_seal(tracker, ledgers: int = 3, per_ledger: int = 12, base: int = 1000) -> None:
    """Add ``per_ledger`` indexes to each of ``ledgers`` ledgers, roll to seal them, and wait
    until the seals (on the store's worker) are installed."""
    for ledger in range(ledgers):
        for entry in range(per_ledger):
            tracker.add_message(ledger, entry, base + 10 * entry + ledger)
    tracker.add_message(ledgers, 0, base + 5000)  # roll: seal the last full ledger range
    tracker.wait_for_maintenance()


def as_format1_catalog(store_path) -> None:
    """Make a closed store's catalog what the previous release wrote: format ``b"1"``, no
    bucket summaries (recovery then reads entry 0 of those buckets and backfills them)."""
    env = lmdb.open(os.path.join(os.fspath(store_path), "catalog"), max_dbs=4, subdir=True)
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(b"summaries", txn=txn), delete=True)
            txn.put(b"format", b"1", db=env.open_db(b"meta", txn=txn))
    finally:
        env.close()


#: The actions of a generated topic program that one subscription carries out.
SUBSCRIPTION_ACTIONS = ("deliver", "confirm", "readd", "mark", "clear")


def act_on_subscription(sub, clock, action: tuple) -> None:
    """Carry out one of :data:`SUBSCRIPTION_ACTIONS` on ``sub`` (``action[1]`` chose it). A
    ``readd`` delivers the position at once, then adds it again ``action[3]`` ms ahead: the
    exception a frontier cannot express."""
    kind = action[0]
    if kind == "deliver":
        sub.get_scheduled_messages(action[2])
    elif kind == "confirm":
        sub.confirm_delivered()
    elif kind == "readd":
        sub.add_message(*action[2], clock() + 1)
        clock.advance(1)
        sub.get_scheduled_messages(100)
        sub.add_message(*action[2], clock() + action[3])
    elif kind == "mark":
        sub.mark_delete(*action[2])
    elif kind == "clear":
        sub.clear()
    else:
        raise ValueError(f"not a subscription's action: {kind!r}")
