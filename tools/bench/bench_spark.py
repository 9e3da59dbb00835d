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

Before the timed runs, a warm-up builds the same two frames at a tenth of the
rows and reads once, so that the first timed build does not pay for loading
and compiling code paths the JVM has not run yet. The median build's CPU time
is split by part (JIT compiler, JVM garbage collector, JVM task threads, the
rest of the JVM, the Python workers, the driver; see ``cpu_split``), and each
run also builds 20,000 rows of the same frame: the cost of a build whatever
its size (two Spark jobs, the planning and commit workers), and the rate per
CPU-second beyond it.
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
#: Rows of the small build that measures what a build costs whatever its size.
FIXED_ROWS = 20_000
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


#: What a thread or process of the tree counts as, for the CPU split (JVM threads by their names).
SPLIT = ("JIT compiler", "JVM GC", "JVM tasks", "JVM other", "Python workers", "driver")


def _thread_part(name: str) -> str:
    """The part of a JVM thread, from its name as /proc gives it (cut to 15 characters)."""
    if "CompilerThre" in name:
        return "JIT compiler"
    if name.startswith(("GC Thread", "G1 ", "VM Thread")):
        return "JVM GC"
    if name.startswith(("Executor task", "shuffle-exchang")):
        return "JVM tasks"
    return "JVM other"


def cpu_split() -> dict[str, float]:
    """CPU seconds (user + system) this process tree has spent so far, by part (:data:`SPLIT`).

    Read from /proc: each process's own time plus that of children it reaped;
    the total is what :func:`cpu_seconds` returns. The JVM's time is split by
    thread name (compiler, garbage collector, task threads, and the rest:
    scheduler, query planning, class loading, py4j); time of threads that have
    exited counts as "other" (a compiler thread the JVM stops when idle moves
    its time there). Every Python process under the JVM (the worker daemon,
    its forked workers, planner and commit workers) counts as a Python worker.
    """
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    java: set[int] = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    raw = f.read()
            except OSError:
                continue
            fields = raw.rsplit(")", 1)[1].split()
            stats[int(name)] = fields
            children.setdefault(int(fields[1]), []).append(int(name))
            if raw[raw.index("(") + 1:raw.rindex(")")] == "java":
                java.add(int(name))
    split = dict.fromkeys(SPLIT, 0.0)
    todo = [(os.getpid(), "driver")]
    while todo:
        pid, part = todo.pop()
        if pid not in stats:
            continue
        fields = stats[pid]  # utime, stime, cutime, cstime are fields 14-17 of stat (11-14 after the name)
        own, reaped = sum(int(v) for v in fields[11:13]) / tick, sum(int(v) for v in fields[13:15]) / tick
        if pid in java:
            split["Python workers"] += reaped
            threads = _jvm_threads(pid, tick)
            for key, value in threads.items():
                split[key] += value
            # The process's own time also holds that of threads gone since: counted as "other".
            split["JVM other"] += max(0.0, own - sum(threads.values()))
            todo += [(child, "Python workers") for child in children.get(pid, [])]
        else:
            split[part] += own + reaped
            todo += [(child, part) for child in children.get(pid, [])]
    return split


def _jvm_threads(pid: int, tick: int) -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        key = _thread_part(name)
        out[key] = out.get(key, 0.0) + sum(int(v) for v in raw.rsplit(")", 1)[1].split()[11:13]) / tick
    return out


def cpu_seconds() -> float:
    """CPU time (user + system, reaped children included) of this process and all its descendants."""
    return sum(cpu_split().values())


def split_since(before: dict[str, float]) -> dict[str, float]:
    now = cpu_split()
    return {key: now[key] - before[key] for key in SPLIT}


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
    def frame(ids):
        return ids.select((F.col("id") / ENTRIES_PER_LEDGER).cast("long").alias("ledger_id"),
                          (F.col("id") % ENTRIES_PER_LEDGER).alias("entry_id"),
                          (F.lit(T0) + (F.col("id") * 2_654_435_761) % DAY_MS).alias("deliver_at"))

    def scramble(rows):  # a bijection of 0..rows-1 (7919 is prime and divides no size used here)
        return spark.range(rows).select(((F.col("id") * 7919) % rows).alias("id"))

    # Warm-up jobs, not timed: the same frames as the timed ones (log order and scrambled, a tenth
    # of the rows) and a read, so that the JVM has loaded and compiled the code paths it times.
    warmup = os.path.join(args.dir, "warmup")
    small = max(200_000, n // 10)
    bspark.build_store(frame(spark.range(small)), warmup, "warmup", config)
    if small % 7919:
        bspark.build_store(frame(scramble(small)), warmup, "warmup-scrambled", config)
    spark.read.format("bucketstore").load(warmup).agg(F.max("timestamp")).first()
    df = frame(spark.range(n))
    scrambled = frame(scramble(n))  # scatters each ledger's rows over every partition
    tiny = frame(spark.range(FIXED_ROWS))
    builds, reads, build_cpu, read_cpu, mixed, mixed_cpu = [], [], [], [], [], []
    splits, fixed = [], []
    for r in range(args.repeats):
        store = os.path.join(args.dir, f"store-{r}")
        before = cpu_split()
        report = bspark.build_store(df, store, "bench", config)
        splits.append(split_since(before))
        build_cpu.append(sum(splits[-1].values()))
        builds.append(report.seconds)
        # The same job on a handful of rows: what a build costs whatever its size.
        cpu = cpu_seconds()
        bspark.build_store(tiny, os.path.join(args.dir, f"tiny-{r}"), "bench", config)
        fixed.append(cpu_seconds() - cpu)
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
        print(f"run {r + 1}: build {builds[-1]:.2f} s ({build_cpu[-1]:.2f} CPU s{how}; "
              f"{FIXED_ROWS:,} rows {fixed[-1]:.2f} CPU s){tail}, "
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
    median_run = int(np.argsort(build_cpu)[(len(build_cpu) - 1) // 2])
    print("CPU split of the Spark build (median run): "
          + ", ".join(f"{key} {splits[median_run][key]:.2f}" for key in SPLIT))
    fixed_cpu = float(np.median(fixed))
    beyond = (f"{n / (build_cpu_s - fixed_cpu) / 1e6:.2f} M/CPU-s" if build_cpu_s > fixed_cpu
              else "n/a (the build cost no more than the small one)")
    print(f"fixed cost of a Spark build ({FIXED_ROWS:,} rows, same frame): {fixed_cpu:.2f} CPU s; "
          f"rate beyond it: {beyond}")
    line("read, one process (BucketFile)", n, read_s, 1, read_1cpu)
    line(f"read, Spark local[{args.cores}]", n, spark_read_s, args.cores, read_cpu_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
