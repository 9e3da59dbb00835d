"""Memory per delayed index: TimeBucketIndex against a heap of triples (seed 000's table).

Workload (seed 000): message ``i`` is published at ``T0 + i // x`` ms (``x``
messages per ms), on ledger ``10000 + i // 50000`` as entry ``i % 50000``
(50,000 entries per ledger), and is delivered at its publish time (a fixed
delay). The ``random`` rows deliver at publish time + U[0, 1 h), where buckets
fill sparsely and the structure degrades.

Each row is built in a fresh subprocess, through the structure's own ``add``;
the figure is the RSS delta after ``gc.collect()`` and ``malloc_trim(0)``
(CRoaring allocates outside Python's allocator, so tracemalloc cannot see it).
Rows:

* ``timebucket``: :class:`bucketstore.memory.timebucket.TimeBucketIndex` (reverse
  lookup and incremental run optimization included);
* ``seed-map``: the seed's bare ``SortedDict{ts >> y: {ledger: BitMap}}``, with
  no reverse lookup and no run optimization, for reference;
* ``heap``: ``heapq`` of ``(ts, ledger, entry)`` tuples, the InMemory baseline.

Usage::

    python tools/bench/bench_timebucket.py                 # 10 M messages, all rows
    python tools/bench/bench_timebucket.py --messages 1000000
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import heapq
import json
import os
import random
import subprocess
import sys
import time

T0 = 1_700_000_000_000
ENTRIES_PER_LEDGER = 50_000
FIRST_LEDGER = 10_000
HOUR_MS = 3_600_000

# Seed 000's measurements (Java, fastutil + Roaring64Bitmap), MB for 10 M messages.
JAVA_MB = {(1, 10): 25.0, (4, 10): 20.48, (8, 10): 11.0, (8, 15): 2.25}


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settle() -> int:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS just includes free arenas
        pass
    return rss()


def _workload(n: int, x: int, delay: str):
    rng = random.Random(42)
    for i in range(n):
        ts = T0 + i // x
        if delay == "random":
            ts += rng.randrange(HOUR_MS)
        yield ts, FIRST_LEDGER + i // ENTRIES_PER_LEDGER, i % ENTRIES_PER_LEDGER


def worker(kind: str, n: int, x: int, y: int, delay: str) -> dict:
    """Build one structure in this (fresh) process and report its RSS delta."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    from pyroaring import BitMap
    from sortedcontainers import SortedDict

    from bucketstore.memory.timebucket import TimeBucketIndex

    result: dict = {}
    if n > 10_000:
        # Warm up: the first build allocates module-level caches and arenas
        # (about 0.4 MB here) that would otherwise be charged to the row.
        worker(kind, 10_000, x, y, delay)
    before = settle()
    start = time.perf_counter()
    if kind == "timebucket":
        index = TimeBucketIndex(y)
        add = index.add
        for ts, ledger, entry in _workload(n, x, delay):
            add(ts, ledger, entry)
        result["buckets"] = index.bucket_count
        result["estimate_bytes"] = index.memory_bytes()
        keep: object = index
    elif kind == "seed-map":
        buckets = SortedDict()
        for ts, ledger, entry in _workload(n, x, delay):
            key = ts >> y
            by_ledger = buckets.get(key)
            if by_ledger is None:
                by_ledger = buckets[key] = {}
            bitmap = by_ledger.get(ledger)
            if bitmap is None:
                bitmap = by_ledger[ledger] = BitMap()
            bitmap.add(entry)
        result["buckets"] = len(buckets)
        keep = buckets
    elif kind == "heap":
        heap: list = []
        push = heapq.heappush
        for triple in _workload(n, x, delay):
            push(heap, triple)
        keep = heap
    else:
        raise SystemExit(f"unknown kind {kind}")
    elapsed = time.perf_counter() - start
    result["rss_bytes"] = settle() - before
    result["adds_per_s"] = n / elapsed
    del keep
    return result


def _run_row(kind: str, n: int, x: int, y: int, delay: str) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", kind, str(n), str(x), str(y), delay],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=10_000_000, help="messages per row (default 10 M)")
    parser.add_argument("--no-heap", action="store_true", help="skip the heap baseline (it needs ~190 B/msg)")
    parser.add_argument("--worker", nargs=5, metavar=("KIND", "N", "X", "Y", "DELAY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, n, x, y, delay = args.worker
        print(json.dumps(worker(kind, int(n), int(x), int(y), delay)))
        return

    n = args.messages
    rows = [(kind, x, y, "fixed") for x, y in [(1, 10), (4, 10), (8, 10), (1, 15), (4, 15), (8, 15)]
            for kind in ("timebucket", "seed-map")]
    rows += [(kind, 4, y, "random") for y in (10, 15) for kind in ("timebucket", "seed-map")]
    if not args.no_heap:
        rows += [("heap", 1, 0, "fixed"), ("heap", 4, 0, "random")]

    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# {n:,} messages per row, {ENTRIES_PER_LEDGER:,} entries per ledger; RSS delta in a fresh process")
    header = ("| structure | x msg/ms | y bits | delay | buckets | RSS MB | B/msg | estimate MB | "
              "Java MB (seed 000, scaled to N) | add/s (M) |")
    print(header)
    print("|---" * 10 + "|")
    for kind, x, y, delay in rows:
        r = _run_row(kind, n, x, y, delay)
        mb = r["rss_bytes"] / 2**20
        est = f"{r['estimate_bytes'] / 2**20:.2f}" if "estimate_bytes" in r else "-"
        java = JAVA_MB.get((x, y)) if kind != "heap" and delay == "fixed" else None
        java_s = f"{java * n / 10_000_000:.2f}" if java is not None else "-"
        print(f"| {kind} | {x if kind != 'heap' else '-'} | {y if kind != 'heap' else '-'} | {delay} | "
              f"{r.get('buckets', '-')} | {mb:.2f} | {r['rss_bytes'] / n:.3f} | {est} | {java_s} | "
              f"{r['adds_per_s'] / 1e6:.2f} |", flush=True)


if __name__ == "__main__":
    main()
