"""Maintenance benchmarks: ledger rolls, seals/merges and segment reads off the caller's path.

Every case runs the synchronous design (``background=False``) and the background
one side by side in the same process, ``--repeats`` times, interleaved, and prints
medians (and the spread) with the load average, so figures compare as ratios
within one run on a noisy machine.

* ``ledgers``: 100,000 one-message ledgers, in one ``add_messages`` call and
  with single ``add_message`` calls (every ledger rolls the mutable bucket; the
  seal gate must cost O(1) per roll, not a scan of the pending rows).
* ``stalls``: one writer adds ``--total`` indexes in batches of 10,000 over
  ledgers of ``--per-bucket`` indexes (each roll seals one bucket of that size;
  ``max_num_buckets=4`` makes a merge of 4 buckets) while a second thread adds one
  index per millisecond and times each call: the other thread's p50/p99/max, the
  writer's rate at the caller (seals included), the rate until everything is
  sealed (``flush``), the process's resident memory (at the start and its peak, sampled
  by the other thread) and the writer's backpressure waits. ``--seal-at`` sets
  ``min_index_count_per_bucket`` apart from the ledger size, ``--backlog-mb`` the budget,
  ``--durability journal`` journal mode (``sync_interval_ms=5``: a seal's install then takes a
  checkpoint too).
* ``rates``: ``--messages`` indexes (delays U[0, 1 h), 50,000 entries per ledger,
  the default config: a 50,000-index seal per ledger) added with single calls,
  then delivered with ``get_scheduled_messages(10000)``; then added again in
  batches of 10,000 on a fresh tracker. Rates at the caller, seals included.
* ``readahead``: a store holding ``--messages`` sealed indexes (default segments
  of 5,000) is reopened and drained with ``get_scheduled_messages(1000)``, the
  caller pausing ``--gap-ms`` between calls (its dispatch): per-call latency
  p50/p99/max and the read-ahead hits, with read-ahead off and on (both with
  synchronous seals, so read-ahead is the only difference).
* ``steps``: one thread, synchronous: the time of each step of a ``--per-bucket`` seal
  (liveness, sort, encode of segments and bitmaps, write, fsync) and of a 4-bucket merge
  (reads, index lookups, sort, encode, write), wall and the process's CPU (the work done,
  which a loaded machine inflates less than the wall time), then each step alone on a thread beside a
  pure-Python one: the share of that thread's rate it keeps says what releases the GIL.
  ``--pieces on,off,all`` runs each repeat with the defaults' second thread for big jobs (pieces
  of their reads, sort and encode taken by it and the job's own thread: merges of big buckets),
  without it, and with it for every job of 200,000 rows or more, interleaved, and prints each.
  Steps done in pieces on either thread (a merge's reads and liveness, the segment encode) add
  up both threads' wall and CPU (each its own thread's), so they may exceed the step around
  them; the steps around them count the process's CPU. *pieces: CPU two cores could overlap* is, summed over the
  job's shared steps, the smaller of the two threads' CPU in each; the job's CPU less it
  estimates its time on two free cores.
  ``stepgil`` prints that last table alone, with for each step the wall time of two calls at once
  on two threads over one call's (1.0: they overlap wholly; 2.0: the GIL runs them one by one).
* ``gil``: is a seal's encode GIL-bound? A pure-Python counting thread runs
  alone, then while a ``--per-bucket`` seal runs on the maintenance thread; the
  ratio of its rates is the share of the CPU the seal left to Python code (1.0:
  the seal holds the GIL never; 0.5: always, with two cores).

Run:  python tools/bench/bench_maintenance.py [--cases ledgers,stalls,rates,readahead,steps,stepgil,gil] [--repeats R]
      [--ledgers N] [--per-bucket N] [--total N] [--messages N] [--gap-ms MS] [--seal-at N] [--backlog-mb MB]
      [--pieces on,off,all] [--durability sealed|journal] [--trace-holds]
The issue-26 workload: --cases stalls --per-bucket 1e6 --seal-at 5e5 --total 7e6
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import bucketstore  # noqa: E402
from bucketstore import TrackerConfig  # noqa: E402
from bucketstore.engine.maintenance import merge_pipeline, seal_pipeline  # noqa: E402
from bucketstore.engine.tracker import tracker as tracker_module  # noqa: E402
from bucketstore.format.row_sort import sort_rows  # noqa: E402
from bucketstore.format.snapshot import build_bucket  # noqa: E402

EPOCH = 1_700_000_000_000


def bench_small_ledgers(n: int, tmp: str, background: bool) -> dict[str, float]:
    """Seconds to add ``n`` one-message ledgers, in one batch call and with single calls."""
    ledgers = np.arange(1, n + 1, dtype=np.uint64)
    entries = np.zeros(n, dtype=np.uint64)
    at = EPOCH + 60_000 + ledgers
    out: dict[str, float] = {"background": background}
    for mode in ("batch", "single"):
        path = os.path.join(tmp, f"ledgers-{mode}-{background}")
        with bucketstore.open(path, durability="sealed", background=background) as store:
            tracker = store.tracker("t", TrackerConfig(), clock=lambda: EPOCH)
            started = time.perf_counter()
            if mode == "batch":
                tracker.add_messages((ledgers, entries, at))
            else:
                add = tracker.add_message
                for ledger, t in zip(ledgers.tolist(), at.tolist()):
                    add(ledger, 0, t)
            out[f"{mode}_seconds"] = round(time.perf_counter() - started, 3)
            assert tracker.number_of_delayed_messages == n
        shutil.rmtree(path)
    return out


#: Lock-holding steps of the background pipelines, timed when ``--trace-holds`` is given: label -> ms list.
HOLDS: dict[str, list[float]] = {}
#: Set while a background run is measured (the wrapped steps run in synchronous runs too).
TRACING = threading.Event()


def trace_holds() -> None:
    """Time the steps that run under a tracker's lock in the background design (wraps them in this
    process only): the freeze at a roll, the seal's and the merge's plan and install."""
    def wrap(cls: type, name: str, label: str) -> None:
        original = getattr(cls, name)

        def timed(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                if TRACING.is_set():
                    HOLDS.setdefault(label, []).append((time.perf_counter() - started) * 1000)

        setattr(cls, name, timed)

    wrap(tracker_module.BucketTracker, "_start_seal", "roll: freeze + seal plan")
    wrap(seal_pipeline.SealJob, "_install", "seal install")  # (the part under the lock)
    wrap(seal_pipeline.SealJob, "_before_lock", "seal commit (no tracker lock)")
    wrap(merge_pipeline.MergeJob, "__init__", "merge plan")
    wrap(merge_pipeline.MergeJob, "_install", "merge install")  # (its unlinks come after the lock)
    if hasattr(merge_pipeline.MergeJob, "uncommit"):  # (older trees commit a merge under the lock)
        wrap(merge_pipeline.MergeJob, "_before_lock", "merge commit (no tracker lock)")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bench_stalls(tmp: str, per_bucket: int, total: int, background: bool,
                 max_pending: int = 2, seal_at: int | None = None, backlog_mb: float | None = None,
                 durability: str = "sealed") -> dict[str, float]:
    cfg = TrackerConfig(min_index_count_per_bucket=seal_at or per_bucket, max_num_buckets=4,
                        max_indexes_per_segment=per_bucket // 4)
    budget = {} if backlog_mb is None else {"max_backlog_bytes": int(backlog_mb * 2 ** 20)}
    if durability == "journal":
        budget["sync_interval_ms"] = 5
    gc.collect()
    rss_start = _rss_bytes()
    rss_peak = [rss_start]
    path = os.path.join(tmp, f"stalls-{background}")
    clock = lambda: EPOCH  # noqa: E731 - nothing falls due during the run
    rng = np.random.default_rng(7)
    latencies: list[float] = []
    stop = threading.Event()
    current = [1]  # the writer's ledger: the other thread adds to it too (entry ids past the writer's)
    with bucketstore.open(path, durability=durability, background=background, max_pending_maintenance=max_pending,
                          **budget) as store:
        tracker = store.tracker("t", cfg, clock=clock)

        def other() -> None:
            entry = 0
            while not stop.is_set():
                started = time.perf_counter()
                tracker.add_message(current[0], per_bucket + entry, EPOCH + 3_600_000 + entry)
                latencies.append(time.perf_counter() - started)
                entry += 1
                rss_peak[0] = max(rss_peak[0], _rss_bytes())
                time.sleep(0.001)

        thread = threading.Thread(target=other)
        thread.start()
        batch = 10_000
        started, cpu_started = time.perf_counter(), time.process_time()
        for lo in range(0, total, batch):
            seq = np.arange(lo, lo + batch, dtype=np.uint64)
            ledgers = 1 + seq // np.uint64(per_bucket)
            current[0] = int(ledgers[-1])
            at = EPOCH + 60_000 + rng.integers(0, 3_600_000, batch).astype(np.uint64)
            tracker.add_messages((ledgers, seq % np.uint64(per_bucket), at))
        caller = time.perf_counter() - started
        tracker.flush()
        while tracker.stats()["maintenance"]["queued"]:  # merges that the last seals started
            tracker.flush()
        sealed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        stop.set()
        thread.join()
        stats = tracker.stats()
    shutil.rmtree(path)
    lat = np.array(latencies) * 1000
    return {"background": background, "other_p50_ms": round(float(np.percentile(lat, 50)), 3),
            "other_p99_ms": round(float(np.percentile(lat, 99)), 3), "other_max_ms": round(float(lat.max()), 3),
            "other_calls": len(lat), "caller_M_per_s": round(total / caller / 1e6, 3),
            "all_sealed_M_per_s": round(total / sealed / 1e6, 3),
            # The process's CPU until all is installed (every thread): on a loaded machine, what the
            # run cost, where its wall time also holds the waits for a core.
            "cpu_s": round(cpu, 3), "seals": stats["create"]["succeeded"],
            "merges": stats["merge"]["succeeded"], "rss_start_mb": round(rss_start / 2 ** 20, 1),
            "rss_peak_mb": round(rss_peak[0] / 2 ** 20, 1),
            # (absent before backpressure by memory: the script also runs against older trees)
            "backpressure_waits": stats.get("backpressure", {}).get("waits", -1),
            "backpressure_wait_s": round(stats.get("backpressure", {}).get("wait_seconds", -1), 3)}


def _workload(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n messages published 1 per 0.1 ms, delays U[0, 1 h), 50,000 entries per ledger (bench_tracker's)."""
    rng = np.random.default_rng(seed)
    seq = np.arange(n, dtype=np.uint64)
    at = EPOCH + 1000 + seq // np.uint64(10) + rng.integers(0, 3_600_000, n).astype(np.uint64)
    return seq // np.uint64(50_000), seq % np.uint64(50_000), at


def _timed(fn) -> float:
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started
    finally:
        gc.enable()


def bench_rates(tmp: str, n: int, background: bool) -> dict[str, float]:
    """Single adds, deliveries and batch adds at the caller (seals included), M indexes/s."""
    ledgers, entries, at = _workload(n)
    cols = (ledgers, entries, at)
    rows = list(zip(ledgers.tolist(), entries.tolist(), at.tolist()))
    out: dict[str, float] = {"background": background}
    clock = Clock(EPOCH)
    path = os.path.join(tmp, f"rates-{background}")
    with bucketstore.open(path, durability="sealed", background=background) as store:
        t = store.tracker("t", TrackerConfig(), clock)
        add = t.add_message

        def single() -> None:
            for l, e, a in rows:
                add(l, e, a)

        out["single_add_M_per_s"] = round(n / _timed(single) / 1e6, 3)
        t.wait_for_maintenance()
        clock.now = EPOCH + 10 ** 9
        got = [0]

        def drain() -> None:
            while True:
                batch = t.get_scheduled_messages(10_000)
                if not batch:
                    return
                got[0] += len(batch)

        out["deliver_M_per_s"] = round(n / _timed(drain) / 1e6, 3)
        assert got[0] == n, got
    shutil.rmtree(path)
    clock.now = EPOCH
    with bucketstore.open(path, durability="sealed", background=background) as store:
        t = store.tracker("t", TrackerConfig(), clock)

        def batches() -> None:
            for lo in range(0, n, 10_000):
                t.add_messages(tuple(c[lo:lo + 10_000] for c in cols))

        caller = _timed(batches)
        started = time.perf_counter()
        t.wait_for_maintenance()
        out["batch_add_M_per_s"] = round(n / caller / 1e6, 3)
        out["batch_until_sealed_M_per_s"] = round(n / (caller + time.perf_counter() - started) / 1e6, 3)
        out["seals"] = t.stats()["create"]["succeeded"]
    shutil.rmtree(path)
    return out


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _segment_config(segment: int) -> TrackerConfig:
    """The default config with segments of up to ``segment`` indexes (and buckets of 10 segments or more)."""
    if segment == TrackerConfig().max_indexes_per_segment:
        return TrackerConfig()
    return TrackerConfig(max_indexes_per_segment=segment, max_time_step_per_segment_ms=3_600_000,
                         min_index_count_per_bucket=max(50_000, 10 * segment))


def make_sealed_store(path: str, n: int, segment: int) -> None:
    """A store holding ``n`` sealed indexes of the ``rates`` workload."""
    ledgers, entries, at = _workload(n, seed=2)
    with bucketstore.open(path, durability="sealed") as store:
        t = store.tracker("t", _segment_config(segment), Clock(EPOCH))
        for lo in range(0, n, 10_000):
            t.add_messages((ledgers[lo:lo + 10_000], entries[lo:lo + 10_000], at[lo:lo + 10_000]))
        t.add_message(int(ledgers[-1]) + 1, 0, EPOCH + 10 ** 8)  # rolls the last ledger: all sealed


def _evict(directory: str) -> None:
    """Drop a directory's ledger files from the page cache (cold reads, as after a restart)."""
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def bench_read_ahead(path: str, n: int, segment: int, read_ahead: bool, gap_ms: float,
                     cold: bool = False) -> dict[str, float]:
    """Reopen the sealed store and drain it 1,000 at a time: per-call latency (ms)."""
    latencies = []
    copy = path + "-copy"
    shutil.copytree(path, copy)  # draining deletes the buckets
    if cold:
        _evict(os.path.join(copy, "ledgers"))
    clock = Clock(EPOCH)  # nothing due at recovery: it skips no segment
    with bucketstore.open(copy, durability="sealed", read_ahead=read_ahead) as store:
        t = store.tracker("t", _segment_config(segment), clock)
        clock.now = EPOCH + 10 ** 9
        got = 0
        gap = gap_ms / 1000
        while True:
            started = time.perf_counter()
            batch = t.get_scheduled_messages(1000)
            latencies.append(time.perf_counter() - started)
            if not batch:
                break
            got += len(batch)
            if gap:
                time.sleep(gap)
        ra = t.stats()["read_ahead"]
        load = t.stats()["load"]
        delete = t.stats()["delete"]
    shutil.rmtree(copy)
    assert got == n, got
    lat = np.array(latencies) * 1000
    return {"read_ahead": read_ahead, "calls": len(lat), "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p99_ms": round(float(np.percentile(lat, 99)), 3), "max_ms": round(float(lat.max()), 3),
            "busy_M_per_s": round(float(n / lat.sum() * 1000 / 1e6), 3), "hits": ra["hits"], "misses": ra["misses"],
            "late": ra["late"], "load_ms_per_segment": round(load["latency_ms"] / max(1, load["succeeded"]), 3),
            "bucket_deletes": delete["succeeded"],
            "delete_ms_each": round(delete["latency_ms"] / max(1, delete["succeeded"]), 3)}


def _spin(seconds: float | None, stop: threading.Event | None, out: list[float]) -> None:
    """Pure-Python work: count loop iterations for ``seconds`` (or until ``stop``); rate into ``out``."""
    count = 0
    started = time.perf_counter()
    deadline = started + seconds if seconds is not None else None
    while True:
        for _ in range(1000):
            count += 1
        if (stop is not None and stop.is_set()) or (deadline is not None and time.perf_counter() >= deadline):
            break
    out.append(count / (time.perf_counter() - started))


def bench_gil(tmp: str, per_bucket: int, repeats: int) -> dict[str, float]:
    """Another thread's pure-Python rate during a background seal, over its rate alone."""
    cfg = TrackerConfig(min_index_count_per_bucket=per_bucket, max_num_buckets=-1)
    path = os.path.join(tmp, "gil")
    rng = np.random.default_rng(3)
    ratios, seal_alone, seal_beside = [], [], []
    with bucketstore.open(path, durability="sealed", background=True) as store:
        t = store.tracker("t", cfg, Clock(EPOCH))
        for r in range(repeats * 2):
            ledger = r + 1
            entries = np.arange(per_bucket, dtype=np.uint64)
            at = EPOCH + 60_000 + rng.integers(0, 3_600_000, per_bucket).astype(np.uint64)
            t.add_messages((np.full(per_bucket, ledger, np.uint64), entries, at))
            before = t.stats()["create"]
            spin = r % 2 == 1  # alternate: seals alone and seals beside a spinning thread
            rates: list[float] = []
            stop = threading.Event()
            spinner = threading.Thread(target=_spin, args=(None, stop, rates)) if spin else None
            if spinner:
                spinner.start()
            t.add_message(ledger + 1, 0, EPOCH + 10 ** 8)  # rolls: the seal runs on the worker
            t.wait_for_maintenance()
            if spinner:
                stop.set()
                spinner.join()
            after = t.stats()["create"]
            seal_s = after["latency_ms"] * after["succeeded"] / 1000 - before["latency_ms"] * before["succeeded"] / 1000
            if spin:
                seal_beside.append(seal_s)
                solo: list[float] = []
                _spin(seal_s, None, solo)  # the same thread's rate alone, right after, as long
                ratios.append(rates[0] / solo[0])
            else:
                seal_alone.append(seal_s)
    shutil.rmtree(path)
    return {"other_thread_rate_during_seal_over_alone": round(float(np.median(ratios)), 3),
            "ratios": [round(x, 3) for x in ratios],
            "seal_s_alone": round(float(np.median(seal_alone)), 3),
            "seal_s_beside_spinner": round(float(np.median(seal_beside)), 3)}


#: Per-step wall seconds of the pipelines' parts, filled while ``STEPS_ON`` is set: (kind, step) -> [s].
STEPS: dict[tuple[str, str], list[float]] = {}
#: The same steps' CPU seconds (the process's, so a thread beside the step counts too): on a
#: loaded machine, the work a step does, where its wall time also holds the waits for a core.
STEPS_CPU: dict[tuple[str, str], list[float]] = {}
STEPS_ON = threading.Event()
_STEP_KIND = threading.local()


def trace_steps() -> None:
    """Time the parts of a seal and a merge (wraps them in this process only): the rows'
    liveness, the sort, the encode (segments and bitmaps), the write and each fsync, a
    merge's segment reads and its index lookups."""
    from bucketstore.engine.maintenance import bucket_job
    from bucketstore.engine.queue import index_set, liveness
    from bucketstore.engine.buckets import sealed_bucket
    from bucketstore.format import fs as fs_module, snapshot

    def timed(label: str, fn, piece: bool = False):
        # A step done in pieces on either thread counts its own thread's CPU (the process's would
        # count the other thread's pieces too); the others the process's, side thread included.
        clock = time.thread_time if piece else time.process_time

        def run(*args, **kwargs):
            started, cpu = time.perf_counter(), clock()
            try:
                return fn(*args, **kwargs)
            finally:
                if STEPS_ON.is_set():
                    kind = getattr(_STEP_KIND, "kind", "?")
                    STEPS.setdefault((kind, label), []).append(time.perf_counter() - started)
                    STEPS_CPU.setdefault((kind, label), []).append(clock() - cpu)
        return run

    def job_kind(cls, kind: str) -> None:
        original = cls._work

        def work(self):
            _STEP_KIND.kind = kind
            try:
                return original(self)
            finally:
                _STEP_KIND.kind = "?"
        cls._work = work

    # The whole job's work first, then the kind around it (the timer reads the kind).
    seal_pipeline.SealJob._work = timed("job work (all)", seal_pipeline.SealJob._work)
    merge_pipeline.MergeJob._work = timed("job work (all)", merge_pipeline.MergeJob._work)
    job_kind(seal_pipeline.SealJob, "seal")
    job_kind(merge_pipeline.MergeJob, "merge")
    for module in (seal_pipeline, merge_pipeline):
        name = "sort_row_parts" if hasattr(module, "sort_row_parts") else "sort_rows"  # (older trees)
        setattr(module, name, timed("sort", getattr(module, name)))
        if hasattr(module, "drop_repeats"):  # (a merge drops none: its sources hold each position once)
            module.drop_repeats = timed("drop repeats", module.drop_repeats)
    snapshot.encode_segments = timed("encode segments", snapshot.encode_segments)
    from bucketstore.format import shared_work
    if hasattr(shared_work, "encode_segments"):  # (the pieces of a big bucket, on either thread)
        shared_work.encode_segments = timed("encode segments", shared_work.encode_segments, piece=True)
    snapshot.serialized_bitmaps = timed("encode bitmaps", snapshot.serialized_bitmaps)
    bucket_job.build_bucket = timed("encode (all)", bucket_job.build_bucket)
    bucket_job.write_bucket = timed("write (all, fsyncs included)", bucket_job.write_bucket)
    fs_module.FileSystem.fsync = timed("fsync", fs_module.FileSystem.fsync)
    fs_module.FileSystem.fsync_dir = timed("fsync dir", fs_module.FileSystem.fsync_dir)
    liveness.FrozenMutableLiveness.mask = timed("liveness", liveness.FrozenMutableLiveness.mask)
    index_set.DelayedIndexSet.present_mask = timed("liveness", index_set.DelayedIndexSet.present_mask, piece=True)
    # Pieces on two threads: each thread's CPU in each share() call, for the two-core estimate.
    from bucketstore.format import row_sort, shared_work
    original = shared_work.share
    for module in (row_sort, snapshot, merge_pipeline, shared_work):  # (shared_work: its encode_in_pieces)
        if hasattr(module, "share"):
            module.share = _accounted(original)
    # (read_segment calls read_segments, which a merge calls: timed once.)
    reads = "read_segments" if hasattr(sealed_bucket.SealedBucket, "read_segments") else "read_segment"
    setattr(sealed_bucket.SealedBucket, reads, timed("read + decode segments", getattr(sealed_bucket.SealedBucket, reads),
                                                   piece=True))


def _accounted(share):
    """``share`` that adds, per job kind, the CPU seconds the two threads' overlap could save:
    of each call, the smaller of the two threads' CPU (the pieces each ran, the caller's
    ``first`` included). A job's CPU less that is its time on two free cores, were the pieces'
    work free of the GIL (what ``stepgil`` measures)."""
    def accounted(pieces, run_beside, *, first=None):
        spent: dict[str, float] = {}
        lock = threading.Lock()
        kind = getattr(_STEP_KIND, "kind", "?")

        def timed(fn):
            def run():
                started = time.thread_time()
                before, _STEP_KIND.kind = getattr(_STEP_KIND, "kind", "?"), kind  # (the steps of the job's pieces)
                try:
                    return fn()
                finally:
                    _STEP_KIND.kind = before
                    with lock:
                        name = threading.current_thread().name
                        spent[name] = spent.get(name, 0.0) + time.thread_time() - started
            return run

        try:
            return share([timed(p) for p in pieces], run_beside, first=timed(first) if first is not None else None)
        finally:
            if STEPS_ON.is_set():
                values = list(spent.values()) + [0.0, 0.0]
                STEPS_CPU.setdefault((kind, OVERLAP), []).append(min(values[:2]) if len(spent) > 1 else 0.0)
                STEPS.setdefault((kind, OVERLAP), []).append(0.0)
    return accounted


#: The pseudo-step under which ``_accounted`` keeps the CPU the pieces' overlap could save.
OVERLAP = "pieces: CPU two cores could overlap"


def bench_steps(tmp: str, per_bucket: int) -> dict[str, object]:
    """One thread (synchronous maintenance): 6 ledgers of ``per_bucket`` random-delay indexes make
    6 seals; ``max_num_buckets=4`` merges 4 of them once there are 5. The time of each step, per job."""
    cfg = TrackerConfig(min_index_count_per_bucket=per_bucket, max_num_buckets=4,
                        max_indexes_per_segment=per_bucket // 4)
    rng = np.random.default_rng(11)
    path = os.path.join(tmp, "steps")
    STEPS.clear()
    STEPS_CPU.clear()
    with bucketstore.open(path, durability="sealed", background=False) as store:
        t = store.tracker("t", cfg, Clock(EPOCH))
        STEPS_ON.set()  # (only calls inside a job's work are counted)
        for ledger in range(1, 7):
            at = EPOCH + 60_000 + rng.integers(0, 3_600_000, per_bucket).astype(np.uint64)
            t.add_messages((np.full(per_bucket, ledger, np.uint64), np.arange(per_bucket, dtype=np.uint64), at))
        t.add_message(7, 0, EPOCH + 10 ** 8)  # rolls the last ledger
        STEPS_ON.clear()
        stats = t.stats()
    shutil.rmtree(path)
    jobs = {"seal": stats["create"]["succeeded"], "merge": stats["merge"]["succeeded"]}
    out: dict[str, object] = {"jobs": jobs}
    for (kind, label), values in sorted(STEPS.items()):
        if kind in jobs and jobs[kind]:
            # (wall ms, CPU ms) per job: CPU above wall is the second core at work.
            out[f"{kind}: {label}"] = (sum(values) / jobs[kind] * 1000,
                                       sum(STEPS_CPU[(kind, label)]) / jobs[kind] * 1000)
    for kind in jobs:
        whole, overlap = out.get(f"{kind}: job work (all)"), out.get(f"{kind}: {OVERLAP}")
        if whole is not None:
            # The job's CPU less what its pieces could overlap: its time on two free cores, about.
            out[f"{kind}: job work on two free cores (estimate)"] = (
                0.0, whole[1] - (overlap[1] if overlap is not None else 0.0))
    return out


def pieces(mode: str) -> None:
    """Which seals and merges work in pieces on two threads (their reads, sort and encode):
    ``on`` those the defaults choose (``SPLIT_ROWS`` of row_sort, snapshot and merge_pipeline:
    merges of big buckets), ``off`` none, ``all`` every job of 200,000 rows or more."""
    from bucketstore.format import row_sort, snapshot
    for module in (row_sort, snapshot, merge_pipeline):
        default = getattr(module, "_BENCH_SPLIT_ROWS", module.SPLIT_ROWS)
        module._BENCH_SPLIT_ROWS = default
        module.SPLIT_ROWS = {"on": default, "off": 1 << 62, "all": 200_000}[mode]


def print_steps(per_bucket: int, runs: dict[str, list[dict[str, object]]]) -> None:
    """Per step, the median over repeats of each variant's wall and CPU ms per job (and M rows/s of wall)."""
    rows = {"seal": per_bucket, "merge": 4 * per_bucket}
    variants = list(runs)
    labels = sorted({k for rs in runs.values() for r in rs for k in r if k != "jobs"})
    print(f"steps ({per_bucket:,}-index random-delay seals and a {4 * per_bucket:,}-index merge; ms per job, median "
          f"of {len(next(iter(runs.values())))}; jobs {next(iter(runs.values()))[0]['jobs']}):")
    print("  " + "step".ljust(46) + "".join(f"{v + ' wall':>22}{'cpu':>8}" for v in variants))
    for label in labels:
        cells = []
        for v in variants:
            got = [r[label] for r in runs[v] if label in r]
            if not got:
                cells.append(f"{'-':>22}{'-':>8}")
                continue
            wall = float(np.median([w for w, _ in got]))
            cpu = float(np.median([c for _, c in got]))
            if not wall:  # a figure of CPU only (the overlap, the estimate): its rate is of CPU time
                rate = rows[label.split(":")[0]] / cpu / 1000 if cpu and "estimate" in label else 0.0
                cells.append(f"{'-':>9} ({rate:6.1f} M/s){cpu:8.1f}" if rate else f"{'-':>22}{cpu:8.1f}")
                continue
            rate = rows[label.split(":")[0]] / wall / 1000
            cells.append(f"{wall:9.1f} ({rate:6.1f} M/s){cpu:8.1f}")
        print("  " + label.ljust(46) + "".join(cells))


def _step_gil_ratio(fn, repeats: int, window: float = 0.4) -> tuple[float, float]:
    """``fn`` alone (median seconds), and a pure-Python thread's rate while another thread calls
    ``fn`` over and over for ``window`` s, over its rate alone for as long right after
    (1.0: ``fn`` never holds the GIL; 0.5: always, on two cores)."""
    alone = [_timed(fn) for _ in range(repeats)]
    ratios = []
    for _ in range(repeats):
        rates: list[float] = []
        stop = threading.Event()

        def calls() -> None:
            deadline = time.perf_counter() + window
            while time.perf_counter() < deadline:
                fn()

        spinner = threading.Thread(target=_spin, args=(None, stop, rates))
        worker = threading.Thread(target=calls)
        started = time.perf_counter()
        spinner.start()
        worker.start()
        worker.join()
        stop.set()
        spinner.join()
        solo: list[float] = []
        _spin(time.perf_counter() - started, None, solo)
        ratios.append(rates[0] / solo[0])
    return float(np.median(alone)), float(np.median(ratios))


def _step_sleeper_lateness(fn, window: float = 0.4) -> tuple[float, float]:
    """A thread sleeping 1 ms at a time while another calls ``fn`` over and over for ``window``
    s: how late it wakes, p99 and max ms. A C call that holds the GIL for longer than the
    sleep shows as lateness (as a single ``add_message`` waiting behind it would); the
    switch interval (5 ms) bounds what pure Python in ``fn`` adds. The machine's own
    scheduling delays are in it too: compare with ``idle``."""
    late: list[float] = []
    stop = threading.Event()

    def sleeper() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            time.sleep(0.001)
            late.append(time.perf_counter() - started - 0.001)

    def calls() -> None:
        deadline = time.perf_counter() + window
        while time.perf_counter() < deadline:
            fn()

    threads = [threading.Thread(target=sleeper), threading.Thread(target=calls)]
    for t in threads:
        t.start()
    threads[1].join()
    stop.set()
    threads[0].join()
    ms = np.array(late) * 1000
    return float(np.percentile(ms, 99)), float(ms.max())


def bench_step_gil(tmp: str, per_bucket: int, repeats: int) -> dict[str, str]:
    """Which steps of a seal and a merge release the GIL: each run on a thread beside a pure-Python one."""
    from bucketstore.engine.buckets.sealed_bucket import SealedBucket
    from bucketstore.engine.queue.index_set import DelayedIndexSet
    from bucketstore.engine.threads.side_thread import run_beside
    from bucketstore.format.fs import FileSystem
    from bucketstore.format.row_sort import sort_row_parts
    from bucketstore.format.snapshot import (cut_segments, drop_repeats, encode_segments, serialized_bitmaps,
                                             write_bucket)

    class NoSync(FileSystem):
        def fsync(self, fd: int) -> None:
            pass

        def fsync_dir(self, path: str) -> None:
            pass

    rng = np.random.default_rng(12)
    ts = EPOCH + 60_000 + rng.integers(0, 3_600_000, per_bucket).astype(np.uint64)
    ledgers, entries = np.ones(per_bucket, np.uint64), np.arange(per_bucket, dtype=np.uint64)
    rows = sort_rows(ts, ledgers, entries)
    starts = np.array([lo for lo, _ in cut_segments(rows[0], 300_000, per_bucket // 4)], dtype=np.int64)
    meta, payloads = build_bucket(1, 1, *rows, time_step_ms=300_000, max_indexes_per_segment=per_bucket // 4)
    directory = os.path.join(tmp, "gil-steps")
    os.makedirs(directory)
    ids = iter(range(1, 10 ** 6))
    path = write_bucket(directory, 10 ** 6, meta, payloads)
    bucket = SealedBucket(path, 10 ** 6, meta, os.path.getsize(path))
    steps = {
        "idle (sleeps)": lambda: time.sleep(0.01),
        "sort_rows": lambda: sort_rows(ts, ledgers, entries),
        "drop_repeats": lambda: drop_repeats(*rows),
        "encode segments (numpy + zstd)": lambda: encode_segments(*rows, starts, compress=True, codec="zstd",
                                                                  check=False),
        "encode bitmaps (pyroaring)": lambda: serialized_bitmaps(rows[1], rows[2]),
        "write, no fsync": lambda: write_bucket(directory, next(ids), meta, payloads, fs=NoSync()),
        "write + fsyncs": lambda: write_bucket(directory, next(ids), meta, payloads),
        "read + decode segments": lambda: [bucket.read_segment(k) for k in range(1, bucket.segment_count + 1)],
    }
    # A merge's sort: four sources, each one sorted run of four segments.
    merge_parts = []
    for source in range(4):
        src = sort_rows(EPOCH + 60_000 + rng.integers(0, 3_600_000, per_bucket).astype(np.uint64),
                        np.full(per_bucket, source + 1, np.uint64), np.arange(per_bucket, dtype=np.uint64))
        quarter = -(-per_bucket // 4)
        merge_parts += [tuple(c[k:k + quarter] for c in src) for k in range(0, per_bucket, quarter)]
    live = DelayedIndexSet()
    live.add_many(rows[1], rows[2], rows[0])
    steps.update({
        "merge sort, 4 x 4 sorted segments, one thread": lambda: sort_row_parts(merge_parts, sorted_parts=True),
        "merge sort, 4 x 4 sorted segments, pieces on two threads": lambda: sort_row_parts(merge_parts, sorted_parts=True,
                                                                             run_beside=run_beside),
        "liveness lookups (present_mask, 4 segments)": lambda: [
            live.present_mask(rows[1][k:k + per_bucket // 4], rows[2][k:k + per_bucket // 4])
            for k in range(0, per_bucket, per_bucket // 4)],
    })
    out = {}
    for name, fn in steps.items():
        seconds, ratio = _step_gil_ratio(fn, repeats)
        p99, worst = _step_sleeper_lateness(fn)
        pair = _step_pair_ratio(fn, repeats)
        out[name] = (f"{seconds * 1000:.1f} ms, other thread keeps {ratio:.2f}, a 1-ms sleeper beside it "
                     f"wakes late by p99 {p99:.1f} / max {worst:.1f} ms, two at once take {pair:.2f}x one's wall")
    shutil.rmtree(directory)
    return out


def _step_pair_ratio(fn, repeats: int) -> float:
    """The wall time of ``fn`` called on two threads at once over one call's (median of
    ``repeats`` each, interleaved): 1.0 when the two calls overlap wholly (the GIL released
    throughout, two free cores), 2.0 when they run one after the other (the GIL held)."""
    one, two = [], []
    for _ in range(repeats):
        one.append(_timed(fn))

        def pair() -> None:
            threads = [threading.Thread(target=fn) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        two.append(_timed(pair))
    return float(np.median(two) / np.median(one))


def _encode(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray) -> tuple:
    """A seal's CPU-heavy part: cut, encode and compress a sorted bucket (module level: picklable)."""
    return build_bucket(1, 1, ts, ledgers, entries, time_step_ms=300_000, max_indexes_per_segment=5000)


def bench_encode_where(per_bucket: int, repeats: int) -> dict[str, float]:
    """The seal's encode on a thread vs in a process-pool worker, alone and beside a pure-Python
    thread: the encode's wall time and the other thread's rate (over its rate alone)."""
    rng = np.random.default_rng(4)
    ts, ledgers, entries = sort_rows(EPOCH + rng.integers(0, 3_600_000, per_bucket).astype(np.uint64),
                                     np.ones(per_bucket, np.uint64), np.arange(per_bucket, dtype=np.uint64))
    out: dict[str, list[float]] = {k: [] for k in ("thread_alone_s", "thread_beside_s", "thread_other_ratio",
                                                   "process_alone_s", "process_beside_s", "process_other_ratio")}
    ctx = multiprocessing.get_context("forkserver")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        pool.submit(_encode, ts[:10], ledgers[:10], entries[:10]).result()  # warm: imports done

        def in_thread() -> None:
            worker = threading.Thread(target=_encode, args=(ts, ledgers, entries))
            worker.start()
            worker.join()

        def in_process() -> None:
            pool.submit(_encode, ts, ledgers, entries).result()

        for _ in range(repeats):
            for name, run in (("thread", in_thread), ("process", in_process)):
                out[f"{name}_alone_s"].append(_timed(run))
                rates: list[float] = []
                stop = threading.Event()
                spinner = threading.Thread(target=_spin, args=(None, stop, rates))
                spinner.start()
                beside = _timed(run)
                stop.set()
                spinner.join()
                solo: list[float] = []
                _spin(beside, None, solo)
                out[f"{name}_beside_s"].append(beside)
                out[f"{name}_other_ratio"].append(rates[0] / solo[0])
    return {k: round(float(np.median(v)), 3) for k, v in out.items()}


def _median_of(results: list[dict]) -> dict:
    """Per numeric field, the median over repeats (and [min, max] beside it)."""
    out: dict = {}
    for key, value in results[0].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            out[key] = value
            continue
        values = [r[key] for r in results]
        out[key] = round(float(np.median(values)), 3)
        if len(values) > 1 and min(values) != max(values):
            out[key + "_range"] = [min(values), max(values)]
    return out


def _paired_ratios(sync: list[dict], background: list[dict]) -> dict:
    """Per numeric field, the median over repeats of background / synchronous, each pair measured
    back to back (so a load spike on the shared machine hits both sides of a pair alike)."""
    out = {}
    for key, value in sync[0].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or key == "seals":
            continue
        pairs = [b[key] / a[key] for a, b in zip(sync, background) if a[key]]
        if pairs:
            out[key] = round(float(np.median(pairs)), 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="ledgers,stalls,rates,readahead,gil", help="comma-separated cases to run")
    p.add_argument("--repeats", type=int, default=3, help="repeats per case (medians reported)")
    p.add_argument("--ledgers", type=float, default=1e5, help="one-message ledgers (default 1e5)")
    p.add_argument("--per-bucket", type=float, default=1e6, help="indexes per sealed bucket (default 1e6)")
    p.add_argument("--total", type=float, default=6e6, help="indexes the stalls writer adds (default 6e6)")
    p.add_argument("--messages", type=float, default=1e6, help="indexes for rates and readahead (default 1e6)")
    p.add_argument("--gap-ms", type=float, default=1.0, help="readahead: the caller's pause between calls")
    p.add_argument("--segments", default="5000,50000", help="readahead: max_indexes_per_segment values")
    p.add_argument("--cold", action="store_true", help="readahead: evict the ledger files from the page cache")
    p.add_argument("--max-pending", type=int, default=2, help="stalls: max_pending_maintenance (default 2)")
    p.add_argument("--seal-at", type=float, default=None,
                   help="stalls: min_index_count_per_bucket (default: --per-bucket; a seal happens at a ledger roll)")
    p.add_argument("--backlog-mb", type=float, default=None, help="stalls: max_backlog_bytes in MiB (default 256)")
    p.add_argument("--durability", choices=("sealed", "journal"), default="sealed",
                   help="stalls: the store's durability (journal: sync_interval_ms=5)")
    p.add_argument("--trace-holds", action="store_true",
                   help="stalls: time the steps the background design runs under the tracker's lock")
    p.add_argument("--pieces", default="on",
                   help="stalls, steps: variants among on (the defaults: big merges read, sort and encode in "
                        "pieces on two threads), off (no job does), all (every job of 200,000 rows or more does), "
                        "comma-separated: interleaved, with ratios")
    p.add_argument("--switch-interval-ms", type=float, default=None,
                   help="sys.setswitchinterval for the run (default: Python's 5 ms)")
    args = p.parse_args()
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    print("load average at start:", os.getloadavg(), "switch interval (s):", sys.getswitchinterval())
    tmp = tempfile.mkdtemp(prefix="bench-maint-")
    try:
        cases = args.cases.split(",")
        modes = (False, True)
        if "ledgers" in cases:
            n = int(args.ledgers)
            runs = {m: [bench_small_ledgers(n, tmp, m) for _ in range(args.repeats)] for m in modes}
            for m in modes:
                print(f"small ledgers ({n:,} one-message ledgers):", _median_of(runs[m]))
        if "stalls" in cases:
            if args.trace_holds:
                trace_holds()
            runs = {(m, h): [] for h in args.pieces.split(",") for m in modes}
            for i in range(args.repeats):
                for m, h in (list(runs) if i % 2 == 0 else list(runs)[::-1]):  # (the order turned, as for steps)
                    if m and args.trace_holds:
                        TRACING.set()
                    pieces(h)
                    runs[(m, h)].append(bench_stalls(tmp, int(args.per_bucket), int(args.total), m, args.max_pending,
                                                     int(args.seal_at) if args.seal_at else None, args.backlog_mb,
                                                     args.durability))
                    TRACING.clear()
            pieces("on")
            for m, h in runs:
                print(f"stalls ({int(args.total):,} indexes, {int(args.per_bucket):,}-index seals, merges; "
                      f"pieces {h}, {args.durability}):", _median_of(runs[(m, h)]))
            for h in args.pieces.split(","):
                print(f"stalls, pieces {h}, background / synchronous (median of paired ratios):",
                      _paired_ratios(runs[(False, h)], runs[(True, h)]))
            chosen = args.pieces.split(",")
            for other in (v for v in chosen if v != "off"):
                if "off" in chosen:
                    for m in modes:
                        print(f"stalls, {'background' if m else 'synchronous'}, pieces {other} / off (median of "
                              "paired ratios):", _paired_ratios(runs[(m, "off")], runs[(m, other)]))
            if HOLDS:
                print("stalls, background: lock-holding steps (ms, all repeats): ",
                      {k: {"n": len(v), "median": round(float(np.median(v)), 1), "max": round(max(v), 1)}
                       for k, v in HOLDS.items()})
        if "rates" in cases:
            runs = {m: [] for m in modes}
            for _ in range(args.repeats):
                for m in modes:
                    runs[m].append(bench_rates(tmp, int(args.messages), m))
            for m in modes:
                print(f"rates ({int(args.messages):,} indexes, 50,000-index seals):", _median_of(runs[m]))
            print("rates, background / synchronous (median of paired ratios):", _paired_ratios(*runs.values()))
        if "readahead" in cases:
            n = int(args.messages)
            for segment in (int(x) for x in args.segments.split(",")):
                path = os.path.join(tmp, f"sealed-{segment}")
                make_sealed_store(path, n, segment)
                for gap in sorted({0.0, args.gap_ms}):
                    runs = {m: [] for m in modes}
                    for _ in range(args.repeats):
                        for m in modes:
                            runs[m].append(bench_read_ahead(path, n, segment, m, gap, args.cold))
                    for m in modes:
                        print(f"get_scheduled_messages(1000) over {n:,} sealed indexes, segments of {segment:,}, "
                              f"{gap} ms between calls{', cold cache' if args.cold else ''}:", _median_of(runs[m]))
                shutil.rmtree(path)
        if "steps" in cases:
            trace_steps()
            n = int(args.per_bucket)
            variants = {"pieces " + v: v for v in args.pieces.split(",")}
            steps = {v: [] for v in variants}
            for i in range(args.repeats):
                # Interleaved, the order turned every other repeat: a load change, or the process's
                # first (cold) run, hits every variant alike.
                for v, mode in (list(variants.items()) if i % 2 == 0 else list(variants.items())[::-1]):
                    pieces(mode)
                    steps[v].append(bench_steps(tmp, n))
            pieces("on")
            print_steps(n, steps)
        if "steps" in cases or "stepgil" in cases:
            n = int(args.per_bucket)
            print(f"steps: what releases the GIL ({n:,} rows):")
            for name, line in bench_step_gil(tmp, n, args.repeats).items():
                print(f"  {name}: {line}")
        if "gil" in cases:
            print(f"gil ({int(args.per_bucket):,}-index seals on the maintenance thread):",
                  bench_gil(tmp, int(args.per_bucket), args.repeats))
            print(f"gil: the encode of {int(args.per_bucket):,} indexes on a thread or in a process-pool worker:",
                  bench_encode_where(int(args.per_bucket), args.repeats))
        print("load average at end:", os.getloadavg())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
