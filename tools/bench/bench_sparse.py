"""Sparse stores: recovery time, resident memory and disk bytes per held index.

A store holds N indexes where a fraction (1 % or 10 %) of the entries of
10,000-entry ledgers are delayed by U[0, 10 min), published one entry a
millisecond: at 1 % and 10 M indexes that is 100,000 ledgers of ~100 indexes.
The store is generated the way seals leave it: sealed buckets of ``--bucket``
indexes (a contiguous ledger range each), written with the library's
``build_bucket``/``write_bucket`` and registered by one catalog commit each,
because adding 100,000 ledgers through a tracker is itself slow today (rolls
scan the mutable bucket: issue 13 item 7).

Recovery is measured from outside, as a user sees it: a fresh Python process
imports bucketstore, notes its RSS, opens the store and the tracker, asks
``next_delivery_time()`` and notes the elapsed time and RSS again. Resident
bytes per index = (RSS after - RSS before) / N; with ``--use``, the whole process's
RSS over N is printed too (the interpreter with its libraries is a fixed floor of
about 40 MiB, so it meets 1 B/index only from about 100 M held). The dense case
(every entry delayed, fixed delay) is measured the same way for comparison.

    PYTHONPATH=. python tools/bench/bench_sparse.py [--indexes 10000000] [--shapes 1,10,dense] [--repeat 3]
                                                    [--use 20000] [--baseline /path/to/other/checkout]

``--use N`` goes on as a broker does after the open: ``contains_message`` of N random
positions (random ledgers, so every bucket) and the first batch due a minute after the
first index, then notes the RSS again. ``--baseline`` opens each store with another
checkout's bucketstore too, alternating, for ratios measured under the same load.

``--live`` builds the store the way a long-running broker does instead: one fresh process
adds the same indexes through ``add_messages`` (a ledger at a time, in publish order), so
every bucket is sealed and installed by that process, then uses it as ``--use`` says
(N defaults to 20,000 there). It notes the RSS after the build and after the use (freed heap
returned first with ``malloc_trim``), its anonymous part (RSS also counts library pages first
touched by the build) and the tracker's own ``stats()['memory_bytes']``; each run
is made back to back with the index pager on and off (``engine/buckets/index_pager.py``), so the two
are compared within one run; ``--budgets 8192,2048`` runs the pager at each of these budgets
(``TrackerConfig.max_resident_ledgers``) too, ratios to the first; ``--no-off`` leaves the pager-off
run out (at 100 M it would hold ~7 B/index). ``--live --questions-ab ROUNDS`` compares the questions'
time alone, pager on and off, within one process: it builds the indexes into two trackers, then
asks both the same questions in alternating rounds, timed in the asking thread's CPU time (a
spilled answer against the index's under the same load; separate processes on a shared machine,
and wall clocks, differ by more than that).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bucketstore import TrackerConfig  # noqa: E402
from bucketstore.engine.store.store import Store  # noqa: E402
from bucketstore.format.bucket_summary import encode_summary  # noqa: E402
from bucketstore.format.snapshot import build_bucket, sort_indexes, write_bucket  # noqa: E402

EPOCH = 1_700_000_000_000
LEDGER_ENTRIES = 10_000
TARGETS = {"recovery_s": {10_000_000: 1.0, 100_000_000: 2.0}, "resident": 1.0, "disk": 4.0}

_CHILD = r"""
import json, os, sys, time
import bucketstore
from bucketstore import TrackerConfig
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
before = rss()
now = [int(sys.argv[2])]
start = time.perf_counter()
store = bucketstore.open(sys.argv[1], durability="sealed")
t = store.tracker("t", TrackerConfig(), lambda: now[0])
first = t.next_delivery_time()
elapsed = time.perf_counter() - start
out = {"seconds": elapsed, "rss_growth": rss() - before, "held": t.number_of_delayed_messages, "first": first,
       "rss_imported": before}
uses, ledgers = int(sys.argv[3]), int(sys.argv[4])
if uses:
    # Used as a broker would: membership questions on random positions of every ledger (so every
    # bucket), then the first due batch.
    import random
    from array import array
    rng = random.Random(1)
    # Two flat arrays, not 20,000 tuples: the questions must not weigh in the RSS measured after.
    asked_l = array("Q", (rng.randrange(1, ledgers + 1) for _ in range(uses)))
    asked_e = array("Q", (rng.randrange(10_000) for _ in range(uses)))
    started = time.perf_counter()
    hits = sum(t.contains_message(l, e) for l, e in zip(asked_l, asked_e))
    out["contains_seconds"] = time.perf_counter() - started
    now[0] = first + 60_000  # a minute's worth is due
    started = time.perf_counter()
    out["batch"] = len(t.get_scheduled_messages(10_000))
    out["batch_seconds"] = time.perf_counter() - started
    out["hits"] = hits
    out["used_rss_growth"] = rss() - before
out["rss_whole"] = rss()
print(json.dumps(out))
"""


_BUILD = r"""
import numpy as np
def build(t, shape, n, bucket, epoch, ledger_entries):
    # The same indexes as generate(), added through add_messages in publish order; returns the
    # last ledger. (A function: the last publish batch's columns go when it returns, as a
    # broker lets them go.)
    rng = np.random.default_rng(0)
    done, next_entry, last_ledger = 0, 0, 0
    while done < n:
        k = min(bucket, n - done)
        if shape == "dense":
            chosen = np.arange(next_entry, next_entry + k, dtype=np.uint64)
            delay = np.full(k, 60_000, np.uint64)
        else:
            span = int(k / (int(shape) / 100) * 1.2) + ledger_entries
            chosen = (next_entry + np.flatnonzero(rng.random(span) < int(shape) / 100)[:k]).astype(np.uint64)
            delay = rng.integers(0, 600_000, len(chosen)).astype(np.uint64)
        ledgers = np.uint64(1) + chosen // np.uint64(ledger_entries)
        t.add_messages((ledgers, chosen % np.uint64(ledger_entries), np.uint64(epoch + 1_000) + chosen + delay))
        done += len(chosen)
        last_ledger = int(ledgers.max())
        next_entry = last_ledger * ledger_entries
    t.flush()
    return last_ledger
"""

_LIVE_CHILD = _BUILD + r"""
import ctypes, json, os, sys, time
import bucketstore
from bucketstore import TrackerConfig
path, shape, n, bucket, uses, budget, epoch, ledger_entries = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:9])
# budget -1: the pager off (it never sweeps: every installed bucket stays in the index).
config = TrackerConfig(max_resident_ledgers=(1 << 62) if budget < 0 else budget)
libc = ctypes.CDLL("libc.so.6")
def rss():
    libc.malloc_trim(0)  # freed heap (the build's transient columns) back to the system first
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def anon():
    # Anonymous memory only: RSS also counts the library pages the build first touched.
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Anonymous:"))
now = [epoch]
store = bucketstore.open(path, durability="sealed")
t = store.tracker("t", config, lambda: now[0])
before = rss()
before_anon = anon()
started = time.perf_counter()
last_ledger = build(t, shape, n, bucket, epoch, ledger_entries)
out = {"build_seconds": time.perf_counter() - started, "held": t.number_of_delayed_messages,
       "buckets": t.stats()["immutable_buckets"], "built_rss": rss() - before, "built_anon": anon() - before_anon,
       "built_memory_bytes": t.stats()["memory_bytes"]}
import random
from array import array
r = random.Random(1)
asked_l = array("Q", (r.randrange(1, last_ledger + 1) for _ in range(uses)))
asked_e = array("Q", (r.randrange(ledger_entries) for _ in range(uses)))
started = time.perf_counter()
out["hits"] = sum(t.contains_message(l, e) for l, e in zip(asked_l, asked_e))
out["contains_seconds"] = time.perf_counter() - started
now[0] = t.next_delivery_time() + 60_000
started = time.perf_counter()
out["batch"] = len(t.get_scheduled_messages(10_000))
out["batch_seconds"] = time.perf_counter() - started
out["used_rss"] = rss() - before
out["used_anon"] = anon() - before_anon
out["whole_rss"] = rss()
stats = t.stats()
out["used_memory_bytes"] = stats["memory_bytes"]
out["paged_buckets"] = stats["membership"].get("paged_buckets", 0)
print(json.dumps(out))
"""

_AB_CHILD = _BUILD + r"""
import json, random, sys, time
import bucketstore
from bucketstore import TrackerConfig
path, shape = sys.argv[1], sys.argv[2]
n, bucket, uses, budget, epoch, ledger_entries, rounds = map(int, sys.argv[3:10])
trackers, last = {}, 0
for name, resident in (("on", budget), ("off", 1 << 62)):
    store = bucketstore.open(f"{path}/{name}", durability="sealed")
    trackers[name] = store.tracker("t", TrackerConfig(max_resident_ledgers=resident), lambda: epoch)
    last = build(trackers[name], shape, n, bucket, epoch, ledger_entries)
r = random.Random(1)
asked = [(r.randrange(1, last + 1), r.randrange(ledger_entries)) for _ in range(uses)]
out = {name: [] for name in trackers}
for _ in range(rounds):  # alternating: a shared machine's load hits both alike
    for name, t in trackers.items():
        ask = t.contains_message
        # This thread's CPU time (user and system: the spill's reads are system time), not the
        # wall clock, which a loaded machine stretches by whatever else it runs meanwhile.
        started = time.thread_time()
        for l, e in asked:
            ask(l, e)
        out[name].append((time.thread_time() - started) / uses)
out["paged_buckets"] = trackers["on"].stats()["membership"].get("paged_buckets", 0)
print(json.dumps(out))
"""


def live(tmp: str, shape: str, n: int, bucket: int, uses: int, budget: int, tree: str = "") -> dict:
    """Build and use a store in one fresh process (see ``--live``) with this pager budget
    (``max_resident_ledgers``; -1: the pager off)."""
    path = tempfile.mkdtemp(dir=tmp)
    tree = tree or HERE
    out = subprocess.run([sys.executable, "-c", _LIVE_CHILD, path, shape, str(n), str(bucket), str(uses),
                          str(budget), str(EPOCH), str(LEDGER_ENTRIES)], capture_output=True, text=True,
                         cwd=tree, env={**os.environ, "PYTHONPATH": tree})
    if out.returncode:
        raise SystemExit(f"live build failed:\n{out.stderr}")
    return json.loads(out.stdout)


def questions_ab(tmp: str, shape: str, n: int, bucket: int, uses: int, budget: int, rounds: int) -> dict:
    """Build the same indexes into two trackers of one fresh process, the pager at ``budget`` and
    off, then time ``rounds`` alternating rounds of the same ``uses`` questions on each (see
    ``--questions-ab``): the answer from the spill against the index's, under the same load."""
    path = tempfile.mkdtemp(dir=tmp)
    out = subprocess.run([sys.executable, "-c", _AB_CHILD, path, shape, str(n), str(bucket), str(uses),
                          str(budget), str(EPOCH), str(LEDGER_ENTRIES), str(rounds)], capture_output=True,
                         text=True, cwd=HERE, env={**os.environ, "PYTHONPATH": HERE})
    if out.returncode:
        raise SystemExit(f"questions A/B failed:\n{out.stderr}")
    return json.loads(out.stdout)


def _print_live(label: str, runs: list[dict]) -> None:
    held = runs[0]["held"]
    med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    print(f"  {label}: built {held:,} in {runs[0]['buckets']} sealed buckets in {med('build_seconds'):.0f} s; "
          f"resident after build {med('built_rss') / held:.2f} B/index (anonymous {med('built_anon') / held:.2f}, "
          f"stats {med('built_memory_bytes') / held:.2f}), after {runs[0]['hits']} of the questions tracked + "
          f"first batch {med('used_rss') / held:.2f} B/index (anonymous {med('used_anon') / held:.2f}, "
          f"stats {med('used_memory_bytes') / held:.2f}); questions {med('contains_seconds'):.2f} s, "
          f"batch {med('batch_seconds'):.3f} s; paged-out buckets {runs[0]['paged_buckets']}; whole process "
          f"after use {med('whole_rss') / held:.2f} B/index")


def generate(path: str, shape: str, n: int, bucket: int, seed: int) -> tuple[int, int]:
    """Write the store; return its ledger files' total size and its last ledger id."""
    rng = np.random.default_rng(seed)
    total_bytes = 0
    with Store(path, durability="sealed") as store:
        store.tracker("t", TrackerConfig(), lambda: EPOCH).close()  # registers the tracker in the catalog
        done, next_entry = 0, 0
        while done < n:
            k = min(bucket, n - done)
            if shape == "dense":
                chosen = np.arange(next_entry, next_entry + k, dtype=np.uint64)
                delay = np.full(k, 60_000, np.uint64)
            else:
                fraction = int(shape) / 100
                span = int(k / fraction * 1.2) + LEDGER_ENTRIES
                picks = np.flatnonzero(rng.random(span) < fraction)[:k]
                # End the bucket at a ledger boundary so the next bucket's range starts fresh.
                chosen = (next_entry + picks).astype(np.uint64)
                k = len(chosen)
                delay = rng.integers(0, 600_000, k).astype(np.uint64)
            ledgers = np.uint64(1) + chosen // np.uint64(LEDGER_ENTRIES)
            entries = chosen % np.uint64(LEDGER_ENTRIES)
            ts, ledgers, entries = sort_indexes(EPOCH + 1_000 + chosen + delay, ledgers, entries)
            lo, hi = int(ledgers.min()), int(ledgers.max())
            meta, payloads = build_bucket(lo, hi, ts, ledgers, entries, time_step_ms=300_000,
                                          max_indexes_per_segment=5_000)
            ledger_id = store.allocate_ledger_id()
            file = write_bucket(store.ledgers_dir, ledger_id, meta, payloads, {"tracker": "t"})
            store.catalog.commit("t", put={meta.key: ledger_id}, next_ledger_id=ledger_id + 1,
                                 summaries={meta.key: encode_summary(meta, ledger_id, os.path.getsize(file))})
            total_bytes += os.path.getsize(file)
            done += k
            next_entry = (hi + 1 - 1) * LEDGER_ENTRIES  # the next ledger after this bucket's last
            last_ledger = hi
    return total_bytes, last_ledger


HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def recover(path: str, uses: int = 0, ledgers: int = 0, tree: str = HERE) -> dict:
    """Open the store in a fresh process importing bucketstore from ``tree`` (this checkout, or
    the baseline's)."""
    out = subprocess.run([sys.executable, "-c", _CHILD, path, str(EPOCH), str(uses), str(ledgers)], capture_output=True,
                         text=True, cwd=tree, env={**os.environ, "PYTHONPATH": tree})
    if out.returncode:
        raise SystemExit(f"recovery failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--indexes", type=int, default=10_000_000)
    p.add_argument("--bucket", type=int, default=500_000, help="indexes per sealed bucket")
    p.add_argument("--shapes", default="1,10,dense", help="comma-separated: percent delayed, or dense")
    p.add_argument("--repeat", type=int, default=3, help="recoveries per store (fresh process each)")
    p.add_argument("--use", type=int, default=0, metavar="N",
                   help="after the open, ask contains_message of N random positions (every ledger, so "
                        "every bucket) and take the first due batch; report their time and the RSS after")
    p.add_argument("--baseline", metavar="TREE",
                   help="also open each store with the bucketstore of this checkout (e.g. /work/main), "
                        "alternating with this one, and print its figures and the ratios")
    p.add_argument("--live", action="store_true",
                   help="build the store in the measuring process through add_messages (seals installed "
                        "live), use it, and compare the index pager on and off")
    p.add_argument("--budgets", default=str(TrackerConfig().max_resident_ledgers), metavar="N[,N...]",
                   help="--live: the pager budgets (TrackerConfig.max_resident_ledgers) to run, each "
                        "back to back with the others and with the pager off; ratios are to the first")
    p.add_argument("--no-off", action="store_true",
                   help="--live: leave out the run with the pager off (at 100 M it holds ~7 B/index)")
    p.add_argument("--questions-ab", type=int, default=0, metavar="ROUNDS",
                   help="--live: instead, one process builds the indexes into two trackers, the pager at the "
                        "first budget and off, and times ROUNDS alternating rounds of the same questions on each")
    args = p.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    if any(b < 0 for b in budgets):
        p.error("--budgets: each must be >= 0")
    print(f"$ PYTHONPATH=. python tools/bench/bench_sparse.py --indexes {args.indexes} --bucket {args.bucket} "
          f"--shapes {args.shapes} --repeat {args.repeat}" + (f" --use {args.use}" if args.use else "")
          + (f" --baseline {args.baseline}" if args.baseline else "") + (" --live" if args.live else "")
          + (f" --budgets {args.budgets}" if args.live and args.budgets != p.get_default("budgets") else "")
          + (" --no-off" if args.no_off else "")
          + (f" --questions-ab {args.questions_ab}" if args.questions_ab else ""))
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} cpu(s)")
    n = args.indexes
    if args.live and args.questions_ab:
        for shape in args.shapes.split(","):
            with tempfile.TemporaryDirectory(dir=os.environ.get("BUCKETSTORE_BENCH_DIR")) as tmp:
                ab = questions_ab(tmp, shape, n, args.bucket, args.use or 20_000, budgets[0], args.questions_ab)
            on, off = min(ab["on"]), min(ab["off"])
            print(f"{shape} % of entries delayed:" if shape != "dense" else "dense (every entry, fixed delay):")
            print(f"  {args.use or 20_000:,} random contains_message, CPU time, best of {args.questions_ab} rounds: "
                  f"pager at "
                  f"{budgets[0]:,} ledgers ({ab['paged_buckets']} buckets paged out) {on * 1e6:.2f} us a question, "
                  f"pager off {off * 1e6:.2f} us; on / off {on / off:.2f} (round by round: "
                  + ", ".join(f"{a / b:.2f}" for a, b in zip(ab["on"], ab["off"])) + ")  (target <= 2)")
        return 0
    if args.live:
        for shape in args.shapes.split(","):
            runs: dict[int, list[dict]] = {b: [] for b in budgets + ([] if args.no_off else [-1])}
            with tempfile.TemporaryDirectory(dir=os.environ.get("BUCKETSTORE_BENCH_DIR")) as tmp:
                for _ in range(args.repeat):  # back to back: a shared machine's load hits all alike
                    for budget in runs:
                        runs[budget].append(live(tmp, shape, n, args.bucket, args.use or 20_000, budget))
            print("dense (every entry, fixed delay):" if shape == "dense" else f"{shape} % of entries delayed:")
            for budget, rs in runs.items():
                _print_live("pager off" if budget < 0 else f"pager at {budget:,} ledgers", rs)
            spent = lambda r: r["contains_seconds"] + r["batch_seconds"]  # noqa: E731
            first = runs[budgets[0]]
            for budget, rs in runs.items():
                if rs is first:
                    continue
                label = "off" if budget < 0 else f"{budget:,}"
                print(f"  {budgets[0]:,} / {label}, run by run: used RSS "
                      + ", ".join(f"{a['used_rss'] / b['used_rss']:.2f}" for a, b in zip(first, rs))
                      + "; questions + batch time "
                      + ", ".join(f"{spent(a) / spent(b):.2f}" for a, b in zip(first, rs)))
        return 0
    recovery_target = TARGETS["recovery_s"].get(n)
    for shape in args.shapes.split(","):
        with tempfile.TemporaryDirectory(dir=os.environ.get("BUCKETSTORE_BENCH_DIR")) as tmp:
            started = time.perf_counter()
            disk, last_ledger = generate(tmp, shape, n, args.bucket, 0)
            built = time.perf_counter() - started
            runs, base = [], []
            for _ in range(args.repeat):  # alternating: a shared machine's load hits both alike
                runs.append(recover(tmp, args.use, last_ledger))
                if args.baseline:
                    base.append(recover(tmp, args.use, last_ledger, os.path.abspath(args.baseline)))
        held = runs[0]["held"]
        seconds = statistics.median(r["seconds"] for r in runs)
        resident = statistics.median(r["rss_growth"] for r in runs) / held
        label = "dense (every entry, fixed delay)" if shape == "dense" else f"{shape} % of entries delayed"
        ledgers = "" if shape == "dense" else f", ~{held * 100 // int(shape) // LEDGER_ENTRIES:,} ledgers"
        print(f"{label}: {held:,} held{ledgers}; store built in {built:.0f} s")
        print(f"  recovery {seconds:.2f} s (median of {args.repeat}; "
              + ", ".join(f"{r['seconds']:.2f}" for r in runs) + ")"
              + (f"  target <= {recovery_target} s {'ok' if seconds <= recovery_target else 'MISSED'}"
                 if recovery_target else ""))
        print(f"  resident {resident:.2f} B/index  (target <= {TARGETS['resident']}) "
              f"{'ok' if resident <= TARGETS['resident'] else 'MISSED'}")
        print(f"  disk     {disk / held:.2f} B/index  (target <= {TARGETS['disk']}) "
              f"{'ok' if disk / held <= TARGETS['disk'] else 'MISSED'}")
        if args.use:
            _print_use(args.use, runs, held, None)
        if base:
            print(f"  baseline {args.baseline}: recovery {statistics.median(r['seconds'] for r in base):.2f} s, "
                  f"resident {statistics.median(r['rss_growth'] for r in base) / held:.2f} B/index")
            if args.use:
                _print_use(args.use, base, held, runs)
    return 0


def _print_use(uses: int, runs: list[dict], held: int, ours: list[dict] | None) -> None:
    used = statistics.median(r["used_rss_growth"] for r in runs) / held
    asked = statistics.median(r["contains_seconds"] for r in runs)
    batch = statistics.median(r["batch_seconds"] for r in runs)
    whole = statistics.median(r["rss_whole"] for r in runs) / held
    floor = statistics.median(r["rss_imported"] for r in runs) / 2**20
    line = (f"  used: {uses:,} contains_message {asked:.2f} s ({runs[0]['hits']} tracked), first due batch of "
            f"{runs[0]['batch']} {batch:.3f} s; resident after {used:.2f} B/index")
    if ours is None:
        line += f"  (target <= {TARGETS['resident']}) {'ok' if used <= TARGETS['resident'] else 'MISSED'}"
        line += (f"\n  whole process after use {whole:.2f} B/index, of which {floor:.0f} MiB before the open "
                 f"(the interpreter with bucketstore, numpy, pyroaring and lmdb imported)")
    else:  # the baseline's line: this checkout's time over the baseline's, run by run
        ratios = [(o["contains_seconds"] + o["batch_seconds"]) / (b["contains_seconds"] + b["batch_seconds"])
                  for o, b in zip(ours, runs)]
        line += (f"; this checkout's questions + batch over the baseline's: "
                 + ", ".join(f"{r:.2f}" for r in ratios) + "  (target <= 2)")
    print(line)


if __name__ == "__main__":
    sys.exit(main())
