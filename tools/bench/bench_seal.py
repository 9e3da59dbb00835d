"""Seal rate end to end: a tracker seals one mutable bucket of N indexes (default 1 M).

The bucket is filled through ``add_messages`` in batches of 10,000 (one ledger's
entries in entry order, as a producer writes them), then one add to the next
ledger rolls it, and the time of that call is the seal (the store runs seals on the
caller's thread, ``background=False``, so that call does the whole seal): merging the bucket's
runs into one sorted set, dropping untracked rows, cutting segments, encoding
them and the bitmaps, writing and fsyncing the ledger file and committing the
catalog. Shapes: A (fixed delay), B (random delays up to 10 min), S (sparse:
1 % of entries delayed, 10,000-entry ledgers, random 10-minute delays, so a
bucket spans many ledgers; not run by default, see ``--shapes``). Prints the best and median of
``--repeat`` runs.

    PYTHONPATH=. python tools/bench/bench_seal.py [--indexes 1000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import bucketstore  # noqa: E402
from bucketstore import TrackerConfig  # noqa: E402

EPOCH = 1_700_000_000_000
TARGET = 5.0  # M idx/s


def batches(shape: str, n: int, seed: int, ledger_size: int | None = None):
    """Yield (ledgers, entries, deliver_at) batches of about 10,000 rows.

    A and B write ledgers of ``ledger_size`` entries (default: one ledger), one
    message a millisecond; S its own many small ledgers.
    """
    rng = np.random.default_rng(seed)
    if shape in "AB":
        size = ledger_size or n
        for lo in range(0, n, 10_000):
            hi = min(n, lo + 10_000, (lo // size + 1) * size)
            publish = np.arange(lo, hi, dtype=np.uint64)
            delay = 60_000 if shape == "A" else rng.integers(0, 600_000, len(publish)).astype(np.uint64)
            ledger = 1 + lo // size
            yield (np.full(len(publish), ledger, np.uint64), publish - np.uint64((ledger - 1) * size),
                   EPOCH + 1_000 + publish + delay)
        return
    # S: ledger L holds entries 0..9,999 published 1/ms; 1 % of them are delayed.
    per_ledger, done, ledger = 10_000, 0, 1
    while done < n:
        ents = np.flatnonzero(rng.random(per_ledger) < 0.01).astype(np.uint64)[:n - done]
        publish = EPOCH + 1_000 + (ledger - 1) * per_ledger + ents
        yield np.full(len(ents), ledger, np.uint64), ents, publish + rng.integers(0, 600_000, len(ents)).astype(np.uint64)
        done += len(ents)
        ledger += 1


def seal_once(shape: str, n: int, seed: int) -> float:
    with tempfile.TemporaryDirectory() as tmp, bucketstore.open(tmp, durability="sealed", background=False) as store:
        t = store.tracker("t", TrackerConfig(min_index_count_per_bucket=n, max_num_buckets=100), lambda: EPOCH)
        last = 0
        total = 0
        for ledgers, ents, at in batches(shape, n, seed):
            # A roll seals once the bucket holds n; keep every ledger but the last below that.
            t.add_messages((ledgers, ents, at))
            last = int(ledgers[-1])
            total += len(ents)
        assert not t.buckets(), "sealed before the timed call"
        start = time.perf_counter()
        t.add_messages([(last + 1, 0, EPOCH + 10**9)])  # one row: the roll that seals
        elapsed = time.perf_counter() - start
        assert len(t.buckets()) == 1, "the timed call did not seal"
        return total / elapsed / 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--indexes", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=5)
    # S is left out by default: filling a bucket of 10,000 small ledgers through a tracker is
    # itself slow until ledger rolls are O(1) (issue 13 item 7); its seal is measured with --shapes S.
    p.add_argument("--shapes", default="AB")
    args = p.parse_args()
    print(f"$ PYTHONPATH=. python tools/bench/bench_seal.py --indexes {args.indexes} --repeat {args.repeat} "
          f"--shapes {args.shapes}")
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} cpu(s)")
    for shape in args.shapes:
        rates = [seal_once(shape, args.indexes, seed) for seed in range(args.repeat)]
        best, median = max(rates), statistics.median(rates)
        print(f"shape {shape}: seal of {args.indexes:,} indexes  best {best:5.2f}  median {median:5.2f} M idx/s  "
              f"(target >= {TARGET})  {'ok' if median >= TARGET else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
