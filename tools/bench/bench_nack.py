"""Memory per negatively acknowledged message: NackTracker against a plain dict (PIP-393).

Workload (PIP-393's example): messages are nacked at ``rate`` per ms (default
10, i.e. 10,000/s) and come back after a fixed delay of one hour; message
``i`` is entry ``i % 50000`` of ledger ``10000 + i // 50000``, partition 0.
The ``batched`` rows nack every message of 10-message batches (batch index
0..9 of one entry, each with its own time); the ``random`` rows redeliver
after U[0, 1 h) instead of a fixed hour.

Rows (each built in a fresh subprocess; RSS delta after gc and malloc_trim):

* ``nack/8``, ``nack/0``: :class:`bucketstore.memory.nack.NackTracker` with 8 (the
  default, 256 ms buckets) or 0 precision bits;
* ``dict``: ``{(ledger, entry, batch_index, partition): redeliver_at}``, the
  Python counterpart of the pre-PIP-393 hash map.

Usage::

    python tools/bench/bench_nack.py                      # 1 M messages per row
    python tools/bench/bench_nack.py --messages 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", ".."))

from bench_timebucket import settle  # noqa: E402  (a sibling script, not a package)

T0 = 1_700_000_000_000
HOUR_MS = 3_600_000
ENTRIES_PER_LEDGER = 50_000
BATCH = 10


def _workload(n: int, rate: int, shape: str):
    rng = random.Random(7)
    for i in range(n):
        nacked_at = T0 + i // rate
        at = nacked_at + (rng.randrange(HOUR_MS) if shape == "random" else HOUR_MS)
        if shape == "batched":
            position, batch = divmod(i, BATCH)
        else:
            position, batch = i, -1
        yield 10_000 + position // ENTRIES_PER_LEDGER, position % ENTRIES_PER_LEDGER, batch, at


def worker(kind: str, n: int, rate: int, shape: str) -> dict:
    """Build one structure in this fresh process; report its RSS delta."""
    from bucketstore.memory.nack import NackTracker

    def build(count: int):
        if kind.startswith("nack/"):
            nacks = NackTracker(precision_bits=int(kind.split("/")[1]), clock=lambda: T0)
            add = nacks.add
            for ledger, entry, batch, at in _workload(count, rate, shape):
                add(ledger, entry, at, batch, 0)
            return nacks
        if kind == "dict":
            table = {}
            for ledger, entry, batch, at in _workload(count, rate, shape):
                table[(ledger, entry, batch, 0)] = at
            return table
        raise SystemExit(f"unknown kind {kind}")

    build(10_000)  # warm up caches and arenas that would otherwise be charged to the row
    before = settle()
    start = time.perf_counter()
    structure = build(n)
    elapsed = time.perf_counter() - start
    result = {"rss_bytes": settle() - before, "adds_per_s": n / elapsed}
    if hasattr(structure, "memory_bytes"):
        result["estimate_bytes"] = structure.memory_bytes()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages per row (default 1 M)")
    parser.add_argument("--rate", type=int, default=10, help="nacks per ms (default 10)")
    parser.add_argument("--worker", nargs=4, metavar=("KIND", "N", "RATE", "SHAPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, n, rate, shape = args.worker
        print(json.dumps(worker(kind, int(n), int(rate), shape)))
        return
    n = args.messages
    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# {n:,} nacked messages per row at {args.rate}/ms; RSS delta in a fresh process")
    print("| structure | workload | RSS MB | B/msg | estimate MB | add/s (M) |")
    print("|---|---|---|---|---|---|")
    for shape in ("fixed", "batched", "random"):
        for kind in ("nack/8", "nack/0", "dict"):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", kind, str(n),
                                  str(args.rate), shape], check=True, capture_output=True, text=True)
            r = json.loads(out.stdout)
            est = f"{r['estimate_bytes'] / 2**20:.2f}" if "estimate_bytes" in r else "-"
            print(f"| {kind} | {shape} | {r['rss_bytes'] / 2**20:.2f} | {r['rss_bytes'] / n:.3f} | {est} | "
                  f"{r['adds_per_s'] / 1e6:.2f} |", flush=True)


if __name__ == "__main__":
    main()
