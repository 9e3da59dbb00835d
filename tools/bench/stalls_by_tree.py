"""One background ``stalls`` run of bench_maintenance on another checkout's package, as a JSON line.

To compare two trees (this branch and main, say) on a loaded machine, run this in turn on each,
rounds alternating which goes first, and read the ratios of the same round: each run imports the
given tree's own ``tools/bench/bench_maintenance.py`` and package, times the steps it runs under
the tracker's lock (``--trace-holds``) and prints the other thread's add latencies beside them.
``--durability journal`` opens the store in journal mode (``sync_interval_ms=5``) whatever the
tree's benchmark supports (older ones open ``sealed`` only). A tree whose ``bench_stalls`` has no
``seal_at`` (e4041a5's, say) seals at ``per_bucket``: each ledger roll seals the whole ledger there,
as it does with any ``--seal-at`` up to ``--per-bucket``, so those runs make the same seals; a
larger ``--seal-at`` is refused for such a tree.

    python tools/bench/stalls_by_tree.py /work/main main --durability journal
    python tools/bench/stalls_by_tree.py . branch --durability journal
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sys
import tempfile

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tree", help="the checkout whose package and bench_maintenance.py run")
    p.add_argument("label", help="a name for the tree in the output")
    p.add_argument("--durability", choices=("sealed", "journal"), default="sealed")
    p.add_argument("--per-bucket", type=float, default=1e6, help="indexes per ledger (default 1e6)")
    p.add_argument("--seal-at", type=float, default=5e5, help="min_index_count_per_bucket (default 5e5)")
    p.add_argument("--total", type=float, default=7e6, help="indexes the writer adds (default 7e6)")
    args = p.parse_args()
    tree = os.path.abspath(args.tree)
    sys.path.insert(0, os.path.join(tree, "tools", "bench"))
    import bench_maintenance as bm  # the tree's own, which puts the tree's package first on the path

    if not os.path.abspath(bm.bucketstore.__file__).startswith(tree + os.sep):
        raise SystemExit(f"{bm.bucketstore.__file__} is not {tree}'s package")
    if args.durability == "journal":
        opened = bm.bucketstore.open

        def journal_open(path, durability="sealed", **kw):
            return opened(path, durability="journal", sync_interval_ms=5, **kw)

        bm.bucketstore.open = journal_open
    per_bucket, seal_at = int(args.per_bucket), int(args.seal_at)
    extra = {}
    if "seal_at" in inspect.signature(bm.bench_stalls).parameters:
        extra["seal_at"] = seal_at
    elif seal_at > per_bucket:
        raise SystemExit(f"{tree}'s bench_stalls seals at --per-bucket only: --seal-at {seal_at} is not "
                         "measurable there")
    bm.trace_holds()
    bm.TRACING.set()
    tmp = tempfile.mkdtemp(prefix="stalls-by-tree-")
    try:
        out = bm.bench_stalls(tmp, per_bucket, int(args.total), True, 2, **extra)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out.update(tree=args.label, durability=args.durability, load=round(os.getloadavg()[0], 2),
               holds={k: {"n": len(v), "median_ms": round(float(np.median(v)), 2), "max_ms": round(max(v), 2)}
                      for k, v in bm.HOLDS.items()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
