"""Maintenance benchmarks: ledger rolls, and seals/merges off the caller's path.

Cases (each prints its figures; see README "Performance"):

* ``ledgers``: 100,000 one-message ledgers, in one ``add_messages`` call and
  with single ``add_message`` calls (every ledger rolls the mutable bucket; the
  seal gate must cost O(1) per roll, not a scan of the pending rows).

Run:  python tools/bench/bench_maintenance.py [--ledgers N] [--repeats R]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ledgers", type=float, default=1e5, help="one-message ledgers (default 1e5)")
    p.add_argument("--repeats", type=int, default=3, help="repeats per case; the best is reported")
    args = p.parse_args()
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    tmp = tempfile.mkdtemp(prefix="bench-maint-")
    try:
        n = int(args.ledgers)
        print(f"small ledgers ({n:,} one-message ledgers, 50,000-index seals):", bench_small_ledgers(n, tmp, args.repeats))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
