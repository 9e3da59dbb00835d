"""Rebuild a tracker's sealed buckets from a Parquet export of its delayed messages.

    python tools/spark/rebuild_from_parquet.py EXPORT.parquet STORE --tracker sub-1 \
        [--min-index-count 50000] [--max-indexes-per-segment 5000] [--time-step-ms 300000] \
        [--append] [--master local[*]]

The export needs integer columns ``ledger_id``, ``entry_id`` and ``deliver_at``
(epoch ms). By default the tracker's buckets are replaced in one catalog commit
(``--append`` adds buckets beside them instead). The store must not be open
for writing by another process meanwhile.
"""

from __future__ import annotations

import argparse
import sys

from _session import start

import bucketstore


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export", help="Parquet file or directory")
    ap.add_argument("store", help="the store directory (created if missing)")
    ap.add_argument("--tracker", required=True)
    defaults = bucketstore.TrackerConfig()
    ap.add_argument("--min-index-count", type=int, default=defaults.min_index_count_per_bucket)
    ap.add_argument("--max-indexes-per-segment", type=int, default=defaults.max_indexes_per_segment)
    ap.add_argument("--time-step-ms", type=int, default=defaults.max_time_step_per_segment_ms)
    ap.add_argument("--append", action="store_true", help="add buckets instead of replacing the tracker's")
    ap.add_argument("--master", default="local[*]")
    args = ap.parse_args(argv)
    config = bucketstore.TrackerConfig(min_index_count_per_bucket=args.min_index_count,
                                       max_indexes_per_segment=args.max_indexes_per_segment,
                                       max_time_step_per_segment_ms=args.time_step_ms)

    spark = start(args.master, "bucketstore-rebuild")
    from bucketstore.spark import build_store

    try:
        df = spark.read.parquet(args.export)
        report = build_store(df, args.store, args.tracker, config,
                                               mode="append" if args.append else "overwrite")
    finally:
        spark.stop()
    verb = "added to" if args.append else "replaced"
    print(f"{args.export}: {report.input_rows:,} rows -> tracker {args.tracker!r} of {args.store}: "
          f"{report.buckets_before} buckets {verb}, now {report.buckets_after} "
          f"({report.partitions} tasks, {report.seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
