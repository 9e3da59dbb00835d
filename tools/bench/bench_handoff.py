"""What the at-least-once delivery handoff costs: journal-mode delivery, at-least-once against at-most-once.

Each run fills a fresh journal-mode store with ``--messages`` indexes over rolling
ledgers (so buckets seal and deliveries read segments and delete exhausted buckets),
then drains it with ``get_scheduled_messages(--batch)`` calls, the clock stepping so
each call finds a full batch due. At-most-once makes one journal commit (write + fsync)
per call with ``sync_interval_ms=0``, to record the new frontier before returning;
at-least-once with ``confirm_sync_ms=0`` makes one too, to confirm the previous batch;
at-least-once with the default ``confirm_sync_ms`` (grouped confirmations) commits its
confirmations once per window (or with a bucket read to its end). The fsyncs made during
the drain are counted. At-least-once also keeps the
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

from bucketstore import TrackerConfig  # noqa: E402
from bucketstore.engine.store.store import Store  # noqa: E402
from bucketstore.format.fs import FileSystem  # noqa: E402

PER_LEDGER = 10_000


class CountingFs(FileSystem):
    """The real file layer, counting fsyncs."""

    fsyncs = 0

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        super().fsync(fd)


#: (label, delivery, confirm_sync_ms): None is the store's default.
MODES = (("at-most-once", "at-most-once", None), ("at-least-once, confirm_sync_ms=0", "at-least-once", 0),
         ("at-least-once (grouped)", "at-least-once", None))


def one_run(messages: int, batch: int, delivery: str, confirm_sync_ms: int | None
            ) -> tuple[float, int, dict, int]:
    """Fill, then drain; return (seconds draining, positions delivered, the tracker's stats, fsyncs draining)."""
    root = tempfile.mkdtemp(prefix="bench-handoff-")
    now = [1_000]
    fs = CountingFs()
    window = {} if confirm_sync_ms is None else {"confirm_sync_ms": confirm_sync_ms}
    try:
        with Store(os.path.join(root, "s"), durability="journal", delivery=delivery, fs=fs, **window) as store:
            cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=PER_LEDGER // 2)
            t = store.tracker("sub", cfg, lambda: now[0])
            rng = np.random.default_rng(195)
            for first in range(0, messages, PER_LEDGER):
                n = min(PER_LEDGER, messages - first)
                ledger = first // PER_LEDGER
                t.add_messages((np.full(n, ledger, dtype=np.uint64), np.arange(n, dtype=np.uint64),
                                2_000 + rng.integers(0, messages, n).astype(np.uint64)))
            delivered = 0
            t.flush()
            fsyncs = fs.fsyncs
            started = time.perf_counter()
            while delivered < messages:
                now[0] += batch  # about one batch falls due per step
                delivered += len(t.get_scheduled_messages(batch))
            t.flush()
            seconds = time.perf_counter() - started
            return seconds, delivered, t.stats(), fs.fsyncs - fsyncs
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=1_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    best: dict[str, float] = {}
    syncs: dict[str, int] = {}
    for _ in range(args.repeat):
        for label, delivery, window in MODES:
            seconds, delivered, stats, fsyncs = one_run(args.messages, args.batch, delivery, window)
            assert delivered == args.messages
            rate = delivered / seconds
            best[label] = max(best.get(label, 0.0), rate)
            syncs[label] = fsyncs
            print(f"{label:34s} {delivered:,} delivered in {seconds:.2f} s: {rate / 1e3:,.0f} k/s, {fsyncs} fsyncs "
                  f"(buckets created {stats['create']['succeeded']}, deleted {stats['delete']['succeeded']})")
    calls = -(-args.messages // args.batch)
    print("best: " + ", ".join(f"{label} {rate / 1e3:,.0f} k/s ({syncs[label]} fsyncs in about {calls} calls)"
                                for label, rate in best.items()))
    print("command: python tools/bench/bench_handoff.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
