"""Maintenance benchmarks: ledger rolls, and seals/merges off the caller's path.

Cases (each prints its figures; see README "Performance"):

* ``ledgers``: 100,000 one-message ledgers, in one ``add_messages`` call and
  with single ``add_message`` calls (every ledger rolls the mutable bucket; the
  seal gate must cost O(1) per roll, not a scan of the pending rows).
* ``stalls``: one writer adds ``--total`` indexes in batches of 10,000 over
  ledgers of ``--per-bucket`` indexes (each roll seals one bucket of that size;
  ``max_num_buckets=4`` makes merges) while a second thread adds one index per
  millisecond and times each call. Run twice in the same process, synchronous
  (``background=False``) and background, side by side: the other thread's
  p50/p99/max latency, the writer's rate at the caller (seals included), and the
  time until everything is sealed (``flush``).

Run:  python tools/bench/bench_maintenance.py [--ledgers N] [--repeats R] [--per-bucket N] [--total N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import bucketstore  # noqa: E402
from bucketstore import TrackerConfig  # noqa: E402

EPOCH = 1_700_000_000_000


def bench_small_ledgers(n: int, tmp: str, repeats: int) -> dict[str, float]:
    """Seconds to add ``n`` one-message ledgers (best of ``repeats``), batch and single calls."""
    ledgers = np.arange(1, n + 1, dtype=np.uint64)
    entries = np.zeros(n, dtype=np.uint64)
    at = EPOCH + 60_000 + ledgers
    out: dict[str, float] = {}
    for mode in ("batch", "single"):
        best = float("inf")
        for r in range(repeats):
            path = os.path.join(tmp, f"ledgers-{mode}-{r}")
            with bucketstore.open(path) as store:
                tracker = store.tracker("t", TrackerConfig(), clock=lambda: EPOCH)
                started = time.perf_counter()
                if mode == "batch":
                    tracker.add_messages((ledgers, entries, at))
                else:
                    add = tracker.add_message
                    for ledger, t in zip(ledgers.tolist(), at.tolist()):
                        add(ledger, 0, t)
                best = min(best, time.perf_counter() - started)
                assert tracker.number_of_delayed_messages == n
            shutil.rmtree(path)
        out[f"{mode}_seconds"] = round(best, 3)
    return out


def bench_stalls(tmp: str, per_bucket: int, total: int, background: bool) -> dict[str, float]:
    cfg = TrackerConfig(min_index_count_per_bucket=per_bucket, max_num_buckets=4,
                        max_indexes_per_segment=per_bucket // 4)
    path = os.path.join(tmp, f"stalls-{background}")
    clock = lambda: EPOCH  # noqa: E731 - nothing falls due during the run
    rng = np.random.default_rng(7)
    latencies: list[float] = []
    stop = threading.Event()
    current = [1]  # the writer's ledger: the other thread adds to it too (entry ids past the writer's)
    with bucketstore.open(path, background=background) as store:
        tracker = store.tracker("t", cfg, clock=clock)

        def other() -> None:
            entry = 0
            while not stop.is_set():
                started = time.perf_counter()
                tracker.add_message(current[0], per_bucket + entry, EPOCH + 3_600_000 + entry)
                latencies.append(time.perf_counter() - started)
                entry += 1
                time.sleep(0.001)

        thread = threading.Thread(target=other)
        thread.start()
        batch = 10_000
        started = time.perf_counter()
        for lo in range(0, total, batch):
            seq = np.arange(lo, lo + batch, dtype=np.uint64)
            ledgers = 1 + seq // np.uint64(per_bucket)
            current[0] = int(ledgers[-1])
            at = EPOCH + 60_000 + rng.integers(0, 3_600_000, batch).astype(np.uint64)
            tracker.add_messages((ledgers, seq % np.uint64(per_bucket), at))
        caller = time.perf_counter() - started
        tracker.flush()
        while tracker.stats()["maintenance"]["queued"]:  # merges that the last seals started
            tracker.flush()
        sealed = time.perf_counter() - started
        stop.set()
        thread.join()
        stats = tracker.stats()
    shutil.rmtree(path)
    lat = np.array(latencies) * 1000
    return {"background": background, "other_p50_ms": round(float(np.percentile(lat, 50)), 3),
            "other_p99_ms": round(float(np.percentile(lat, 99)), 3), "other_max_ms": round(float(lat.max()), 3),
            "other_calls": len(lat), "caller_M_per_s": round(total / caller / 1e6, 3),
            "all_sealed_M_per_s": round(total / sealed / 1e6, 3), "seals": stats["create"]["succeeded"],
            "merges": stats["merge"]["succeeded"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ledgers", type=float, default=1e5, help="one-message ledgers (default 1e5)")
    p.add_argument("--repeats", type=int, default=3, help="repeats per case; the best is reported")
    p.add_argument("--per-bucket", type=float, default=1e6, help="indexes per sealed bucket (default 1e6)")
    p.add_argument("--total", type=float, default=6e6, help="indexes the writer adds (default 6e6)")
    p.add_argument("--cases", default="ledgers,stalls", help="comma-separated cases to run")
    args = p.parse_args()
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    tmp = tempfile.mkdtemp(prefix="bench-maint-")
    try:
        cases = args.cases.split(",")
        if "ledgers" in cases:
            n = int(args.ledgers)
            print(f"small ledgers ({n:,} one-message ledgers, 50,000-index seals):",
                  bench_small_ledgers(n, tmp, args.repeats))
        if "stalls" in cases:
            for background in (False, True):
                print(f"stalls ({int(args.total):,} indexes, {int(args.per_bucket):,}-index seals, merges):",
                      bench_stalls(tmp, int(args.per_bucket), int(args.total), background))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
