"""Merge benchmark: the time to merge 4 sealed buckets of 50,000 indexes, the size of merged buckets, and a long simulate run.

1. Four buckets of 50,000 indexes each (random delays up to 1 h) are sealed by a tracker with
   ``max_num_buckets=4``; a fifth seal makes it merge the four oldest. Prints the merge's time,
   its throughput in indexes per second, and the file sizes before and after.
2. Merged size against its sources on workloads A (fixed delay), B (random delays up to 10 min)
   and S (sparse: 1 % of entries of 10,000-entry ledgers delayed up to 10 min): a tracker with
   ``max_num_buckets=4`` seals buckets of 50,000 (S: 20,000) indexes until it merges; the ratio
   is the merged file's size over the sum of the files it replaced.
3. ``bucketstore simulate`` with ``max_num_buckets`` set (8) and delays within one minute (so the
   held set is at its steady size after a simulated minute), sampling the process's resident
   memory as it runs, to show it and the bucket count stay level.

Run:  python tools/bench/bench_merge.py [--repeat 3] [--simulate-messages 1000000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

sys.path.insert(0, os.path.dirname(__file__))

import bucketstore  # noqa: E402
from bench_seal import batches  # noqa: E402
from bucketstore import TrackerConfig  # noqa: E402
from bucketstore.cli.simulate import SimulationConfig, run_simulation  # noqa: E402

EPOCH = 1_700_000_000_000
PER_BUCKET = 50_000


def merge_once(path: str, seed: int, per_bucket: int = PER_BUCKET, segment: int | None = None) -> dict[str, float]:
    """Seal five ledgers of ``per_bucket`` random-delay indexes (segments of ``segment``, default the
    config's); the fifth seal merges the four oldest."""
    clock = lambda: EPOCH  # noqa: E731 - nothing falls due during the benchmark
    cfg = TrackerConfig(max_num_buckets=4, min_index_count_per_bucket=per_bucket,
                        **({} if segment is None else {"max_indexes_per_segment": segment}))
    rng = np.random.default_rng(seed)
    # Maintenance on the caller's thread: the roll below then seals and merges before it returns (with
    # background maintenance, the default, the stats read next would see no merge yet).
    with bucketstore.open(path, durability="sealed", background=False) as store:
        t = store.tracker("m", cfg, clock)
        for ledger in range(5):
            at = EPOCH + 10_000 + rng.integers(0, 3_600_000, per_bucket)
            t.add_messages((np.full(per_bucket, ledger, np.uint64), np.arange(per_bucket, dtype=np.uint64), at))
            before = sum(b.size for b in t.buckets())  # the four that will be merged
        t.add_messages([(5, 0, EPOCH + 10**8)])  # rolls ledger 4: the fifth seal, then a merge
        st = t.stats()
        merged = t.buckets()
        # The merged bucket is the one that starts at ledger 0; the other is the fifth seal.
        return {"merge_ms": st["merge"]["latency_ms"], "merges": st["merge"]["succeeded"],
                "bytes_before": before + 0.0, "bytes_after": float(merged[0].size),
                "buckets_after": len(merged)}


def merge_ratio(shape: str, per_bucket: int, seed: int) -> tuple[int, int, int]:
    """(sum of the merged sources' file sizes, the merged file's size, number of sources)."""
    with tempfile.TemporaryDirectory() as tmp, bucketstore.open(tmp, durability="sealed",
                                                                          background=False) as store:
        t = store.tracker("m", TrackerConfig(max_num_buckets=4, min_index_count_per_bucket=per_bucket),
                          lambda: EPOCH)
        sizes: dict[int, tuple[int, int, int]] = {}
        for ledgers, ents, at in batches(shape, per_bucket * 8, seed, ledger_size=per_bucket):
            t.add_messages((ledgers, ents, at))
            if t.stats()["merge"]["succeeded"]:
                break
            for b in t.buckets():
                sizes[b.ledger_id] = (b.size, b.start_ledger, b.end_ledger)
        merged = [b for b in t.buckets() if b.ledger_id not in sizes][0]
        sources = [size for size, lo, hi in sizes.values() if merged.start_ledger <= lo and hi <= merged.end_ledger]
        return sum(sources), merged.size, len(sources)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--simulate-messages", type=int, default=1_000_000)
    args = p.parse_args()
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} cpus")
    print("command: python tools/bench/bench_merge.py " + " ".join(sys.argv[1:]))
    runs = []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(merge_once(os.path.join(tmp, "s"), i))
    best = min(runs, key=lambda r: r["merge_ms"])
    n = 4 * PER_BUCKET
    print(f"\nmerge of 4 buckets x {PER_BUCKET:,} indexes (random delays up to 1 h), best of {args.repeat}:")
    print(f"  {best['merge_ms']:.0f} ms = {n / best['merge_ms'] * 1000 / 1e6:.1f} M indexes/s "
          f"(all runs: {', '.join(str(round(r['merge_ms'])) for r in runs)} ms); "
          f"{best['buckets_after']} buckets after; the four files {best['bytes_before']:,.0f} bytes -> "
          f"merged file {best['bytes_after']:,.0f} bytes")

    print("\nmerged bucket size / sum of its sources' sizes (target <= 1):")
    for shape, per_bucket in (("A", 50_000), ("B", 50_000), ("S", 20_000)):
        before, after, k = merge_ratio(shape, per_bucket, 0)
        print(f"  {shape}: {k} sources {before:,} bytes -> merged {after:,} bytes: ratio {after / before:.4f}  "
              f"{'ok' if after <= before else 'MISSED'}")

    level = simulate_level(args.simulate_messages)
    print(f"\nsimulate, {level['messages']:,} messages at {level['rate_per_s']:,}/s, delays within "
          f"{level['window_s']} s, max_num_buckets={level['max_num_buckets']}: "
          f"{level['sealed']} seals, {level['merged']} merges, at most {level['peak_buckets']} buckets at once, "
          f"violations {level['violations']}")
    print(f"  RSS while publishing: first quarter {level['rss_first_mb']:.0f} MB, "
          f"last quarter {level['rss_last_mb']:.0f} MB, peak {level['rss_peak_mb']:.0f} MB "
          "(the simulator's own oracle grows by 9 bytes per message)")


def simulate_level(messages: int) -> dict[str, float]:
    """``bucketstore simulate`` of ``messages`` with delays within one minute, sampling the process's RSS
    while it publishes: the held set reaches its steady size after a simulated minute, so what the run
    shows past that point is whether memory and the bucket count stay level."""
    cfg = SimulationConfig(messages=messages, delay_window_ms=60_000)
    samples: list[tuple[int, int, float]] = []
    import bucketstore.cli.simulate as sim

    class Sampling(sim.Progress):  # the simulator's progress ticks, each one an RSS sample
        def update(self, n: int = 1, *, total: int | None = None) -> None:
            samples.append((self.done, self.phase == "publish", rss_mb()))
            super().update(n, total=total)

    original = sim.Progress
    sim.Progress = Sampling
    try:
        with tempfile.TemporaryDirectory() as tmp:
            report = run_simulation(os.path.join(tmp, "sim"), cfg, progress=False)
    finally:
        sim.Progress = original
    rss = [r for _, publishing, r in samples if publishing]
    quarter = max(1, len(rss) // 4)
    return {"messages": cfg.messages, "rate_per_s": cfg.rate_per_s, "window_s": cfg.delay_window_ms // 1000,
            "max_num_buckets": cfg.tracker.max_num_buckets, "sealed": report.sealed, "merged": report.merged,
            "peak_buckets": report.peak_buckets, "violations": report.violations,
            "rss_first_mb": float(np.mean(rss[:quarter])), "rss_last_mb": float(np.mean(rss[-quarter:])),
            "rss_peak_mb": float(max(rss))}


if __name__ == "__main__":
    main()
