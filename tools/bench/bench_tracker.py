"""Tracker benchmarks: the bucket tracker against InMemoryTracker, in one run.

Measures, on this machine:

* add throughput, single calls and batches (``add_messages`` with numpy columns);
* delivery throughput (``get_scheduled_messages`` draining everything);
* seal time of one 50,000-index bucket, and the p99/max latency of adds made by
  another thread while seals happen;
* recovery time and resident memory of a store holding 1 M / 10 M (/ 100 M)
  indexes, each measured in a fresh process (stores are generated first, by
  the same codec, ~50,000 indexes per bucket, every message of a ledger delayed
  by U[0, 1 h)).

Run:  python tools/bench/bench_tracker.py [--messages N] [--recovery-sizes 1e6,1e7,1e8]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import bucketstore  # noqa: E402
from bucketstore import TrackerConfig  # noqa: E402
from bucketstore.format.bucket_summary import encode_summary  # noqa: E402
from bucketstore.format.snapshot import build_bucket, sort_indexes, write_bucket  # noqa: E402

EPOCH = 1_700_000_000_000
ENTRIES_PER_LEDGER = 50_000


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def workload(n: int, seed: int = 1) -> tuple[list[int], list[int], list[int]]:
    """n messages published 1 per 0.1 ms, delays U[0, 1 h), 50,000 entries per ledger."""
    rng = np.random.default_rng(seed)
    seq = np.arange(n)
    ledgers = (seq // ENTRIES_PER_LEDGER).tolist()
    entries = (seq % ENTRIES_PER_LEDGER).tolist()
    at = (EPOCH + 1000 + seq // 10 + rng.integers(0, 3_600_000, n)).tolist()
    return ledgers, entries, at


def timed(fn) -> float:
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    finally:
        gc.enable()


def bench_adds_and_delivery(n: int, tmp: str) -> dict[str, dict[str, float]]:
    ledgers, entries, at = workload(n)
    cfg = TrackerConfig()
    out: dict[str, dict[str, float]] = {}
    for kind in ("bucket", "memory"):
        clock = Clock(EPOCH)
        path = os.path.join(tmp, f"adds-{kind}")
        store = bucketstore.open(path, durability="sealed") if kind == "bucket" else None
        t = store.tracker("b", cfg, clock) if store else bucketstore.InMemoryTracker(cfg, clock)
        add = t.add_message

        def single():
            for l, e, a in zip(ledgers, entries, at):
                add(l, e, a)

        add_s = timed(single)
        seal_single_s = t.stats()["create"]["latency_ms"] / 1000 if store else 0.0
        clock.now = EPOCH + 10**9
        delivered = []

        def drain():
            while True:
                got = t.get_scheduled_messages(10_000)
                if not got:
                    break
                delivered.append(len(got))

        deliver_s = timed(drain)
        assert sum(delivered) == n, (kind, sum(delivered))
        # batches, on a fresh tracker
        if store:
            store.close()
            shutil.rmtree(path)
            store = bucketstore.open(path, durability="sealed")
        clock.now = EPOCH
        t = store.tracker("b", cfg, clock) if store else bucketstore.InMemoryTracker(cfg, clock)
        cols = (np.asarray(ledgers, np.uint64), np.asarray(entries, np.uint64), np.asarray(at, np.int64))

        def batches():
            for lo in range(0, n, 10_000):
                t.add_messages(tuple(c[lo:lo + 10_000] for c in cols))

        batch_s = timed(batches)
        seal_batch_s = t.stats()["create"]["latency_ms"] / 1000 if store else 0.0
        assert t.number_of_delayed_messages == n
        out[kind] = {"single_add_per_s": n / add_s, "batch_add_per_s": n / batch_s, "deliver_per_s": n / deliver_s,
                     "single_add_per_s_ex_seal": n / (add_s - seal_single_s),
                     "batch_add_per_s_ex_seal": n / (batch_s - seal_batch_s), "seal_s": seal_batch_s}
        if store:
            out[kind]["buckets"] = t.stats()["immutable_buckets"]
            store.close()
    return out


def bench_seal_latency(tmp: str) -> dict[str, float]:
    """One thread adds a ledger's 50,000 indexes then rolls (sealing); another adds meanwhile."""
    cfg = TrackerConfig()
    clock = Clock(EPOCH)
    store = bucketstore.open(os.path.join(tmp, "seal"), durability="sealed")
    t = store.tracker("s", cfg, clock)
    rng = np.random.default_rng(2)
    seal_times = []
    latencies: list[float] = []
    stop = threading.Event()
    current = [0]

    def other_adds():
        # A second producer on the same topic: entries of the ledger being written.
        i = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            t.add_message(current[0], ENTRIES_PER_LEDGER + i, EPOCH + 10**8 + i)
            latencies.append(time.perf_counter() - t0)
            i += 1
            time.sleep(0.0002)

    th = threading.Thread(target=other_adds)
    th.start()
    try:
        for ledger in range(6):
            current[0] = ledger
            at = (EPOCH + 1000 + rng.integers(0, 3_600_000, ENTRIES_PER_LEDGER)).tolist()
            for e, a in enumerate(at):
                t.add_message(ledger, e, a)
            before = t.stats()["create"]["latency_ms"]
            current[0] = ledger + 1
            t.add_message(ledger + 1, 0, EPOCH + 5_000_000)  # rolls: seals the ledger's indexes
            seal_times.append(t.stats()["create"]["latency_ms"] - before)
    finally:
        stop.set()
        th.join()
        store.close()
    lat = np.array(latencies) * 1000
    return {"seal_ms_median": float(np.median(seal_times)), "seal_ms_max": float(max(seal_times)),
            "other_add_p99_ms": float(np.percentile(lat, 99)), "other_add_max_ms": float(lat.max()),
            "other_adds": len(lat)}


def generate_store(path: str, total: int, per_bucket: int = 50_000, ledgers_per_bucket: int = 1) -> None:
    """A store of ``total`` sealed indexes, written with the engine's codec (not through a tracker)."""
    rng = np.random.default_rng(3)
    catalog_path = path
    store = bucketstore.open(catalog_path, durability="sealed")
    store.tracker("t", TrackerConfig())
    cfg = TrackerConfig()
    put = {}
    summaries = {}
    lid = 0
    for b in range(total // per_bucket):
        first = b * ledgers_per_bucket
        seq = np.arange(per_bucket, dtype=np.uint64)
        ledgers = first + seq // (per_bucket // ledgers_per_bucket)
        entries = seq % (per_bucket // ledgers_per_bucket)
        at = EPOCH + 10**8 + rng.integers(0, 3_600_000, per_bucket).astype(np.uint64)
        ts, ls, es = sort_indexes(at, ledgers, entries)
        meta, payloads = build_bucket(first, first + ledgers_per_bucket - 1, ts, ls, es,
                                      time_step_ms=cfg.max_time_step_per_segment_ms,
                                      max_indexes_per_segment=cfg.max_indexes_per_segment)
        file = write_bucket(store.ledgers_dir, lid, meta, payloads, {"tracker": "t", "store_id": store.store_id})
        put[meta.key] = lid
        summaries[meta.key] = encode_summary(meta, lid, os.path.getsize(file))  # as a seal commits it
        lid += 1
    store.catalog.commit("t", put=put, summaries=summaries, next_ledger_id=lid)
    store.close()


_RECOVER = """
import gc, json, resource, sys, time
sys.path.insert(0, sys.argv[2])
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * 4096
import bucketstore
base = rss()
t0 = time.perf_counter()
store = bucketstore.open(sys.argv[1], durability="sealed")
tracker = store.tracker('t', clock=lambda: 1_700_000_000_000)
first = tracker.next_delivery_time()
elapsed = time.perf_counter() - t0
gc.collect()
print(json.dumps({"seconds": elapsed, "rss_delta": rss() - base, "held": tracker.number_of_delayed_messages,
                  "loaded": tracker.stats()["loaded_indexes"], "buckets": tracker.stats()["immutable_buckets"]}))
"""

_INMEMORY = """
import gc, json, sys, time
sys.path.insert(0, sys.argv[2])
import numpy as np
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * 4096
import bucketstore
n = int(sys.argv[1])
rng = np.random.default_rng(3)
seq = np.arange(n)
cols = ((seq // 50000).tolist(), (seq % 50000).tolist(), (1_700_000_000_000 + 10**8 + rng.integers(0, 3_600_000, n)).tolist())
base = rss()
t = bucketstore.InMemoryTracker(clock=lambda: 1_700_000_000_000)
t0 = time.perf_counter()
for l, e, a in zip(*cols):
    t.add_message(l, e, a)
elapsed = time.perf_counter() - t0
gc.collect()
print(json.dumps({"seconds": elapsed, "rss_delta": rss() - base}))
"""


def bench_recovery(sizes: list[int], tmp: str, baseline_max: int) -> list[dict[str, float]]:
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    rows = []
    for n in sizes:
        path = os.path.join(tmp, f"recover-{n}")
        t0 = time.perf_counter()
        generate_store(path, n)
        gen_s = time.perf_counter() - t0
        subprocess.run(["sync"], check=False)
        runs = [json.loads(subprocess.check_output([sys.executable, "-c", _RECOVER, path, root]))
                for _ in range(3)]
        best = min(runs, key=lambda r: r["seconds"])
        row = {"indexes": n, "generate_s": gen_s, "recover_s": best["seconds"],
               "rss_mb": best["rss_delta"] / 2**20, "bytes_per_index": best["rss_delta"] / n,
               "buckets": best["buckets"], "held": best["held"], "loaded": best["loaded"]}
        if n <= baseline_max:
            mem = json.loads(subprocess.check_output([sys.executable, "-c", _INMEMORY, str(n), root]))
            row["inmemory_rebuild_s"] = mem["seconds"]
            row["inmemory_rss_mb"] = mem["rss_delta"] / 2**20
        rows.append(row)
        shutil.rmtree(path)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=float, default=1e6, help="indexes for the add/deliver runs (default 1e6)")
    p.add_argument("--recovery-sizes", default="1e6,1e7", help="comma-separated store sizes (add 1e8 for the target)")
    p.add_argument("--baseline-max", type=float, default=1e7,
                   help="largest size at which InMemoryTracker's rebuild is measured too")
    args = p.parse_args()
    n = int(args.messages)
    sizes = [int(float(s)) for s in args.recovery_sizes.split(",") if s]
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} cpus")
    print("command: python tools/bench/bench_tracker.py " + " ".join(sys.argv[1:]))
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        adds = bench_adds_and_delivery(n, tmp)
        print(f"\nadds and delivery, {n:,} indexes (random delays up to 1 h, 50,000 entries per ledger)")
        print(f"  {'tracker':<8} {'single add/s':>14} {'batch add/s':>14} {'deliver/s':>14}   "
              "(add rates without the time spent sealing)")
        for kind, r in adds.items():
            print(f"  {kind:<8} {r['single_add_per_s']:>14,.0f} {r['batch_add_per_s']:>14,.0f} "
                  f"{r['deliver_per_s']:>14,.0f}   ({r['single_add_per_s_ex_seal']:,.0f} / "
                  f"{r['batch_add_per_s_ex_seal']:,.0f}; sealing took {r['seal_s']:.2f} s)")
        print("  targets: single >= 500,000/s, batch >= 10,000,000/s, delivery >= 2,000,000/s")
        seal = bench_seal_latency(tmp)
        print(f"\nseal of a 50,000-index bucket: median {seal['seal_ms_median']:.1f} ms, max {seal['seal_ms_max']:.1f} ms")
        print(f"  adds from another thread meanwhile: p99 {seal['other_add_p99_ms']:.2f} ms, "
              f"max {seal['other_add_max_ms']:.1f} ms over {seal['other_adds']:,} adds (target p99 <= 5 ms)")
        rows = bench_recovery(sizes, tmp, int(args.baseline_max))
        print("\nrecovery (fresh process, open + tracker + first next_delivery_time; best of 3)")
        print(f"  {'indexes':>12} {'buckets':>8} {'recover s':>10} {'RSS MB':>8} {'B/index':>8}   InMemoryTracker rebuild")
        for r in rows:
            base = (f"{r['inmemory_rebuild_s']:.1f} s, {r['inmemory_rss_mb']:.0f} MB"
                    if "inmemory_rebuild_s" in r else "-")
            print(f"  {r['indexes']:>12,} {r['buckets']:>8} {r['recover_s']:>10.3f} {r['rss_mb']:>8.1f} "
                  f"{r['bytes_per_index']:>8.3f}   {base}")
        print("  targets at 100 M: recovery <= 2 s, <= 1 byte of RSS per held index")


if __name__ == "__main__":
    main()
