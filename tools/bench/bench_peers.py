"""bucketstore against the stores a delay queue would otherwise be built on, on one job, in one run.

The job (issue 17): ``--positions`` delayed indexes (default 1 M) published in order,
50,000 entries per ledger, each delayed by U[0, ``--delay-ms``) (default 10 min), added
in batches of ``--add-batch`` (10,000); then a **restart**: a fresh process opens the
store and takes the first due batch (time and resident memory until it is in hand);
then the **drain**: batches of ``--drain-batch`` (1,000) under a moving clock, each
batch deleted from the store as it is delivered, until every position has come out.
``--regime paced`` (the default): the clock moves by (last time - first time) /
(positions / batch) at every call. ``--regime keepup``, where a broker's dispatcher
lives: the clock moves by that step (one batch's arrival time) only when a call comes
back short, so each tick finds about one batch just fallen due and takes it.

Subjects, each with its idiomatic design:

* ``bucketstore-sealed`` / ``bucketstore-journal``: ``add_messages`` of numpy columns,
  ``get_scheduled_messages`` (default ``TrackerConfig``; journal mode with the default
  ``sync_interval_ms=0``, every add batch fsynced, and the default ``confirm_sync_ms``).
  One extra index on the next ledger rolls the last ledger over, so sealed mode seals it.
* ``sqlite-normal`` / ``sqlite-full`` (stdlib ``sqlite3``, WAL, ``synchronous`` NORMAL /
  FULL): a ``WITHOUT ROWID`` table keyed by ``(deliver_at, ledger, entry)``; one
  transaction per add batch; a drain batch is one transaction: the first rows by key
  at or before the cutoff, and their ``DELETE`` (a range on the key).
* ``lmdb-sync`` / ``lmdb-nosync``: key = big-endian ``(deliver_at, ledger, entry)``,
  empty value; ``putmulti`` per add batch; a drain batch reads from the first key and
  deletes through the cursor in the same write transaction (``sync=False``: no fsync at
  commit; durable at the OS's leisure).
* ``leveldb-sync`` / ``leveldb-nosync`` (``plyvel``) and ``rocksdb-sync`` /
  ``rocksdb-nosync`` (``rocksdict``): the same keys; a write batch per add batch and
  per drain batch (the deletes), ``sync=True`` or not (unsynced: the write-ahead log
  reaches the OS, not the disk). The drain iterates from the last key it deleted (it
  would otherwise walk its own tombstones), bounded above by the cutoff. Skipped, and
  said so, when the package is not installed (``pip install plyvel rocksdict``; they
  are not bucketstore dependencies).

Every subject uses the same cutoff rule as the tracker's default: due = at or before
``now + 1000 ms``. Bytes per position: allocated bytes (``st_blocks``) of the store's
directory after the adds and a clean close, over the positions. Add rate includes the
close (sealed mode: its seals). Each phase runs in a fresh process.

Run:  python tools/bench/bench_peers.py [--positions 1e6] [--regime paced|keepup] [--peers bucketstore-journal,sqlite-full,...]
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
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, ROOT)

EPOCH = 1_700_000_000_000
ENTRIES_PER_LEDGER = 50_000
TICK_MS = 1000  # the tracker's default tick: due = at or before now + tick
SUBJECTS = ("bucketstore-sealed", "bucketstore-journal", "sqlite-normal", "sqlite-full", "lmdb-sync", "lmdb-nosync",
            "leveldb-sync", "leveldb-nosync", "rocksdb-sync", "rocksdb-nosync")
BASELINE = "bucketstore-journal"
_BE = np.dtype(">u8")


def workload(n: int, delay_ms: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(deliver_at, ledgers, entries): 10 messages per ms, delays U[0, delay_ms)."""
    rng = np.random.default_rng(seed)
    seq = np.arange(n, dtype=np.uint64)
    at = EPOCH + 1000 + seq // 10 + rng.integers(0, delay_ms, n).astype(np.uint64)
    return at, seq // ENTRIES_PER_LEDGER, seq % ENTRIES_PER_LEDGER


def drain_clock(at: np.ndarray, batch: int) -> tuple[int, float]:
    """The drain's first clock (the first batch is due) and its step per call."""
    first = int(np.partition(at, min(batch, len(at)) - 1)[min(batch, len(at)) - 1]) - TICK_MS
    return first, (int(at.max()) - first) / max(1, len(at) // batch)


def keys_of(at: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> list[bytes]:
    """Big-endian 24-byte keys: byte order = index order, so a range scan from the start gives due rows."""
    raw = np.stack([at, ledgers, entries], axis=1).astype(_BE).tobytes()
    return [raw[i:i + 24] for i in range(0, len(raw), 24)]


def positions_of(keys: list[bytes]) -> list[tuple[int, int]]:
    cols = np.frombuffer(b"".join(keys), dtype=_BE).reshape(-1, 3)
    return list(zip(cols[:, 1].tolist(), cols[:, 2].tolist()))


def cutoff_key(cutoff: int) -> bytes:
    """The first key after every key due at ``cutoff`` (an exclusive upper bound)."""
    return np.array([cutoff + 1, 0, 0], dtype=_BE).tobytes()


# -- the subjects ---------------------------------------------------------------------------------
class Bucketstore:
    def __init__(self, path: str, mode: str) -> None:
        import bucketstore
        from bucketstore import TrackerConfig
        self.now = EPOCH - TICK_MS  # nothing is due while adding
        self.store = bucketstore.open(path, durability=mode)
        self.tracker = self.store.tracker("t", TrackerConfig(), lambda: self.now)

    def add(self, at: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> None:
        self.tracker.add_messages((ledgers, entries, at))

    def finish_adds(self, last_ledger: int) -> None:
        # One index on the next ledger rolls the last one over: sealed mode seals it too.
        self.tracker.add_message(last_ledger + 1, 0, EPOCH + 10**12)

    def pop(self, now: int, batch: int) -> list[tuple[int, int]]:
        self.now = now
        return self.tracker.get_scheduled_messages(batch)

    def close(self) -> None:
        self.store.close()


class Sqlite:
    def __init__(self, path: str, synchronous: str) -> None:
        import sqlite3
        os.makedirs(path, exist_ok=True)
        self.db = sqlite3.connect(os.path.join(path, "q.db"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute("CREATE TABLE IF NOT EXISTS q (t INTEGER NOT NULL, l INTEGER NOT NULL, e INTEGER NOT NULL, "
                        "PRIMARY KEY (t, l, e)) WITHOUT ROWID")

    def add(self, at, ledgers, entries) -> None:
        self.db.execute("BEGIN")
        self.db.executemany("INSERT OR IGNORE INTO q VALUES (?, ?, ?)",
                            zip(at.tolist(), ledgers.tolist(), entries.tolist()))
        self.db.execute("COMMIT")

    def finish_adds(self, last_ledger: int) -> None:
        pass

    def pop(self, now: int, batch: int) -> list[tuple[int, int]]:
        self.db.execute("BEGIN IMMEDIATE")
        rows = self.db.execute("SELECT t, l, e FROM q WHERE t <= ? ORDER BY t, l, e LIMIT ?",
                               (now + TICK_MS, batch)).fetchall()
        if rows:
            self.db.execute("DELETE FROM q WHERE (t, l, e) <= (?, ?, ?)", rows[-1])
        self.db.execute("COMMIT")
        return [(l, e) for _, l, e in rows]

    def close(self) -> None:
        self.db.close()


class Lmdb:
    def __init__(self, path: str, sync: bool) -> None:
        import lmdb
        self.env = lmdb.open(path, map_size=1 << 36, sync=sync, metasync=sync)

    def add(self, at, ledgers, entries) -> None:
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti([(k, b"") for k in keys_of(at, ledgers, entries)])

    def finish_adds(self, last_ledger: int) -> None:
        pass

    def pop(self, now: int, batch: int) -> list[tuple[int, int]]:
        stop = cutoff_key(now + TICK_MS)
        out: list[bytes] = []
        with self.env.begin(write=True) as txn:
            cur = txn.cursor()
            if cur.first():
                while len(out) < batch:
                    key = cur.key()
                    if key >= stop:
                        break
                    out.append(key)
                    if not cur.delete():  # moves to the next record
                        break
                    if not cur.key():
                        break
        return positions_of(out) if out else []

    def close(self) -> None:
        self.env.close()


class LevelDb:
    def __init__(self, path: str, sync: bool) -> None:
        import plyvel
        self.db = plyvel.DB(path, create_if_missing=True)
        self.sync = sync
        self.low = b""

    def add(self, at, ledgers, entries) -> None:
        with self.db.write_batch(sync=self.sync) as wb:
            for k in keys_of(at, ledgers, entries):
                wb.put(k, b"")

    def finish_adds(self, last_ledger: int) -> None:
        pass

    def pop(self, now: int, batch: int) -> list[tuple[int, int]]:
        out: list[bytes] = []
        for key in self.db.iterator(start=self.low or None, stop=cutoff_key(now + TICK_MS), include_value=False):
            out.append(key)
            if len(out) == batch:
                break
        if not out:
            return []
        with self.db.write_batch(sync=self.sync) as wb:
            for k in out:
                wb.delete(k)
        self.low = out[-1]
        return positions_of(out)

    def close(self) -> None:
        self.db.close()


class RocksDb:
    def __init__(self, path: str, sync: bool) -> None:
        from rocksdict import Options, Rdict, WriteOptions
        self.db = Rdict(path, Options(raw_mode=True))
        self.write_opts = WriteOptions()
        self.write_opts.sync = sync
        self.low = b""

    def add(self, at, ledgers, entries) -> None:
        from rocksdict import WriteBatch
        wb = WriteBatch(raw_mode=True)
        for k in keys_of(at, ledgers, entries):
            wb.put(k, b"")
        self.db.write(wb, self.write_opts)

    def finish_adds(self, last_ledger: int) -> None:
        pass

    def pop(self, now: int, batch: int) -> list[tuple[int, int]]:
        from rocksdict import ReadOptions, WriteBatch
        ro = ReadOptions()
        ro.set_iterate_upper_bound(cutoff_key(now + TICK_MS))
        it = self.db.iter(ro)
        it.seek(self.low) if self.low else it.seek_to_first()
        out: list[bytes] = []
        while it.valid() and len(out) < batch:
            out.append(it.key())
            it.next()
        del it
        if not out:
            return []
        wb = WriteBatch(raw_mode=True)
        for k in out:
            wb.delete(k)
        self.db.write(wb, self.write_opts)
        self.low = out[-1]
        return positions_of(out)

    def close(self) -> None:
        self.db.close()


def missing_package(subject: str) -> str | None:
    """The package a subject needs and this Python lacks, or None."""
    needs = {"leveldb": "plyvel", "rocksdb": "rocksdict"}.get(subject.split("-")[0])
    if needs is None:
        return None
    try:
        __import__(needs)
    except ImportError:
        return needs
    return None


def make(subject: str, path: str):
    kind, variant = subject.split("-", 1)
    if kind == "bucketstore":
        return Bucketstore(path, variant)
    if kind == "sqlite":
        return Sqlite(path, variant.upper())
    if kind == "lmdb":
        return Lmdb(path, variant == "sync")
    if kind == "leveldb":
        return LevelDb(path, variant == "sync")
    if kind == "rocksdb":
        return RocksDb(path, variant == "sync")
    raise ValueError(subject)


# -- the phases, each in a fresh process --------------------------------------------------------------
def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def phase_add(subject: str, path: str, args: argparse.Namespace) -> dict:
    at, ledgers, entries = workload(args.positions, args.delay_ms)
    store = make(subject, path)
    gc.collect()
    gc.disable()
    t0 = time.perf_counter()
    for lo in range(0, len(at), args.add_batch):
        hi = lo + args.add_batch
        store.add(at[lo:hi], ledgers[lo:hi], entries[lo:hi])
    store.finish_adds(int(ledgers[-1]))
    store.close()
    return {"add_s": time.perf_counter() - t0}


def phase_restart_and_drain(subject: str, path: str, args: argparse.Namespace) -> dict:
    at, _, _ = workload(args.positions, args.delay_ms)
    first, step = drain_clock(at, args.drain_batch)
    last = int(at.max())
    del at
    make(subject, os.path.join(tempfile.mkdtemp(dir=args.scratch), "warm")).close()  # imports, not timed
    gc.collect()
    base = rss()
    t0 = time.perf_counter()
    store = make(subject, path)
    got = store.pop(first, args.drain_batch)
    restart_s = time.perf_counter() - t0
    restart_rss = rss() - base
    delivered, calls, ticks = len(got), 1, 1
    keepup = args.regime == "keepup"
    gc.disable()
    t1 = time.perf_counter()
    while delivered < args.positions:
        if not keepup or len(got) < args.drain_batch:
            ticks += 1  # (keepup: a full batch may leave more due at the same time)
        now = int(first + (ticks - 1) * step)
        calls += 1
        got = store.pop(now, args.drain_batch)
        delivered += len(got)
        if not got and now > last + TICK_MS:
            break
    drain_s = time.perf_counter() - t1
    gc.enable()
    store.close()
    return {"restart_s": restart_s, "restart_rss": restart_rss, "drain_s": drain_s,
            "drained": delivered, "first_batch": args.drain_batch, "calls": calls}


def allocated_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def run_child(phase: str, subject: str, path: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", phase, "--subject", subject, "--path", path,
           "--positions", str(args.positions), "--add-batch", str(args.add_batch),
           "--drain-batch", str(args.drain_batch), "--delay-ms", str(args.delay_ms), "--scratch", args.scratch,
           "--regime", args.regime]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_once(subject: str, args: argparse.Namespace) -> dict:
    path = os.path.join(tempfile.mkdtemp(dir=args.scratch), subject)
    add = run_child("add", subject, path, args)
    size = allocated_bytes(path)
    subprocess.run(["sync"], check=False)
    rest = run_child("drain", subject, path, args)
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    drained_after_first = rest["drained"] - rest["first_batch"]
    return {"add": args.positions / add["add_s"], "restart_ms": rest["restart_s"] * 1000,
            "rss_mb": rest["restart_rss"] / 2**20, "drain": drained_after_first / rest["drain_s"],
            "bytes": size / args.positions, "drained": rest["drained"]}


def best_of(runs: list[dict]) -> dict:
    best = {k: (min if k in ("restart_ms", "rss_mb", "bytes") else max)(r[k] for r in runs) for k in runs[0]}
    best["drained"] = min(r["drained"] for r in runs)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--positions", type=lambda s: int(float(s)), default=1_000_000)
    p.add_argument("--add-batch", type=int, default=10_000)
    p.add_argument("--drain-batch", type=int, default=1_000)
    p.add_argument("--delay-ms", type=int, default=600_000)
    p.add_argument("--regime", choices=["paced", "keepup"], default="paced",
                   help="drain clock: a step per call (paced), or a step when a call comes back short (keepup)")
    p.add_argument("--peers", default=",".join(SUBJECTS), help="comma-separated subjects (default: all)")
    p.add_argument("--repeat", type=int, default=1, help="runs per subject; the best of each figure is shown")
    p.add_argument("--scratch", default=None, help="directory for the stores (default: a temporary one)")
    p.add_argument("--json", action="store_true", help="also print the figures as JSON")
    p.add_argument("--child", choices=["add", "drain"], help=argparse.SUPPRESS)
    p.add_argument("--subject", help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        fn = phase_add if args.child == "add" else phase_restart_and_drain
        print(json.dumps(fn(args.subject, args.path, args)))
        return
    subjects = [s.strip() for s in args.peers.split(",") if s.strip()]
    unknown = [s for s in subjects if s not in SUBJECTS]
    if unknown:
        p.error(f"unknown subjects {unknown}; known: {', '.join(SUBJECTS)}")
    own_scratch = args.scratch is None
    args.scratch = args.scratch or tempfile.mkdtemp(prefix="bench-peers-")
    skipped = {s: m for s in subjects if (m := missing_package(s))}
    runs: dict[str, list[dict]] = {s: [] for s in subjects if s not in skipped}
    try:
        # Round-robin over the subjects, so that a change in the machine's load hits them alike.
        for r in range(args.repeat):
            for subject in runs:
                print(f"  round {r + 1}/{args.repeat}: {subject} ...", file=sys.stderr, flush=True)
                runs[subject].append(measure_once(subject, args))
    finally:
        if own_scratch:
            shutil.rmtree(args.scratch, ignore_errors=True)
    results = {s: best_of(r) for s, r in runs.items()}
    print_table(results, skipped, args)
    if args.json:
        print(json.dumps(results, indent=1))


def print_table(results: dict[str, dict], skipped: dict[str, str], args: argparse.Namespace) -> None:
    base = results.get(BASELINE)
    print(f"\n{args.positions:,} positions, add batches of {args.add_batch:,}, delays U[0, {args.delay_ms:,} ms), "
          f"drain batches of {args.drain_batch:,} under a moving clock ({args.regime}), best of {args.repeat}")
    head = (f"{'subject':<20} {'add M/s':>8} {'restart ms':>10} {'restart RSS MB':>14} {'drain M/s':>9} "
            f"{'B/position':>10}")
    if base:
        head += f" | vs {BASELINE}: {'add':>5} {'restart':>7} {'RSS':>6} {'drain':>6} {'bytes':>6}"
    print(head)
    print("-" * len(head))
    for subject, r in results.items():
        line = (f"{subject:<20} {r['add'] / 1e6:>8.2f} {r['restart_ms']:>10.1f} {r['rss_mb']:>14.1f} "
                f"{r['drain'] / 1e6:>9.2f} {r['bytes']:>10.1f}")
        if base:
            # peer / bucketstore: above 1 the peer has more of it (faster rates; slower restart, more memory, bytes)
            line += (f" | {'':>{len(BASELINE) + 4}}{r['add'] / base['add']:>5.2f} "
                     f"{r['restart_ms'] / base['restart_ms']:>7.2f} "
                     f"{r['rss_mb'] / base['rss_mb'] if base['rss_mb'] > 0 else float('nan'):>6.2f} "
                     f"{r['drain'] / base['drain']:>6.2f} {r['bytes'] / base['bytes']:>6.2f}")
        if r["drained"] < args.positions:
            line += f"  (drained only {r['drained']:,})"
        print(line)
    for subject, package in skipped.items():
        print(f"{subject:<20} skipped: package {package!r} is not installed (pip install {package})")
    if base:
        print(f"ratios: subject / {BASELINE} (rates above 1: faster than it; restart, RSS, bytes above 1: more than it)")
    cmd = " ".join(["python", "tools/bench/bench_peers.py"] + [a for a in sys.argv[1:]])
    print(f"command: {cmd}")


if __name__ == "__main__":
    main()
