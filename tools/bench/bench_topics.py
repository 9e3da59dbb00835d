"""Topics (issue 25): what S subscriptions of one topic cost, against one subscription and a lone tracker.

For N indexes (``--size``) and S subscriptions (``--subscriptions``), in one run, so the figures
are ratios on the same machine at the same moment:

* disk: the topic environment's bytes with S subscriptions / with one (target <= 1.1), and a
  lone ``BucketTracker``'s ledger files and catalog for scale;
* memory at open: Python allocations (tracemalloc) to open the store, the topic and its S
  subscriptions, against one (target: <= 1.1x + 64 KB per subscription);
* drain: seconds per index for one subscription taking batches of 1,000 while the S keep up
  (each takes its batch in turn), against a topic with one subscription and a lone tracker
  (target >= 0.9x, as a rate);
* add: seconds per ``add_message`` into a topic with S subscriptions, against one and against a
  lone tracker (target <= 1.1x), the three taking turns 1,000 adds at a time;
* stats: the per-subscription figures of a topic of N rows, a tenth of them due, S - 1
  subscriptions caught up and one stalled (it holds them): ``describe_topics`` (what ``stats``
  and a Prometheus scrape read), ``topic.stats()`` and ``metrics.prometheus_text`` against the
  pass over every row per subscription they replaced (``bucketstore.testing.topic_oracle``);
* mark_delete: on that topic, what a mark-delete over half the positions untracks, counted by
  columns (``engine/topics/topic_marks.py``) against the row-by-row count it replaced, for the
  stalled subscription and one caught up, and the stalled one's whole call;
* rss: the process's resident memory after each phase (build, open, drain, stats) and its peak
  during it: the indexes are made a chunk at a time, so this is the engines' (and the stats
  line's reference pass, which streams the rows).

Journal mode with ``sync_interval_ms=50`` everywhere: group commit, so the figures are the
engines' work rather than fsyncs.

    python tools/bench/bench_topics.py --size 20000 --subscriptions 100
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shlex
import sys
import tempfile
import time
import tracemalloc

import numpy as np

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.topics.topic_file import topics_directory
from bucketstore.engine.topics.topic_marks import tracked_in_range
from bucketstore.engine.topics.topic_reader import describe_topics
from bucketstore.metrics import prometheus_text
from bucketstore.testing.topic_oracle import scan_figures

CFG = TrackerConfig(tick_time_ms=0)
START = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> int:
        return self.now


def columns(lo: int, hi: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indexes ``lo`` to ``hi`` of the ``n`` added, as (ledgers, entries, deliver_at) columns:
    ledgers of 1,000 entries, delivery times spread over n ms, out of ledger order. Made a chunk
    at a time, so the bench holds no list of every index (at 10 M, 1.5 GB of tuples: more than
    the engines it measures)."""
    i = np.arange(lo, min(hi, n), dtype=np.uint64)
    return i // np.uint64(1000), i % np.uint64(1000), np.uint64(START + 1) + (i * np.uint64(7919)) % np.uint64(n)


def rss_mb() -> tuple[float, float]:
    """This process's resident memory now and its peak since the last call, in MB (Linux; the
    peak is the lifetime's where it cannot be reset)."""
    try:
        with open("/proc/self/status") as f:
            status = dict(line.split(":", 1) for line in f)
        now, peak = (int(status[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))
    except (OSError, KeyError, ValueError):
        now = peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass
    return now, peak


def _open(path: str):
    return bucketstore.open(path, durability="journal", sync_interval_ms=50)


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def build(paths: list[str], n: int, subs: list[int | None]) -> list[float]:
    """Per path, create a topic with ``subs[i]`` subscriptions (None: a lone tracker) and add
    the rows one by one; seconds per add of each. The stores take turns, 1,000 adds at a time,
    so a load that comes and goes on a shared machine weighs on each alike."""
    stores = [_open(path) for path in paths]
    try:
        handles = []
        for store, count in zip(stores, subs):
            if count is None:
                handles.append(store.tracker("t", config=CFG, clock=Clock()))
                continue
            topic = store.topic("t", config=CFG, clock=Clock())
            for i in range(count):
                topic.subscription(f"s{i}")
            handles.append(topic)
        spent = [0.0] * len(paths)
        for start in range(0, n, 1000):
            chunk = list(zip(*(c.tolist() for c in columns(start, start + 1000, n))))
            for i, handle in enumerate(handles):
                started = time.perf_counter()
                for ledger, entry, at in chunk:
                    handle.add_message(ledger, entry, at)
                spent[i] += time.perf_counter() - started
        for handle in handles:
            handle.flush()
    finally:
        for store in stores:
            store.close()
    return [took / n for took in spent]


def open_memory(path: str, subs: int | None) -> int:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    store = _open(path)
    if subs is None:
        handle = store.tracker("t", config=CFG, clock=Clock())
        handle.number_of_delayed_messages
    else:
        topic = store.topic("t", config=CFG, clock=Clock())
        handles = [topic.subscription(f"s{i}") for i in range(subs)]
        assert all(h.number_of_delayed_messages for h in handles[:1])
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    store.close()
    return used


def drain_topic(path: str, n: int, subs: int) -> float:
    """Seconds per index for one subscription, every subscription taking 1,000 in turn."""
    clock = Clock()
    clock.now = START + n + 10
    with _open(path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        handles = [topic.subscription(f"s{i}") for i in range(subs)]
        spent, done = 0.0, 0
        while True:
            got = 0
            for h in handles:
                started = time.perf_counter()
                batch = h.get_scheduled_messages(1000)
                spent += time.perf_counter() - started
                got += len(batch)
            done += got
            if not got:
                break
        assert done == n * subs, (done, n, subs)
    return spent / (n * subs)


def drain_tracker(path: str, n: int) -> float:
    clock = Clock()
    clock.now = START + n + 10
    with _open(path) as store:
        tracker = store.tracker("t", config=CFG, clock=clock)
        started = time.perf_counter()
        done = 0
        while batch := tracker.get_scheduled_messages(1000):
            done += len(batch)
        took = time.perf_counter() - started
        assert done == n
    return took / n


def best_of(fn, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def count_row_by_row(topic, state, upto: tuple[int, int]) -> int:
    """What ``mark_delete`` counted before ``engine/topics/topic_marks.py``: every position up to
    ``upto`` read in acknowledgement order and judged alone (the "before" of the mark_delete line)."""
    n, pos, versions = 0, None, []
    with topic._file.read() as txn:
        # A position's rows are consecutive: each judged once its last row is read (no dict of them all).
        for ts, lg, en, seq in topic._view.positions_after(txn, topic._id, state.mark_delete, upto):
            if (lg, en) != pos:
                n += pos is not None and state.tracked_row(*pos, versions) is not None
                pos, versions = (lg, en), []
            if pos > upto:
                pos = None
                break
            versions.append((seq, ts))
    return n + (pos is not None and state.tracked_row(*pos, versions) is not None)


def count_by_columns(topic, state, upto: tuple[int, int]) -> int:
    with topic._file.read() as txn:
        return tracked_in_range(txn, topic._view, topic._id, state, topic._judged(), state.mark_delete, upto)


def mark_delete_costs(topic, handles, n: int) -> tuple[float, float, float]:
    """Seconds to count what a mark-delete over half the positions untracks, for the stalled
    subscription and one caught up (row by row, by columns; each the best of 3), then the
    stalled one's whole ``mark_delete`` call."""
    upto = ((n // 2) // 1000, (n // 2) % 1000)
    spent = [0.0, 0.0]
    for h in handles[:2]:
        state = h._state
        assert count_row_by_row(topic, state, upto) == count_by_columns(topic, state, upto)
        spent[0] += best_of(lambda: count_row_by_row(topic, state, upto))
        spent[1] += best_of(lambda: count_by_columns(topic, state, upto))
    started = time.perf_counter()
    handles[0].mark_delete(*upto)
    return spent[0] / 2, spent[1] / 2, time.perf_counter() - started


def stats_costs(path: str, n: int, subs: int) -> tuple[float, ...]:
    """Seconds for the figures of a topic with one stalled subscription: (full pass per
    subscription, describe_topics, topic.stats(), prometheus_text), each the best of 3; then
    :func:`mark_delete_costs` on the same topic."""
    clock = Clock()
    with _open(path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        handles = [topic.subscription(f"s{i}") for i in range(subs)]
        for lo in range(0, n, 100_000):
            topic.add_messages(columns(lo, lo + 100_000, n))
        clock.now = START + n // 10
        for h in handles[1:]:  # caught up; s0 stalls
            while h.get_scheduled_messages(10_000):
                pass
            h.confirm_delivered()
        now = clock.now
        fast, slow = describe_topics(path, now_ms=now)["t"], scan_figures(path, now_ms=now)["t"]
        assert {k: {f: v[f] for f in ("held_rows", "due_undelivered", "oldest_due_age_ms")}
                for k, v in fast["subscriptions"].items()} == slow["subscriptions"]
        return (best_of(lambda: scan_figures(path, now_ms=now)), best_of(lambda: describe_topics(path, now_ms=now)),
                best_of(topic.stats), best_of(lambda: prometheus_text(store)), *mark_delete_costs(topic, handles, n))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=20_000, help="indexes added (the issue's target: 10,000,000)")
    p.add_argument("--subscriptions", type=int, default=100)
    args = p.parse_args()
    n, s = args.size, args.subscriptions
    print("$ python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]]))
    rss = {"start": rss_mb()}
    with tempfile.TemporaryDirectory() as tmp:
        one, many, lone = (os.path.join(tmp, x) for x in ("one", "many", "lone"))
        add_one, add_many, add_lone = build([one, many, lone], n, [1, s, None])
        rss["build"] = rss_mb()
        disk_one, disk_many = dir_bytes(topics_directory(one)), dir_bytes(topics_directory(many))
        disk_lone = dir_bytes(lone)
        mem_one, mem_many, mem_lone = open_memory(one, 1), open_memory(many, s), open_memory(lone, None)
        rss["open"] = rss_mb()
        drain_one, drain_many, drain_lone = drain_topic(one, n, 1), drain_topic(many, n, s), drain_tracker(lone, n)
        rss["drain"] = rss_mb()
        scan, described, topic_stats, scrape, md_rows, md_cols, md_call = stats_costs(os.path.join(tmp, "stats"), n, s)
        rss["stats"] = rss_mb()
    print(f"{n:,} indexes, {s} subscriptions")
    print(f"disk        topic/{s}: {disk_many:>12,} B   topic/1: {disk_one:>12,} B   ratio {disk_many / disk_one:5.2f}"
          f"   (lone tracker: {disk_lone:,} B)")
    print(f"open memory topic/{s}: {mem_many:>12,} B   topic/1: {mem_one:>12,} B   per extra subscription "
          f"{(mem_many - mem_one) / max(1, s - 1):,.0f} B   (lone tracker: {mem_lone:,} B)")
    print(f"drain       topic/{s}: {drain_many * 1e6:8.2f} us/index   topic/1: {drain_one * 1e6:8.2f}   rate ratio "
          f"{drain_one / drain_many:5.2f}   (lone tracker: {drain_lone * 1e6:.2f} us, rate ratio "
          f"{drain_lone / drain_many:5.2f})")
    print(f"add         topic/{s}: {add_many * 1e6:8.2f} us/add     topic/1: {add_one * 1e6:8.2f}   ratio "
          f"{add_many / add_one:5.2f}   (lone tracker: {add_lone * 1e6:.2f} us, ratio {add_many / add_lone:5.2f})")
    print(f"stats       {s} subscriptions, {n // 10:,} due, 1 stalled: full pass per subscription "
          f"{scan * 1e3:9.2f} ms   describe_topics {described * 1e3:8.2f} ms   ratio {scan / described:7.1f}   "
          f"(topic.stats() {topic_stats * 1e3:.2f} ms, prometheus_text {scrape * 1e3:.2f} ms)")
    print(f"mark_delete {n // 2:,} positions acknowledged by one of {s}: count row by row {md_rows * 1e3:9.2f} ms   "
          f"by columns {md_cols * 1e3:8.2f} ms   ratio {md_rows / md_cols:7.1f}   (the call: {md_call * 1e3:.2f} ms)")
    print("rss         " + "   ".join(f"{phase} {now:,.0f} MB (peak {peak:,.0f})" for phase, (now, peak) in rss.items())
          + "   (the whole process: the bench holds no list of the indexes)")


if __name__ == "__main__":
    main()
