"""Where a live-built store's resident bytes are: the breakdown behind docs/memory.md's figures.

Builds sparse indexes through ``add_messages`` in this process, as ``bench_sparse.py --live``
does (the same generator), uses the store as it does (random ``contains_message``, the first due
batch), and prints, over the open store, at each step:

* the RSS before and after ``malloc_trim(0)`` (what the allocator kept that it could return),
  glibc's ``mallinfo2`` (heap in use, free) and the interpreter's small-object arenas;
* the RSS growth per mapping (``/proc/self/smaps``): the main heap, anonymous maps (worker
  threads' heaps, small-object arenas), and the file-backed pages of each library first touched;
* each glibc arena's size, free bytes and resident bytes (``malloc_info``);
* with ``--trace``, the Python-visible allocations still alive (``tracemalloc``, numpy's
  columns included), by line or with ``--frames N`` by call stack.

    PYTHONPATH=. python tools/bench/memory_breakdown.py [--indexes 10000000] [--budget 8192]
                                                        [--trace] [--frames 1] [--top 25]

glibc on Linux only. ``--trace`` slows the build about twofold and adds its own memory to the RSS
figures (read the RSS figures from a run without it).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import re
import sys
import tempfile
import time
from array import array

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

EPOCH = 1_700_000_000_000


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


_LIBC = ctypes.CDLL(None)
_LIBC.mallinfo2.restype = _Mallinfo2
_LIBC.fopen.restype = ctypes.c_void_p


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def small_objects() -> dict[str, int]:
    """The interpreter's small-object allocator: arenas held, bytes in live blocks."""
    with tempfile.TemporaryFile(mode="w+") as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()
    found = {}
    for key in ("arenas allocated current", "bytes in allocated blocks", "bytes in available blocks"):
        m = re.search(r"# " + key + r"\s*=\s*([\d,]+)", text)
        if m:
            found[key] = int(m.group(1).replace(",", ""))
    return found


def mappings() -> dict[str, list[int]]:
    """RSS and anonymous kB per mapping name (its file's basename, [heap] or [anon])."""
    out: dict[str, list[int]] = {}
    cur: list[int] = [0, 0]
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and ":" not in parts[0]:
                cur = out.setdefault(os.path.basename(parts[5]) if len(parts) > 5 else "[anon]", [0, 0])
            elif parts[0] == "Rss:":
                cur[0] += int(parts[1])
            elif parts[0] == "Anonymous:":
                cur[1] += int(parts[1])
    return out


def arenas() -> list[tuple[int, int]]:
    """Each glibc arena's (size, free bytes), from ``malloc_info``."""
    with tempfile.NamedTemporaryFile() as tmp:
        fp = _LIBC.fopen(tmp.name.encode(), b"w")
        _LIBC.malloc_info(0, ctypes.c_void_p(fp))
        _LIBC.fclose(ctypes.c_void_p(fp))
        xml = open(tmp.name).read()
    return [(int(size), int(free)) for free, size in re.findall(
        r'<heap nr="\d+">.*?<total type="rest" count="\d+" size="(\d+)"/>.*?<system type="current" size="(\d+)"/>',
        xml, re.S)]


def step(label: str, base: int, held: int, tracker: object) -> None:
    untrimmed = rss()
    started = time.perf_counter()
    _LIBC.malloc_trim(0)
    trim_ms = (time.perf_counter() - started) * 1e3
    now = rss()
    mi = _LIBC.mallinfo2()
    stats = tracker.stats()  # type: ignore[attr-defined]
    print(f"{label}: RSS growth {(untrimmed - base) / held:.2f} B/index untrimmed, {(now - base) / held:.2f} "
          f"after malloc_trim ({trim_ms:.1f} ms); malloc in use {mi.uordblks / 1e6:.2f} MB, free "
          f"{mi.fordblks / 1e6:.2f} MB, mapped {mi.hblkhd / 1e6:.2f} MB; small objects {small_objects()}; "
          f"tracker's memory_bytes {stats['memory_bytes'] / 1e6:.2f} MB")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--indexes", type=int, default=10_000_000)
    p.add_argument("--bucket", type=int, default=50_000)
    p.add_argument("--shape", default="1", help="percent of entries delayed (as bench_sparse.py)")
    p.add_argument("--budget", type=int, default=8192, help="TrackerConfig.max_resident_ledgers")
    p.add_argument("--uses", type=int, default=20_000)
    p.add_argument("--trace", action="store_true", help="tracemalloc: what Python-visible blocks stay alive")
    p.add_argument("--frames", type=int, default=1)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    if args.trace:
        import tracemalloc
        tracemalloc.start(args.frames)
    import numpy as np

    import bench_sparse
    import bucketstore
    from bucketstore import TrackerConfig
    namespace: dict[str, object] = {}
    exec(bench_sparse._BUILD, namespace)  # the benchmark's generator, as its --live child runs it
    build = namespace["build"]
    np.random.default_rng(0).integers(0, 2, 2)  # the generator's modules: the benchmark's, not the store's
    np.random.default_rng(0).random(2)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BUCKETSTORE_BENCH_DIR")) as tmp:
        now = [EPOCH]
        store = bucketstore.open(tmp, durability="sealed")
        t = store.tracker("t", TrackerConfig(max_resident_ledgers=args.budget), lambda: now[0])
        _LIBC.malloc_trim(0)
        base, maps0 = rss(), mappings()
        snap0 = tracemalloc.take_snapshot() if args.trace else None
        print(f"open: RSS {base / 1e6:.1f} MB; arenas (size, free) {arenas()}")
        last = build(t, args.shape, args.indexes, args.bucket, EPOCH, bench_sparse.LEDGER_ENTRIES)  # type: ignore[operator]
        held = t.number_of_delayed_messages
        time.sleep(1)  # the maintenance worker trims by itself once idle
        step("built, 1 s idle", base, held, t)
        r = random.Random(1)
        asked_l = array("Q", (r.randrange(1, last + 1) for _ in range(args.uses)))
        asked_e = array("Q", (r.randrange(bench_sparse.LEDGER_ENTRIES) for _ in range(args.uses)))
        hits = sum(t.contains_message(a, b) for a, b in zip(asked_l, asked_e))
        now[0] = t.next_delivery_time() + 60_000
        batch = len(t.get_scheduled_messages(10_000))
        step(f"used ({hits} questions tracked, a batch of {batch})", base, held, t)
        maps1 = mappings()
        rows = sorted(((maps1.get(k, [0, 0])[0] - maps0.get(k, [0, 0])[0], maps1.get(k, [0, 0])[1]
                        - maps0.get(k, [0, 0])[1], k) for k in set(maps0) | set(maps1)), reverse=True)
        print("RSS growth per mapping (kB, of which anonymous):")
        for grown, anon, name in rows:
            if grown:
                print(f"  {grown:8d} {anon:8d}  {name}")
        print(f"arenas (size, free): {arenas()}")
        print("tracker stats:", json.dumps({k: v for k, v in t.stats().items() if k in (
            "memory_bytes", "loaded_indexes", "membership", "immutable_buckets")}))
        if snap0 is not None:
            diff = tracemalloc.take_snapshot().compare_to(snap0, "traceback" if args.frames > 1 else "lineno")
            print(f"tracemalloc: {sum(s.size_diff for s in diff) / 1e6:.2f} MB more alive than at the open")
            for s in diff[:args.top]:
                print(f"  {s.size_diff / 1e3:9.1f} kB {s.count_diff:7d} blocks")
                for line in s.traceback.format()[-2 * args.frames:]:
                    print("      " + line.strip()[:140])
        t.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
