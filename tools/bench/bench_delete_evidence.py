"""What reading entry 0 before deleting an unopened bucket costs a mark-delete.

A mark-delete that passes buckets the tracker knows only from their catalog summaries
reads each one's entry 0 and checks it against the summary before deleting any (issue 29:
no file goes on a summary's word alone). This builds one store of BUCKETS buckets of ROWS
rows (sealed mode), then, alternately on fresh copies, times ``mark_delete`` past all of
them with the check and with it disabled, and prints the medians and their ratio (one run:
compare the ratio, not the milliseconds) with the command line that reproduces them.

    python tools/bench/bench_delete_evidence.py --buckets 150 --rows 200 --repeat 6
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.tracker.tracker import BucketTracker
from bucketstore.testing.clock import FakeClock


def build(path: Path, buckets: int, rows: int) -> TrackerConfig:
    config = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=5_000,
                           max_num_buckets=-1)
    with bucketstore.open(path, "sealed", background=False) as store:
        t = store.tracker("t", config, FakeClock(0))
        for ledger in range(buckets):
            t.add_messages([(ledger, e, 10**9 + ledger * 10**6 + e) for e in range(rows)])
        t.add_message(buckets, 0, 2 * 10**9)  # rolls the last ledger into a bucket
        t.flush()
    return config


def time_mark_delete(path: Path, config: TrackerConfig, buckets: int) -> float:
    with bucketstore.open(path, "sealed", background=False) as store:
        t = store.tracker("t", config, FakeClock(0))
        assert t.stats()["unopened_buckets"] == buckets
        started = time.perf_counter()
        t.mark_delete(buckets, 0)
        seconds = time.perf_counter() - started
        assert t.stats()["immutable_buckets"] == 0
    return seconds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buckets", type=int, default=150)
    parser.add_argument("--rows", type=int, default=200, help="rows per bucket")
    parser.add_argument("--repeat", type=int, default=6)
    args = parser.parse_args(argv)
    checked = BucketTracker._verify_before_delete
    times: dict[str, list[float]] = {"with the check": [], "without": []}
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "template"
        config = build(template, args.buckets, args.rows)
        try:
            for i in range(args.repeat):
                for label in (list(times) if i % 2 == 0 else list(times)[::-1]):  # alternate who goes first
                    BucketTracker._verify_before_delete = checked if label == "with the check" \
                        else (lambda self, buckets: None)  # type: ignore[method-assign]
                    copy = Path(tmp) / f"run{i}"
                    shutil.copytree(template, copy)
                    times[label].append(time_mark_delete(copy, config, args.buckets))
                    shutil.rmtree(copy)
        finally:
            BucketTracker._verify_before_delete = checked  # type: ignore[method-assign]
    medians = {label: statistics.median(v) for label, v in times.items()}
    print(f"mark_delete past {args.buckets} unopened buckets of {args.rows} rows (median of {args.repeat}):")
    for label, seconds in medians.items():
        print(f"  {label:15} {seconds * 1000:8.1f} ms")
    print(f"  ratio           {medians['with the check'] / medians['without']:8.2f}")
    print("command: python tools/bench/bench_delete_evidence.py " + shlex.join(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
