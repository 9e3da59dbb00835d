"""How long the catalog check (bucketstore.engine.catalog.lmdb_file.check_data_file) takes before every open.

The check walks, with pread, every page LMDB's trees reference; its cost grows with the catalog.
This builds real catalogs shaped like bucketstore's (bucket keys with their summaries, a few
tracker states big enough for overflow pages) at several sizes and prints the median of N checks
of each, with the command line that reproduces the figures.

    python tools/bench/bench_catalog_check.py --keys 1000,4000,40000 --repeat 30
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import sys
import tempfile
import time

import lmdb

from bucketstore.engine.catalog.lmdb_file import check_data_file

_KEY = b"sub-1\x00#pulsar.internal.delayed.bucket_%d_%d"


def build(path: str, keys: int) -> str:
    env = lmdb.open(path, map_size=1 << 30, max_dbs=4)
    meta, trackers, buckets, summaries = (env.open_db(n) for n in (b"meta", b"trackers", b"buckets", b"summaries"))
    rng = random.Random(7)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"2", db=meta)
        for i in range(keys):
            txn.put(_KEY % (i, i + 1), b"%d" % i, db=buckets)
            txn.put(_KEY % (i, i + 1), rng.randbytes(120), db=summaries)
        for i in range(20):
            txn.put(b"t%d" % i, rng.randbytes(9000), db=trackers)
    env.close()
    return os.path.join(path, "data.mdb")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", default="1000,4000,40000", help="bucket keys per catalog, comma-separated")
    p.add_argument("--repeat", type=int, default=30, help="checks per catalog (the median is printed)")
    args = p.parse_args()
    print("$ python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]]))
    print(f"{'keys':>8} {'file bytes':>12} {'median ms':>10} {'min ms':>8}")
    for keys in (int(k) for k in args.keys.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            data = build(tmp, keys)
            check_data_file(data)  # warm the page cache: the open that follows reads the same pages
            runs = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                check_data_file(data)
                runs.append(time.perf_counter() - start)
            runs.sort()
            print(f"{keys:>8} {os.path.getsize(data):>12,} {runs[len(runs) // 2] * 1e3:>10.2f} {runs[0] * 1e3:>8.2f}")


if __name__ == "__main__":
    main()
