"""Spark reader and bulk builder against the single-process path, in one run.

    python tools/bench/bench_spark.py [--rows 10000000] [--cores 2] [--repeats 3] [--dir /tmp/bench-spark]

Input: ``rows`` delayed indexes in log order (ledgers of 10,000 entries, as an
export from a topic arrives) with delivery times spread over a day. Measured:

* bulk build, Spark: ``build_store`` from a DataFrame generated in the JVM
  (so the input is not the bottleneck), end to end: the planning aggregation,
  Arrow transfer, sealing, one catalog commit. The input's partitions are in
  ledger order, so no row is shuffled (``BuildReport.in_place``);
* bulk build, Spark, scrambled: the same rows in an order that interleaves
  ledgers across partitions (position ``id * 7919 mod rows``), which takes the
  shuffle to the planned tasks;
* bulk build, one process: the same rows cut into the same buckets with
  ``build_bucket`` + ``write_bucket`` (numpy in, no Spark);
* reading, Spark: ``spark.read.format("bucketstore")`` of the built store, every
  column consumed (a sum per column, so nothing is pruned);
* reading, one process: every segment of every bucket with ``BucketFile``.

The Spark build and read run ``repeats`` times each (the machine may be
shared); every run is printed and the median is the reported figure. Rates
per core divide by the ``local[N]`` core count: Spark's JVM and its Python
workers share those cores. On a shared machine the wall clock also counts
other programs' time, so each line also gives the CPU seconds this process
tree (driver, JVM, Python workers; from /proc, Linux only) spent, and the
rate per CPU-second: the per-core rate on a machine that is all ours.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np

import bucketstore
from bucketstore.format.snapshot import BucketFile, build_bucket, write_bucket
from bucketstore.spark.bucketing import Rows, cut_buckets, order_positions, time_order

ENTRIES_PER_LEDGER = 10_000
DAY_MS = 86_400_000
T0 = 1_700_000_000_000


def single_process_build(rows: int, directory: str, config: bucketstore.TrackerConfig) -> tuple[float, float]:
    """Seconds (wall, CPU) to seal ``rows`` indexes in this process, cut exactly as the Spark tasks cut them."""
    ids = np.arange(rows, dtype=np.uint64)
    data = Rows(ids // np.uint64(ENTRIES_PER_LEDGER), ids % np.uint64(ENTRIES_PER_LEDGER),
                np.uint64(T0) + (ids * np.uint64(2_654_435_761)) % np.uint64(DAY_MS))
    os.makedirs(directory)
    started, cpu = time.perf_counter(), time.process_time()
    data = order_positions(data)
    for n, cut in enumerate(cut_buckets(data.ledgers, config.min_index_count_per_bucket)):
        part = time_order(data.take(slice(cut.lo, cut.hi)))
        meta, payloads = build_bucket(cut.start_ledger, cut.end_ledger, part.timestamps, part.ledgers, part.entries,
                                      time_step_ms=config.max_time_step_per_segment_ms,
                                      max_indexes_per_segment=config.max_indexes_per_segment)
        write_bucket(directory, n, meta, payloads)
    return time.perf_counter() - started, time.process_time() - cpu


def single_process_read(directory: str) -> tuple[int, float, float]:
    started, cpu = time.perf_counter(), time.process_time()
    total = 0
    for name in sorted(os.listdir(directory)):
        with BucketFile(os.path.join(directory, name)) as bf:
            for k in range(1, bf.segment_count + 1):
                seg = bf.read_segment(k)
                total += len(seg)
                # Touch every column, as the Spark reader does when it converts them.
                seg.timestamps.view(np.int64).sum(), seg.ledger_ids.view(np.int64).sum()
                seg.entry_ids.view(np.int64).sum()
    return total, time.perf_counter() - started, time.process_time() - cpu


def cpu_seconds() -> float:
    """CPU time (user + system, reaped children included) of this process and all its descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(name)] = fields
            children.setdefault(int(fields[1]), []).append(int(name))
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        if pid in stats:  # utime, stime, cutime, cstime are fields 14-17 of stat (11-14 after the name)
            total += sum(int(v) for v in stats[pid][11:15])
    return total / tick


def session(cores: int):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(f"local[{cores}]").appName("bench_spark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(cores)).config("spark.driver.memory", "4g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N] (default 2)")
    ap.add_argument("--repeats", type=int, default=1, help="Spark builds and reads to time (median reported)")
    ap.add_argument("--dir", default="/tmp/bench-spark")
    args = ap.parse_args(argv)
    print("command:", " ".join([os.path.basename(sys.executable), *sys.argv]))
    shutil.rmtree(args.dir, ignore_errors=True)
    config = bucketstore.TrackerConfig()
    n = args.rows

    single_dir = os.path.join(args.dir, "single")
    build_s, build_1cpu = single_process_build(n, single_dir, config)
    read_n, read_s, read_1cpu = single_process_read(single_dir)
    assert read_n == n

    import bucketstore.spark as bspark
    from pyspark.sql import functions as F
    spark = session(args.cores)
    bspark.register(spark)
    # Warm-up jobs (a build and a read) start the JVM's and the Python workers' caches; they are not timed.
    warmup = os.path.join(args.dir, "warmup")
    bspark.build_store(spark.range(200_000).select((F.col("id") / ENTRIES_PER_LEDGER).cast("long").alias("ledger_id"),
                                                   (F.col("id") % ENTRIES_PER_LEDGER).alias("entry_id"),
                                                   F.lit(T0).alias("deliver_at")),
                       warmup, "warmup", config)
    spark.read.format("bucketstore").load(warmup).agg(F.max("timestamp")).first()
    def frame(ids):
        return ids.select((F.col("id") / ENTRIES_PER_LEDGER).cast("long").alias("ledger_id"),
                          (F.col("id") % ENTRIES_PER_LEDGER).alias("entry_id"),
                          (F.lit(T0) + (F.col("id") * 2_654_435_761) % DAY_MS).alias("deliver_at"))

    df = frame(spark.range(n))
    # A bijection of 0..n-1 (7919 is prime and divides no n used here) that scatters each ledger's rows.
    scrambled = frame(spark.range(n).select(((F.col("id") * 7919) % n).alias("id")))
    builds, reads, build_cpu, read_cpu, mixed, mixed_cpu = [], [], [], [], [], []
    for r in range(args.repeats):
        store = os.path.join(args.dir, f"store-{r}")
        cpu = cpu_seconds()
        report = bspark.build_store(df, store, "bench", config)
        build_cpu.append(cpu_seconds() - cpu)
        builds.append(report.seconds)
        if n % 7919:
            cpu = cpu_seconds()
            other = bspark.build_store(scrambled, os.path.join(args.dir, f"scrambled-{r}"), "bench", config)
            mixed_cpu.append(cpu_seconds() - cpu)
            mixed.append(other.seconds)
            assert other.buckets_after == report.buckets_after
            shutil.rmtree(os.path.join(args.dir, f"scrambled-{r}"))
        started, cpu = time.perf_counter(), cpu_seconds()
        sums = spark.read.format("bucketstore").load(store).agg(
            F.count("*").alias("n"), F.sum(F.col("timestamp") - T0), F.sum("ledger_id"), F.sum("entry_id"),
            F.sum("segment"), F.max("tracker"), F.max("ledger_file")).first()
        reads.append(time.perf_counter() - started)
        read_cpu.append(cpu_seconds() - cpu)
        assert sums.n == n, sums
        tail = f", scrambled build {mixed[-1]:.2f} s ({mixed_cpu[-1]:.2f} CPU s)" if mixed else ""
        how = ", in place" if getattr(report, "in_place", False) else ""  # the field is absent before 2026-11
        print(f"run {r + 1}: build {builds[-1]:.2f} s ({build_cpu[-1]:.2f} CPU s{how}){tail}, "
              f"read {reads[-1]:.2f} s ({read_cpu[-1]:.2f} CPU s)", flush=True)
        if r + 1 < args.repeats:
            shutil.rmtree(store)
    spark.stop()
    spark_build_s, spark_read_s = float(np.median(builds)), float(np.median(reads))
    build_cpu_s, read_cpu_s = float(np.median(build_cpu)), float(np.median(read_cpu))

    def line(what: str, rows: int, seconds: float, cores: int, cpu: float | None = None) -> None:
        rate = rows / seconds
        tail = f" {cpu:8.2f} CPU s {rows / cpu / 1e6:6.2f} M/CPU-s" if cpu else ""
        print(f"{what:<34} {rows:>12,} rows {seconds:8.2f} s {rate / 1e6:7.2f} M/s "
              f"{rate / cores / 1e6:7.2f} M/s/core{tail}")

    print(f"cores={args.cores}  repeats={args.repeats} (Spark lines: median)")
    print(f"rows={n:,}  buckets={report.buckets_after}  partitions={report.partitions}  "
          f"min_index_count_per_bucket={config.min_index_count_per_bucket}  "
          f"max_indexes_per_segment={config.max_indexes_per_segment}")
    line("bulk build, one process", n, build_s, 1, build_1cpu)
    line(f"bulk build, Spark local[{args.cores}]", n, spark_build_s, args.cores, build_cpu_s)
    if mixed:
        line("  the same, scrambled input", n, float(np.median(mixed)), args.cores, float(np.median(mixed_cpu)))
    line("read, one process (BucketFile)", n, read_s, 1, read_1cpu)
    line(f"read, Spark local[{args.cores}]", n, spark_read_s, args.cores, read_cpu_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
