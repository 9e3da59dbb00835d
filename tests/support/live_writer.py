"""A writer process that seals, merges, delivers and trims without pause (for the readers-beside-a-writer test).

Usage: ``python live_writer.py STORE sealed|journal``. Prints ``ready`` once
buckets exist, then works until it is killed.
"""

from __future__ import annotations

import sys

import bucketstore


def main(path: str, durability: str) -> None:
    now = [1_000_000]
    config = bucketstore.TrackerConfig(min_index_count_per_bucket=20, max_indexes_per_segment=8,
                                       max_time_step_per_segment_ms=500, max_num_buckets=3, tick_time_ms=0)
    store = bucketstore.open(path, durability=durability)
    trackers = [store.tracker(name, config=config, clock=lambda: now[0]) for name in ("live-a", "live-b")]
    ledger = 1
    while True:
        for number, tracker in enumerate(trackers):
            # A new ledger per round seals the previous one; more than three buckets merge.
            tracker.add_messages([(ledger, e, now[0] + 2_000 + (e * 37 + number) % 4_000) for e in range(24)])
            tracker.get_scheduled_messages(40)  # delivering whole buckets deletes them
            if ledger % 9 == 0:
                tracker.mark_delete(ledger - 6, 0)  # trims the buckets below
            if durability == "journal":
                tracker.flush()
        ledger += 1
        now[0] += 300
        if ledger == 8:
            print("ready", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
