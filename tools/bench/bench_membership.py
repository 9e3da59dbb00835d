"""What a sparse bucket's membership costs to read, per snapshot version: bytes on disk, and the
CPU time from opening the file to holding its ledgers' entry ids.

One bucket of ``--indexes`` indexes, 1 % of the entries of 10,000-entry ledgers delayed by
U[0, 10 min) (bench_sparse's shape), cut every 5 minutes or 5,000 indexes, written in each
version asked (``--versions 4,5,6``). Per version: the file, entry 0 and the segments in bytes an
index; then, alternating the versions ``--repeat`` times, the CPU time (this thread's) of

* *ids*: ``BucketFile`` opened and closed, then every listed ledger's ids as one column
  (``entry_columns``: what ``contains_message`` on an unopened bucket spills), and
* *bitmaps*: the same, then every ledger's roaring bitmap (what opening the bucket for delivery
  puts in the index).

Version 4 decodes entry 0's gaps; version 5 reads every segment and gathers their rows
(``formats/bucket_snapshot.md``, "Why counts only"); version 6 likewise, its segments of several
ledgers grouped by ledger where that is smaller (sorted back into row order when read).

    PYTHONPATH=. python tools/bench/bench_membership.py [--indexes 500000] [--versions 4,5,6] [--repeat 15]
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

from bucketstore.format.bucket_bitmaps import entry_columns  # noqa: E402
from bucketstore.format.snapshot import BucketFile, build_bucket, sort_indexes, write_bucket  # noqa: E402

LEDGER_ENTRIES = 10_000


def sparse_rows(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    picks = np.flatnonzero(rng.random(int(n / 0.01 * 1.2) + LEDGER_ENTRIES) < 0.01)[:n].astype(np.uint64)
    delay = rng.integers(0, 600_000, len(picks)).astype(np.uint64)
    return sort_indexes(picks + delay, np.uint64(1) + picks // np.uint64(LEDGER_ENTRIES),
                        picks % np.uint64(LEDGER_ENTRIES))


def read_ids(path: str) -> None:
    with BucketFile(path) as bf:
        meta = bf.metadata
    if entry_columns(meta.bitmaps) is None:
        raise SystemExit(f"{path}: the ledgers are not all listed (not a sparse bucket)")


def read_bitmaps(path: str) -> None:
    with BucketFile(path) as bf:
        meta = bf.metadata
    dict(meta.bitmaps.items())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--indexes", type=int, default=500_000)
    p.add_argument("--versions", default="4,5,6", help="comma-separated snapshot versions (4 and up list ledgers)")
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args()
    versions = [int(v) for v in args.versions.split(",")]
    print(f"$ PYTHONPATH=. python tools/bench/bench_membership.py --indexes {args.indexes} "
          f"--versions {args.versions} --repeat {args.repeat}")
    ts, ledgers, entries = sparse_rows(args.indexes)
    n = len(ts)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BUCKETSTORE_BENCH_DIR")) as tmp:
        paths = {}
        for v in versions:
            meta, payloads = build_bucket(int(ledgers.min()), int(ledgers.max()), ts, ledgers, entries,
                                          time_step_ms=300_000, max_indexes_per_segment=5_000, version=v)
            paths[v] = write_bucket(os.path.join(tmp), 100 + v, meta, payloads)
            with BucketFile(paths[v]) as bf:
                entry0 = bf.metadata_size
                segments = sum(bf.ledger.entry_size(k) for k in range(1, bf.segment_count + 1))
            print(f"v{v}: file {os.path.getsize(paths[v]) / n:.3f} B/index, entry 0 {entry0 / n:.3f}, "
                  f"segments {segments / n:.3f} ({n:,} indexes, {len(payloads)} segments)")
        times: dict[tuple[int, str], list[float]] = {(v, what): [] for v in versions for what in ("ids", "bitmaps")}
        for _ in range(args.repeat):  # alternating: a shared machine's load hits every version alike
            for v in versions:
                for what, read in (("ids", read_ids), ("bitmaps", read_bitmaps)):
                    started = time.thread_time()
                    read(paths[v])
                    times[(v, what)].append(time.thread_time() - started)
    for what in ("ids", "bitmaps"):
        print(f"{what:>7}: " + ", ".join(f"v{v} {statistics.median(times[(v, what)]) * 1e3:.2f} ms"
                                         for v in versions)
              + f"  (CPU time, median of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
