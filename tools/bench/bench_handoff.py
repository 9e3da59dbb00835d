"""What the at-least-once delivery handoff costs: journal-mode delivery, at-least-once against at-most-once.

Each run fills a fresh journal-mode store with ``--messages`` indexes over rolling
ledgers (so buckets seal and deliveries read segments and delete exhausted buckets),
then drains it with ``get_scheduled_messages(--batch)`` calls, the clock stepping so
each call finds a full batch due. Both modes make one journal commit (write + fsync)
per call with ``sync_interval_ms=0``: at-most-once to record the new frontier before
returning, at-least-once to confirm the previous batch. At-least-once also keeps the
returned rows (with their times) until their confirmation is durable, and journals
the rows of a bucket read to its end before deleting it. The figures are deliveries
per second for the drain alone, best of ``--repeat`` runs per mode, modes interleaved.

    python tools/bench/bench_handoff.py --messages 200000 --batch 1000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import bucketstore  # noqa: E402
from bucketstore import TrackerConfig  # noqa: E402

PER_LEDGER = 10_000


def one_run(messages: int, batch: int, delivery: str) -> tuple[float, int, dict]:
    """Fill, then drain; return (seconds draining, positions delivered, the tracker's stats)."""
    root = tempfile.mkdtemp(prefix="bench-handoff-")
    now = [1_000]
    try:
        with bucketstore.open(os.path.join(root, "s"), durability="journal", delivery=delivery) as store:
            cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=PER_LEDGER // 2)
            t = store.tracker("sub", cfg, lambda: now[0])
            rng = np.random.default_rng(195)
            for first in range(0, messages, PER_LEDGER):
                n = min(PER_LEDGER, messages - first)
                ledger = first // PER_LEDGER
                t.add_messages((np.full(n, ledger, dtype=np.uint64), np.arange(n, dtype=np.uint64),
                                2_000 + rng.integers(0, messages, n).astype(np.uint64)))
            delivered = 0
            started = time.perf_counter()
            while delivered < messages:
                now[0] += batch  # about one batch falls due per step
                delivered += len(t.get_scheduled_messages(batch))
            t.flush()
            seconds = time.perf_counter() - started
            return seconds, delivered, t.stats()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=1_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for mode in ("at-most-once", "at-least-once"):
            seconds, delivered, stats = one_run(args.messages, args.batch, mode)
            assert delivered == args.messages
            rate = delivered / seconds
            best[mode] = max(best.get(mode, 0.0), rate)
            print(f"{mode:14s} {delivered:,} delivered in {seconds:.2f} s: {rate / 1e3:,.0f} k/s "
                  f"(buckets created {stats['create']['succeeded']}, deleted {stats['delete']['succeeded']})")
    ratio = best["at-least-once"] / best["at-most-once"]
    print(f"best: at-most-once {best['at-most-once'] / 1e3:,.0f} k/s, at-least-once "
          f"{best['at-least-once'] / 1e3:,.0f} k/s (ratio {ratio:.2f})")
    print("command: python tools/bench/bench_handoff.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
