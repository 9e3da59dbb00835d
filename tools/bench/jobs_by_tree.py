"""One seal's or one merge's rate, this tree's benchmark code on another checkout's package, as a JSON line.

The companion of stalls_by_tree.py for the jobs themselves. Older trees' benchmarks cannot time
the issue-26 jobs (e4041a5's bench_merge merges 4 × 50,000 only), so this runs *this* tree's
``bench_seal.seal_once`` and ``bench_merge.merge_once`` on the given tree's package: both use only
the public API a tree of that age already had (``bucketstore.open(..., background=False)``,
``TrackerConfig``, ``add_messages``, ``buckets()``, ``stats()``), so the code timed is the package's
alone and each job runs on the caller's thread.

* ``seal``: one bucket of ``--indexes`` indexes with random delays up to 10 min (bench_seal's
  shape B, its default segments) sealed by the roll that follows it: M indexes/s.
* ``merge``: five ledgers of ``--indexes`` random-delay indexes sealed with ``max_num_buckets=4``
  and segments of ``--indexes // 4`` (bench_maintenance's stalls and steps config); the fifth seal
  merges the four oldest: M indexes/s of the merge (4 × ``--indexes`` over its time in ``stats()``).

    python tools/bench/jobs_by_tree.py /tmp/old before seal --indexes 1e6
    python tools/bench/jobs_by_tree.py . after merge --indexes 1e6
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tree", help="the checkout whose package runs")
    p.add_argument("label", help="a name for the tree in the output")
    p.add_argument("job", choices=("seal", "merge"))
    p.add_argument("--indexes", type=float, default=1e6, help="indexes per bucket (default 1e6)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    tree = os.path.abspath(args.tree)
    sys.path.insert(0, tree)
    import bucketstore  # the tree's: imported first, so the benchmarks below find it in sys.modules

    if not os.path.abspath(bucketstore.__file__).startswith(tree + os.sep):
        raise SystemExit(f"{bucketstore.__file__} is not {tree}'s package")
    sys.path.insert(1, HERE)
    n = int(args.indexes)
    if args.job == "seal":
        import bench_seal

        out = {"M_per_s": round(bench_seal.seal_once("B", n, args.seed), 3)}
    else:
        import bench_merge

        with tempfile.TemporaryDirectory(prefix="jobs-by-tree-") as tmp:
            r = bench_merge.merge_once(os.path.join(tmp, "s"), args.seed, n, n // 4)
        if r["merges"] != 1:
            raise SystemExit(f"{tree}: expected one merge, saw {r['merges']}")
        out = {"M_per_s": round(4 * n / r["merge_ms"] / 1000, 3), "merge_ms": round(r["merge_ms"], 1)}
    print(json.dumps({**out, "job": args.job, "indexes": n, "tree": args.label,
                      "load": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
