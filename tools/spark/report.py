"""What is due when, and how big the buckets are: CSV tables and a plot of a store.

    python tools/spark/report.py STORE [--out report/] [--trackers a,b] [--master local[*]]

Writes to ``--out``:

* ``due_per_hour.csv``: tracker, hour (UTC, ISO 8601), indexes due in that hour;
* ``buckets.csv``: tracker, ledger range, file, bytes, segments, indexes;
* ``segments.csv``: tracker, file, segment, indexes, first and last due time;
* ``due_per_hour.png``: the histogram, when matplotlib is installed (it is not
  part of the ``spark`` extra: ``pip install matplotlib`` to get the plot).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from datetime import datetime, timezone

from _session import start

HOUR_MS = 3_600_000


def write_csv(path: str, header: list[str], rows: list[list[object]]) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(header)
        out.writerows(rows)
    print(f"wrote {path} ({len(rows)} rows)")


def iso_hour(hour: int) -> str:
    return datetime.fromtimestamp(hour * HOUR_MS / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:00Z")


def plot(path: str, due: list[list[object]]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipped the plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(10, 4))
    for tracker in sorted({row[0] for row in due}):
        points = [(datetime.fromisoformat(row[1].replace("Z", "+00:00")), row[2]) for row in due if row[0] == tracker]
        ax.bar([p[0] for p in points], [p[1] for p in points], width=1 / 24, align="edge", label=tracker, alpha=0.7)
    ax.set_xlabel("hour (UTC)")
    ax.set_ylabel("indexes due")
    ax.legend()
    fig.autofmt_xdate()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("--out", default="report")
    ap.add_argument("--trackers", help="comma-separated (default: all)")
    ap.add_argument("--master", default="local[*]")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    spark = start(args.master, "bucketstore-report")
    from pyspark.sql import functions as F

    try:
        reader = spark.read.format("bucketstore")
        if args.trackers:
            reader = reader.option("trackers", args.trackers)
        rows = reader.load(args.store).cache()
        due = (rows.groupBy("tracker", F.floor(F.col("timestamp") / HOUR_MS).alias("hour"))
               .count().orderBy("tracker", "hour").collect())
        segments = (rows.groupBy("tracker", "bucket_start_ledger", "bucket_end_ledger", "ledger_file", "segment")
                    .agg(F.count("*").alias("indexes"), F.min("timestamp").alias("first_due"),
                         F.max("timestamp").alias("last_due"))
                    .orderBy("tracker", "bucket_start_ledger", "segment").collect())
    finally:
        spark.stop()

    due_rows = [[r.tracker, iso_hour(r.hour), r["count"]] for r in due]
    write_csv(os.path.join(args.out, "due_per_hour.csv"), ["tracker", "hour_utc", "indexes"], due_rows)
    write_csv(os.path.join(args.out, "segments.csv"),
              ["tracker", "ledger_file", "segment", "indexes", "first_due_ms", "last_due_ms"],
              [[r.tracker, r.ledger_file, r.segment, r.indexes, r.first_due, r.last_due] for r in segments])
    buckets: dict[tuple, list[int]] = {}
    for r in segments:
        key = (r.tracker, r.bucket_start_ledger, r.bucket_end_ledger, r.ledger_file)
        totals = buckets.setdefault(key, [0, 0])
        totals[0] += 1
        totals[1] += r.indexes
    write_csv(os.path.join(args.out, "buckets.csv"),
              ["tracker", "start_ledger", "end_ledger", "ledger_file", "bytes", "segments", "indexes"],
              [[*key, os.path.getsize(key[3]), segs, n] for key, (segs, n) in buckets.items()])
    plot(os.path.join(args.out, "due_per_hour.png"), due_rows)
    total = sum(n for _, (_, n) in buckets.items())
    print(f"{args.store}: {total:,} indexes in {len(buckets)} buckets, due over {len(due_rows)} tracker-hours")
    return 0


if __name__ == "__main__":
    sys.exit(main())
