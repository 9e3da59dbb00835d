"""How long a seal's install holds the tracker's lock in journal mode, and its journal checkpoint.

Journal mode (``sync_interval_ms=5``: adds group-committed), background maintenance: a writer adds
``--total`` random-delay indexes in batches of 10,000 on ledgers of 1 M, sealed at 500,000
(``max_num_buckets=4``). The seal's install (``SealJob._install``, under the lock) is timed, and so
are the journal's checkpoint calls: ``Journal.checkpoint`` (the whole checkpoint, under the lock,
on trees before issue 26's off-lock checkpoint; at open and ``clear`` after it) and
``Journal.write_checkpoint`` (the file written without the lock, where it exists). Prints one JSON
line per run; ``--tree`` runs another checkout's package (main's, say), to compare in turn.

    python tools/bench/bench_seal_checkpoint.py --total 4e6 [--tree /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

_TREE = sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv[:-1] else \
    os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.abspath(_TREE))

import bucketstore  # noqa: E402
from bucketstore import TrackerConfig  # noqa: E402
from bucketstore.engine.durability import journal as journal_module  # noqa: E402
from bucketstore.engine.maintenance import seal_pipeline

EPOCH = 1_700_000_000_000


def run(total: int, per_ledger: int = 1_000_000, batch: int = 10_000) -> dict[str, object]:
    holds: dict[str, list[float]] = {}

    def wrap(cls: type, name: str, label: str) -> None:
        original = getattr(cls, name)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                holds.setdefault(label, []).append((time.perf_counter() - started) * 1000)

        setattr(cls, name, timed)

    wrap(seal_pipeline.SealJob, "_install", "seal install (under the lock)")
    wrap(journal_module.Journal, "checkpoint", "Journal.checkpoint")
    if hasattr(journal_module.Journal, "write_checkpoint"):
        wrap(journal_module.Journal, "write_checkpoint", "Journal.write_checkpoint (no lock)")
    rng = np.random.default_rng(5)
    cfg = TrackerConfig(min_index_count_per_bucket=per_ledger // 2, max_num_buckets=4,
                        max_indexes_per_segment=per_ledger // 4)
    path = tempfile.mkdtemp()
    started = time.perf_counter()
    try:
        with bucketstore.open(path, durability="journal", background=True, sync_interval_ms=5) as store:
            t = store.tracker("t", cfg, lambda: EPOCH)
            for i in range(total // batch):
                ledger, first = 1 + (i * batch) // per_ledger, (i * batch) % per_ledger
                at = EPOCH + 60_000 + rng.integers(0, 3_600_000, batch).astype(np.uint64)
                t.add_messages((np.full(batch, ledger, np.uint64), np.arange(first, first + batch, dtype=np.uint64), at))
            t.flush()
    finally:
        shutil.rmtree(path, ignore_errors=True)
    out: dict[str, object] = {"seconds": round(time.perf_counter() - started, 2)}
    for label, values in holds.items():
        out[label] = {"n": len(values), "median_ms": round(float(np.median(values)), 2),
                      "max_ms": round(max(values), 2)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--total", type=float, default=4e6, help="indexes the writer adds (default 4e6)")
    p.add_argument("--tree", default=_TREE, help="the checkout whose package is imported (default: this one)")
    args = p.parse_args()
    print(json.dumps({"package": os.path.dirname(bucketstore.__file__), **run(int(args.total))}))


if __name__ == "__main__":
    main()
