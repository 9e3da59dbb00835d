"""Regenerate every figure the documentation shows: docs/benchmarks.md, the README's short figures,
the demo picture and the sample outputs of the command line in docs/.

Nothing in those places is typed by hand: this script runs the benchmarks of ``tools/bench/`` (as
functions, or as subprocesses where they measure fresh processes), runs ``bucketstore simulate`` and
the tools on the store it leaves, and rewrites

* ``docs/benchmarks.md`` whole: each table with the command that reproduces it, the date, the
  machine and the size it was measured at;
* the regions between ``<!-- figures: NAME -->`` and ``<!-- /figures -->`` in README.md and
  docs/*.md (the README's headline figures, the demo picture, ``simulate``'s reports, console
  examples, and the tables of the pages that explain a measurement: maintenance, memory, the
  compact structures, Spark, the codec against Pulsar's layout), each table with the same stamp as
  in docs/benchmarks.md;
* ``docs/images/simulate_due.png``.

The full run takes a long time on a small machine (it builds stores of 10^8 indexes). ``--size``
sets the scale: ``quick`` (a few minutes; small stores, one repeat) proves the script works and
gives rough figures, ``full`` is what the documentation should show, run on a quiet machine. The
size is written beside every table, so a quick run never passes for a full one. ``--only`` runs a
few sections and leaves the other tables of docs/benchmarks.md as they were.

    python tools/bench/figures.py --size quick
    python tools/bench/figures.py --size full
    python tools/bench/figures.py --size quick --only simulate,codec
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [ROOT, HERE]

import before_after  # noqa: E402
import bench_codec  # noqa: E402
import bench_drain_scale  # noqa: E402
import bench_handoff  # noqa: E402
import bench_maintenance  # noqa: E402
import bench_merge  # noqa: E402
import bench_restart  # noqa: E402
import bench_seal  # noqa: E402
import bench_sparse  # noqa: E402
import bench_timebucket  # noqa: E402
import bench_tracker  # noqa: E402

DOCS = os.path.join(ROOT, "docs")
BENCHMARKS = os.path.join(DOCS, "benchmarks.md")
IMAGE = os.path.join(DOCS, "images", "simulate_due.png")
REGION = re.compile(r"(<!-- figures: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)
SECTION = re.compile(r"^<!-- section: (?P<name>[\w-]+) -->\n(?P<body>.*?)(?=^<!-- section: |\Z)", re.S | re.M)

#: What each size measures. ``full`` is the documentation's; ``quick`` proves the script in minutes.
SIZES: dict[str, dict[str, object]] = {
    "quick": {"codec_indexes": 20_000, "codec_repeat": 1, "seal_indexes": 200_000, "seal_repeat": 1,
              "tracker_messages": 100_000, "restart_sizes": [200_000, 1_000_000], "restart_repeats": 1,
              "drain_sizes": [1_000_000], "drain_repeat": 1, "drain_positions": 300_000,
              "handoff_messages": 50_000, "handoff_repeat": 1, "peers_positions": 100_000, "peers_repeat": 1,
              "stalls_per_bucket": 500_000, "stalls_seal_at": 250_000, "stalls_total": 3_500_000,
              "stalls_repeat": 1, "steps_per_bucket": 500_000, "merge_repeat": 1, "merge_simulate": 200_000,
              "sparse_runs": [(10_000_000, 50_000, "1,10,dense", 1)], "sparse_use": 20_000,
              "readahead_messages": 1_000_000, "readahead_repeat": 1,
              "spark_rows": 2_000_000, "spark_repeat": 3, "timebucket_messages": 10_000_000,
              "nack_messages": 500_000, "topics_indexes": 100_000, "topics_subscriptions": 100,
              "before_after_rounds": 3},
    "full": {"codec_indexes": 50_000, "codec_repeat": 5, "seal_indexes": 1_000_000, "seal_repeat": 5,
             "tracker_messages": 1_000_000, "restart_sizes": [1_000_000, 10_000_000, 100_000_000],
             "restart_repeats": 5, "drain_sizes": [1_000_000, 10_000_000], "drain_repeat": 3,
             "drain_positions": 1_000_000, "handoff_messages": 200_000, "handoff_repeat": 3,
             "peers_positions": 1_000_000, "peers_repeat": 3,
             "stalls_per_bucket": 1_000_000, "stalls_seal_at": 500_000, "stalls_total": 7_000_000,
             "stalls_repeat": 3, "steps_per_bucket": 1_000_000, "merge_repeat": 5, "merge_simulate": 1_000_000,
             "sparse_runs": [(10_000_000, 50_000, "1,10,dense", 5), (100_000_000, 500_000, "1,dense", 2)],
             "readahead_messages": 1_000_000, "readahead_repeat": 3,
             "sparse_use": 20_000, "spark_rows": 10_000_000, "spark_repeat": 3,
             "timebucket_messages": 10_000_000, "nack_messages": 1_000_000,
             "topics_indexes": 1_000_000, "topics_subscriptions": 100, "before_after_rounds": 5},
}


@dataclass
class Run:
    """What a section measured: its table (markdown), and the values the README and regions quote."""

    size: str
    params: dict[str, object]
    sections: dict[str, str] = field(default_factory=dict)
    regions: dict[str, str] = field(default_factory=dict)
    headline: dict[str, str] = field(default_factory=dict)
    #: The commit the before/after sections compare this tree with (``--baseline``).
    baseline: str = before_after.BASELINE


# -- the machine -------------------------------------------------------------------------------------------
def machine(load: tuple[float, float, float] | None = None) -> str:
    """One line a reader can compare with their own machine; ``load``: the load average when the section
    started (now, if not given)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    try:
        loads = "load average %.1f / %.1f / %.1f at the start" % (load or os.getloadavg())
    except OSError:
        loads = "load average unknown"
    return (f"{model}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, numpy {np.__version__}; {loads}")


def command(run: Run, section: str) -> str:
    baseline = f" --baseline {run.baseline}" if section in BASELINE_SECTIONS else ""
    return f"python tools/bench/figures.py --size {run.size} --only {section}{baseline}"


def table(header: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    right = right if right is not None else set(range(1, len(header)))
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def cli(args: list[str], cwd: str, timeout: float = 900) -> tuple[str, float]:
    """Run ``python -m bucketstore ARGS`` in ``cwd`` on this tree; return its stdout and wall seconds."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bucketstore", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"bucketstore {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout, time.perf_counter() - started


def ratio(x: float) -> str:
    """A ratio as a reader takes it in: 1.3×, 14×, 2,100×."""
    return f"{x:.1f}×" if x < 10 else f"{x:,.0f}×"


def ratios(values: list[float]) -> str:
    """The span of some ratios: ``5.3×`` or ``5.3× to 13×``."""
    lo, hi = ratio(min(values)), ratio(max(values))
    return lo if lo == hi else f"{lo} to {hi}"


def console(cmd: str, out: str) -> str:
    return f"```console\n$ {cmd}\n{out.rstrip()}\n```\n"


def field_of(report: str, name: str) -> str:
    """The text after a report line's label (``  violations      0 (...)`` -> ``0 (...)``)."""
    m = re.search(rf"^\s+{re.escape(name)}\s+(.*)$", report, re.M)
    if m is None:
        raise RuntimeError(f"simulate's report has no {name!r} line:\n{report}")
    return m.group(1)


# -- sections ------------------------------------------------------------------------------------------------
def simulate(run: Run) -> None:
    """The main job and the journal job, always at their default size (they are the README's commands)."""
    with tempfile.TemporaryDirectory(prefix="figures-") as tmp:
        report, seconds = cli(["simulate", "./demo-store", "--no-progress"], tmp)
        verify, _ = cli(["verify", "./demo-store"], tmp)
        prom, _ = cli(["stats", "./demo-store", "--prometheus"], tmp)
        backup, _ = cli(["checkpoint", "./demo-store", "./demo-backup"], tmp)
        os.makedirs(os.path.dirname(IMAGE), exist_ok=True)
        cli(["stats", "./demo-store", "--plot", "due.png"], tmp)
        shutil.copyfile(os.path.join(tmp, "due.png"), IMAGE)
        journal, journal_s = cli(["simulate", "./journal-store", "--durability", "journal", "--no-progress"], tmp)
    tail = report[report.index("  the day, each event"):].rstrip()
    run.regions["simulate-report"] = f"```text\n{tail}\n```\n"
    run.regions["demo-verify"] = console("bucketstore verify ./demo-store", verify)
    run.regions["api-prometheus"] = console("bucketstore stats ./demo-store --prometheus | grep -v '^#'",
                                            "\n".join(l for l in prom.splitlines() if not l.startswith("#")))
    run.regions["api-checkpoint"] = console("bucketstore checkpoint ./demo-store ./demo-backup", backup)
    jtail = journal[journal.index("  workload"):journal.index("\nThe store keeps")].rstrip()
    run.regions["journal-report"] = f"```text\n{jtail}\n```\n"
    run.regions["readme-image"] = ("![What is due when in the store `bucketstore simulate` leaves in ./demo-store: "
                                   "due times per bucket](docs/images/simulate_due.png)\n")
    rows = [["wall time, the whole command", f"{seconds:.1f} s", f"{journal_s:.1f} s"],
            ["violations the oracle found", field_of(report, "violations").split(" ")[0],
             field_of(journal, "violations").split(" ")[0]],
            ["on disk", field_of(report, "on disk"), "-"],
            ["memory", field_of(report, "memory"), "-"],
            ["recovery", field_of(report, "recovery"), "-"],
            ["kills", "-", field_of(journal, "kills")]]
    run.sections["simulate"] = (
        "## The main job\n\n"
        "The two `simulate` runs of the README at their default sizes: `bucketstore simulate ./demo-store` "
        "(sealed) and `bucketstore simulate ./journal-store --durability journal`. Their full reports are in "
        "[cli.md](cli.md).\n\n"
        + table(["", "sealed", "journal, with SIGKILLs"], rows, right=set()))
    run.headline["simulate"] = (f"`bucketstore simulate ./demo-store` ran in {seconds:.1f} s: "
                                f"violations {field_of(report, 'violations').split(' ')[0]}, "
                                f"{field_of(report, 'on disk')}; the journal run "
                                f"({field_of(journal, 'kills').split(' (')[0]}) in {journal_s:.1f} s, "
                                f"violations {field_of(journal, 'violations').split(' ')[0]}.")


def codec(run: Run) -> None:
    n, repeat = int(run.params["codec_indexes"]), int(run.params["codec_repeat"])
    names = {"A": "A: fixed delay, 1 ms apart", "B": "B: random delay in a 10-minute window",
             "S": "S: 1 % of entries delayed U[0, 10 min), many ledgers", "Sf": "Sf: 1 % of entries, fixed delay"}
    rows, results = [], {}
    v = bench_codec.SNAPSHOT_VERSION
    for name, label in names.items():
        r = results[name] = bench_codec.measure(name, n, 195, repeat)
        rows.append([label, f"**{r['file']:.3f}**", f"{r['v1_file']:.3f}", f"{r['p_total']:.2f}",
                     f"{r['enc']:.1f}", f"{r['dec']:.1f}"])
    run.sections["codec"] = (
        "## On-disk size and codec speed\n\n"
        f"One bucket of {n:,} indexes per workload, 5,000 per segment, written as a ledger file (bytes of the "
        f"whole file per index) in the current format (v{v}) and the first (v1), against the same segments in "
        f"Pulsar's protobuf layout; encode and decode in M indexes/s, best of {repeat}. "
        f"`python tools/bench/bench_codec.py` prints the same figures.\n\n"
        + table(["workload", f"v{v} B/index", "v1 B/index", "Pulsar B/index", "encode M/s", "decode M/s"], rows))
    parts = [[label, f"{r['file']:.3f}", f"{r['seg']:.3f}", f"{r['entry0']:.3f}", f"{r['v1_file']:.3f}",
              f"{r['v1_seg']:.3f}", f"{r['v1_entry0']:.3f}", f"{r['p_total']:.2f}", f"{r['p_seg']:.2f}",
              f"{r['p_entry0']:.3f}", ratio(r['p_total'] / r['file'])]
             for label, r in ((names[k], results[k]) for k in names)]
    run.regions["codec-parts"] = (
        f"Buckets of {n:,} indexes, B/index by part: the whole ledger file, its segments and its entry 0, in the "
        f"current format (v{v}) and the first (v1), and Pulsar's protobuf layout (segments, then `SnapshotMetadata`), "
        f"with Pulsar's total over v{v}'s file.\n\n"
        + table(["workload", f"v{v} file", f"v{v} segments", f"v{v} entry 0", "v1 file", "v1 segments", "v1 entry 0",
                 "Pulsar total", "Pulsar segments", "Pulsar entry 0", f"Pulsar / v{v}"], parts) + "\n")
    run.headline["codec"] = (f"On disk: {results['A']['file']:.3f} B/index for a fixed delay and "
                             f"{results['B']['file']:.2f} B/index for random delays in a 10-minute window, against "
                             f"{results['A']['p_total']:.1f} and {results['B']['p_total']:.1f} B/index in Pulsar's "
                             f"protobuf layout ({n:,}-index buckets).")


def seal(run: Run) -> None:
    n, repeat = int(run.params["seal_indexes"]), int(run.params["seal_repeat"])
    rows = []
    for shape, label in (("A", "A: fixed delay"), ("B", "B: random 10-minute delays")):
        rates = [bench_seal.seal_once(shape, n, seed) for seed in range(repeat)]
        rows.append([label, f"{n:,}", f"{statistics.median(rates):.2f}", f"{max(rates):.2f}"])
    run.sections["seal"] = (
        "## Seal\n\n"
        "A tracker seals one bucket (merge the mutable bucket's runs, drop untracked rows, cut, encode, write, "
        f"fsync, commit the catalog), timed at the caller; M indexes/s over {repeat} run(s). "
        "`python tools/bench/bench_seal.py` prints the same figures.\n\n"
        + table(["bucket", "indexes", "median M/s", "best M/s"], rows))


def tracker(run: Run) -> None:
    n = int(run.params["tracker_messages"])
    with tempfile.TemporaryDirectory(prefix="figures-") as tmp:
        r = bench_tracker.bench_adds_and_delivery(n, tmp)
    b, m = r["bucket"], r["memory"]
    rows = [["single `add_message` calls", f"{b['single_add_per_s'] / 1e6:.2f}", f"{m['single_add_per_s'] / 1e6:.2f}"],
            ["`add_messages`, batches of 10,000", f"{b['batch_add_per_s'] / 1e6:.2f}",
             f"{m['batch_add_per_s'] / 1e6:.2f}"],
            ["`get_scheduled_messages(10000)`", f"{b['deliver_per_s'] / 1e6:.2f}", f"{m['deliver_per_s'] / 1e6:.2f}"]]
    run.sections["tracker"] = (
        "## Adds and deliveries\n\n"
        f"{n:,} indexes with delays U[0, 1 h), 50,000 entries per ledger, a sealed-mode store (seals included) "
        "against `InMemoryTracker` (Pulsar's heap of triples), M indexes/s. "
        "`python tools/bench/bench_tracker.py` prints the same figures.\n\n"
        + table(["operation", "bucket tracker", "InMemoryTracker"], rows))


def restart(run: Run) -> None:
    sizes, repeats = list(run.params["restart_sizes"]), int(run.params["restart_repeats"])  # type: ignore[arg-type]
    rows = []
    with tempfile.TemporaryDirectory(prefix="figures-") as tmp:
        for n in sizes:
            path = os.path.join(tmp, f"store-{n}")
            first_due = bench_restart.build_store(path, n, n // 20, 1e6)
            batch = bench_restart.measure(path, first_due, "batch", repeats)
            idle = bench_restart.measure(path, bench_restart.EPOCH, "next", repeats)
            rows.append([f"{n:,}", f"{batch['buckets']}", f"{batch['open_seconds'] * 1000:.1f} ms",
                         f"{batch['seconds'] * 1000:.1f} ms ({batch['opened']})",
                         f"{idle['seconds'] * 1000:.1f} ms", f"{batch['rss_open'] / n:.3f}"])
            shutil.rmtree(path)
    run.sections["restart"] = (
        "## Restart\n\n"
        "A fresh process until the first due batch is ready. Stores of 20 buckets as the delay-queue job leaves "
        "them (ledgers added in order at 1 M/s, delays U[0, 10 min)); *open* = store and tracker opened and "
        "counted; *first batch* = that plus `get_scheduled_messages(1000)` with the clock at the time the first "
        "1,000 are due (in brackets: the buckets it opened); *nothing due* = open and `next_delivery_time()`; "
        f"resident = memory growth per held index after the open. Best of {repeats} process(es). "
        "`python tools/bench/bench_restart.py --buckets 20` prints the same figures.\n\n"
        + table(["held indexes", "buckets", "open", "first batch (opened)", "nothing due", "resident B/index"],
                rows))
    run.headline["restart"] = (f"Open reads the catalog only: {rows[0][2]} at {sizes[0]:,} held indexes, "
                               f"{rows[-1][2]} at {sizes[-1]:,} (20 buckets).")


def drain(run: Run) -> None:
    sizes, repeat = list(run.params["drain_sizes"]), int(run.params["drain_repeat"])  # type: ignore[arg-type]
    limit = int(run.params["drain_positions"])
    rows, best = [], {}
    with tempfile.TemporaryDirectory(prefix="figures-") as tmp:
        for size in sizes:
            for shape, ordered in (("overlapping", False), ("in time order", True)):
                store = os.path.join(tmp, "store")
                buckets = bench_drain_scale.generate_store(store, size, 1, ordered=ordered)
                for regime in ("keepup", "catchup"):
                    for mode in ("sealed", "journal"):
                        r = max((bench_drain_scale.measure(ROOT, store, tmp, mode, 1000, min(size, limit), size,
                                                           regime) for _ in range(repeat)), key=lambda x: x["rate"])
                        best[(size, shape, regime, mode)] = r
                        rate = f"{r['rate'] / 1e6:.2f}"
                        rows.append([f"{size:,}", f"{buckets}", shape,
                                     "keeping up" if regime == "keepup" else "catching up", mode,
                                     f"**{rate}**" if regime == "keepup" else rate,
                                     f"{r['us_per_call']:.0f}", f"{r['first'] * 1e3:.0f}"])
                shutil.rmtree(store)
    run.sections["drain"] = (
        "## Delivery: keeping up and catching up\n\n"
        "Stores whose buckets all overlap one 10-minute window of due times (random delays: every bucket "
        "holds rows due at every moment), and the same positions with the delays in time order (each bucket "
        "holds its own slice of the window: buckets follow each other), drained in batches of 1,000. "
        "*Keeping up* is the regime a broker's dispatcher lives in: the clock steps by the arrival time of one "
        "batch whenever a call comes back short. *Catching up* starts the clock one minute into the window "
        "and moves it at twice the drain's pace, so a backlog is always due (a restart after a stop). The "
        f"first {limit:,} positions are timed in a fresh process; best of {repeat}. M positions/s, µs per "
        "call, and the first call's time after the open (the first batch after a restart). "
        "`python tools/bench/bench_drain_scale.py --regimes keepup,catchup --shapes overlap,ordered "
        "--batches 1000 --merged ''` prints the same figures.\n\n"
        + table(["positions", "buckets", "due times", "regime", "mode", "M positions/s", "µs/call",
                 "first call ms"], rows, right={0, 1, 5, 6, 7}))
    big = sizes[-1]
    keep = {mode: best[(big, "overlapping", "keepup", mode)] for mode in ("sealed", "journal")}
    run.headline["drain"] = (f"Delivery while keeping up, {big:,} positions in {rows[-1][1]} overlapping "
                             f"buckets, batches of 1,000: {keep['sealed']['rate'] / 1e6:.2f} M/s sealed, "
                             f"{keep['journal']['rate'] / 1e6:.2f} M/s journal; the first batch after a restart "
                             f"{keep['sealed']['first'] * 1e3:.0f} ms.")


def handoff(run: Run) -> None:
    n, repeat = int(run.params["handoff_messages"]), int(run.params["handoff_repeat"])
    best: dict[str, tuple[float, int]] = {}
    for _ in range(repeat):
        for label, delivery, window in bench_handoff.MODES:
            seconds, delivered, _stats, fsyncs = bench_handoff.one_run(n, 1000, delivery, window)
            if label not in best or delivered / seconds > best[label][0]:
                best[label] = (delivered / seconds, fsyncs)
    rows = [[label, f"{rate / 1e3:,.0f}", f"{fsyncs}"] for label, (rate, fsyncs) in best.items()]
    run.sections["handoff"] = (
        "## Delivery handoff\n\n"
        f"A journal-mode store of {n:,} indexes drained in batches of 1,000 (about {-(-n // 1000)} calls), "
        f"modes interleaved, best of {repeat}: k deliveries/s and the fsyncs the drain made. "
        "`python tools/bench/bench_handoff.py` prints the same figures.\n\n"
        + table(["delivery", "k/s", "fsyncs"], rows))


def peers(run: Run) -> None:
    n, repeat = int(run.params["peers_positions"]), int(run.params["peers_repeat"])

    def bench(regime: str) -> dict:
        args = [sys.executable, os.path.join(HERE, "bench_peers.py"), "--positions", str(n), "--repeat",
                str(repeat), "--regime", regime, "--json"]
        out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return json.loads(out[out.index("\n{") + 1:])

    results, keepup = bench("paced"), bench("keepup")
    base = keepup["bucketstore-journal"]["drain"]
    rows = [[subject, f"{r['add'] / 1e6:.2f}", f"{r['restart_ms']:.1f}", f"{r['drain'] / 1e6:.2f}",
             f"{keepup[subject]['drain'] / 1e6:.2f}", f"{r['bytes']:.1f}", f"{keepup[subject]['drain'] / base:.2f}"]
            for subject, r in results.items() if subject in keepup]
    run.sections["peers"] = (
        "## Against the stores a delay queue would otherwise use\n\n"
        f"{n:,} positions (50,000 entries per ledger, delays U[0, 10 min)) added in batches of 10,000, then a "
        "fresh process opens the store, takes the first due batch (restart) and drains in batches of 1,000, "
        "deleting each batch as delivered: *catching up* with the clock moved by one batch's arrival time at "
        "every call (`--regime paced`), and *keeping up* with it moved only when a call comes back short "
        "(`--regime keepup`, where a broker lives). Each peer in its idiomatic design (key = big-endian "
        "`(deliver_at, ledger, entry)`); LevelDB and RocksDB run when plyvel and rocksdict are installed. "
        f"Best of {repeat}, subjects round-robin. `python tools/bench/bench_peers.py --regime paced|keepup` "
        "prints the same figures.\n\n"
        + table(["subject", "add M/s", "restart ms", "drain M/s, catching up", "drain M/s, keeping up",
                 "B/position", "keeping up vs bucketstore journal"], rows))
    others = {s: r for s, r in results.items() if not s.startswith("bucketstore")}
    if others:
        sql = results.get("sqlite-normal")
        run.headline["peers"] = (
            f"Against the peers ({n:,} positions): bucketstore journal adds "
            f"{results['bucketstore-journal']['add'] / 1e6:.2f} M/s and stores "
            f"{results['bucketstore-journal']['bytes']:.1f} B/position"
            + (f"; SQLite (WAL, NORMAL) {sql['add'] / 1e6:.2f} M/s and {sql['bytes']:.1f} B/position" if sql else "")
            + ".")


def child_json(code: str, timeout: float = 7200) -> object:
    """Run ``code`` in a fresh Python on this tree (tools/bench importable) and return the JSON value it
    prints last: for figures of a process's own memory, or of code a benchmark patches in place."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"a benchmark's child process exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def stalls_rows(run: Run) -> tuple[str, dict[bool, dict]]:
    per, seal_at = int(run.params["stalls_per_bucket"]), int(run.params["stalls_seal_at"])
    total, repeat = int(run.params["stalls_total"]), int(run.params["stalls_repeat"])
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for _ in range(repeat):  # the two designs back to back, each in a fresh process (its RSS is the figure)
        for background in (False, True):
            runs[background].append(child_json(
                "import json, tempfile, bench_maintenance as b\n"
                "with tempfile.TemporaryDirectory() as tmp:\n"
                f"    print(json.dumps(b.bench_stalls(tmp, {per}, {total}, {background}, 2, {seal_at})))"))
    med = {m: bench_maintenance._median_of(r) for m, r in runs.items()}
    rows = [[label, f"{r['other_p50_ms']:.2f}", f"{r['other_p99_ms']:.1f}", f"**{r['other_max_ms']:.0f}**",
             f"{r['caller_M_per_s']:.2f}", f"{r['all_sealed_M_per_s']:.2f}",
             f"{r['seals']:.0f} / {r['merges']:.0f}", f"{r['rss_peak_mb']:.0f}", f"{r['backpressure_waits']:.0f}"]
            for label, r in (("synchronous (`background=False`)", med[False]), ("background (the default)", med[True]))]
    text = (f"A writer adds {total:,} random-delay indexes in batches of 10,000 on ledgers of {per:,} entries "
            f"(`min_index_count_per_bucket={seal_at:,}`, `max_num_buckets=4`: a seal at each ledger roll, "
            "merges of four); a second thread adds one index per millisecond and its calls are timed. Defaults "
            "otherwise (`max_pending_maintenance=2`, `max_backlog_bytes=256 MiB`). Each run in a fresh process, "
            f"the two designs back to back, median of {repeat}. `python tools/bench/bench_maintenance.py --cases "
            f"stalls --per-bucket {per} --seal-at {seal_at} --total {total} --repeats {repeat}` prints the "
            "same figures.\n\n"
            + table(["maintenance", "other thread: p50 ms", "p99 ms", "max ms", "writer at the caller M/s",
                     "until all installed M/s", "seals / merges", "peak RSS MB", "backpressure waits"], rows))
    return text, med


def steps_rows(run: Run) -> str:
    per, repeat = int(run.params["steps_per_bucket"]), int(run.params["stalls_repeat"])
    runs = [child_json("import json, tempfile, bench_maintenance as b\nb.trace_steps()\n"
                       "with tempfile.TemporaryDirectory() as tmp:\n"
                       f"    print(json.dumps(b.bench_steps(tmp, {per})))") for _ in range(repeat)]
    labels = ["sort", "drop repeats", "liveness", "read + decode segments", "encode segments", "encode bitmaps",
              "encode (all)", "fsync", "fsync dir", "write (all, fsyncs included)", "job work (all)"]

    def ms(kind: str, label: str) -> float | None:
        # bench_steps gives (wall ms, CPU ms) per job: the table shows the wall time.
        values = [float(r[f"{kind}: {label}"][0]) for r in runs if f"{kind}: {label}" in r]
        return statistics.median(values) if values else None

    rows = []
    for label in labels:
        seal_ms, merge_ms = ms("seal", label), ms("merge", label)
        if seal_ms is None and merge_ms is None:
            continue
        rows.append([label.replace("job work (all)", "the job's whole work"),
                     "" if seal_ms is None else f"{seal_ms:.1f}", "" if merge_ms is None else f"{merge_ms:.1f}"])
    whole_seal, whole_merge = ms("seal", "job work (all)"), ms("merge", "job work (all)")
    if whole_seal and whole_merge:
        rows.append(["rate of the whole work, M indexes/s", f"{per / whole_seal / 1000:.1f}",
                     f"{4 * per / whole_merge / 1000:.1f}"])
    return (f"One thread (`background=False`): six ledgers of {per:,} random-delay indexes make six seals, and "
            f"`max_num_buckets=4` merges four of them ({4 * per:,} indexes); ms per job, median of {repeat}. "
            "Lines nest: *encode (all)* holds the two encodes, *write* its fsyncs. `python "
            f"tools/bench/bench_maintenance.py --cases steps --per-bucket {per} --repeats {repeat}` prints "
            "the same figures (and what of each step releases the GIL).\n\n"
            + table(["step", f"{per // 1000:,} k seal", f"{4 * per // 1000:,} k merge"], rows))


def maintenance(run: Run) -> None:
    stalls, _ = stalls_rows(run)
    steps = steps_rows(run)
    run.regions["maintenance-stalls"] = stalls + "\n"
    run.regions["maintenance-steps"] = steps + "\n"
    run.sections["maintenance"] = ("## Maintenance: stalls and the steps of a seal and a merge\n\n" + stalls
                                   + "\n\n" + steps)


def maintenance_before_after(run: Run) -> None:
    """Issue 26's workloads on the baseline commit and on this tree, rounds alternating (before_after.py)."""
    rounds = int(run.params["before_after_rounds"])
    c = before_after.compare(run.baseline, rounds, lambda line: print(f"figures:   {line}", file=sys.stderr,
                                                                      flush=True))
    sizes = c.sizes
    loads = " / ".join(f"{x:.1f}" for x in c.load_start), " / ".join(f"{x:.1f}" for x in c.load_end)
    why = before_after.reasons(c)
    text = (
        f"Issue 26's workloads on the tree before it (commit {c.baseline[:7]}, main when the issue began) and "
        f"on this tree ({c.after}), measured in one run: {rounds} rounds, each running every workload on both "
        "trees back to back, the tree that goes first alternating between rounds, each run a fresh process. "
        f"The stalls rows are `python tools/bench/bench_maintenance.py --cases stalls --per-bucket "
        f"{sizes.per_bucket} --seal-at {sizes.seal_at} --total {sizes.total}` (background maintenance: a writer "
        "adds random-delay indexes in batches of 10,000, `max_num_buckets=4`, while a second thread adds one "
        "index a millisecond and its calls are timed), each tree running its own benchmark through "
        "`tools/bench/stalls_by_tree.py TREE LABEL --durability sealed|journal` (journal: "
        f"`sync_interval_ms=5`; {c.baseline[:7]}'s benchmark seals at the ledger size, where each roll seals "
        f"the whole ledger as `--seal-at {sizes.seal_at}` does). The seal is a bucket of "
        f"{before_after.count(sizes.per_bucket)} indexes with delays U[0, 10 min) (bench_seal's shape B), the "
        f"merge four sealed buckets of {before_after.count(sizes.per_bucket)} with segments of "
        f"{sizes.per_bucket // 4:,}, both on the caller's thread: this tree's benchmark code, which uses only "
        "the public API, on each tree's package (`tools/bench/jobs_by_tree.py TREE LABEL seal|merge`). Each "
        f"cell is the median (range) of the rounds; *after / before* the median (range) of each round's own "
        f"ratio; the targets are the issue's. Load average {loads[0]} at the start, {loads[1]} at the end: "
        "on a shared machine compare the ratios rather than the rates.\n\n"
        + table(before_after.HEADER, before_after.rows(c), right={1, 2, 3})
        + ("\n\nNot measurable on the old tree: " + "; ".join(why) + "." if why else "")
        + f"\n\n`{command(run, 'maintenance-before-after')}` measures it again.")
    print(text)
    run.sections["maintenance-before-after"] = "## Maintenance before and after issue 26\n\n" + text
    run.headline["maintenance-before-after"] = before_after.headline(c)


def readahead(run: Run) -> None:
    n, repeat = int(run.params["readahead_messages"]), int(run.params["readahead_repeat"])
    rows = []
    with tempfile.TemporaryDirectory(prefix="figures-") as tmp:
        for segment in (5_000, 50_000):
            path = os.path.join(tmp, f"sealed-{segment}")
            bench_maintenance.make_sealed_store(path, n, segment)
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(repeat):  # off and on back to back
                for on in (False, True):
                    runs[on].append(bench_maintenance.bench_read_ahead(path, n, segment, on, 1.0))
            off, on = (bench_maintenance._median_of(runs[m]) for m in (False, True))
            rows.append([f"{segment:,}" + (" (the default)" if segment == 5_000 else ""),
                         f"{off['load_ms_per_segment']:.2f}", f"**{on['load_ms_per_segment']:.2f}**",
                         f"{on['hits']:.0f} / {on['hits'] + on['misses'] + on['late']:.0f}",
                         f"{off['p50_ms']:.2f} / {off['p99_ms']:.1f} / {off['max_ms']:.1f}",
                         f"{on['p50_ms']:.2f} / {on['p99_ms']:.1f} / {on['max_ms']:.1f}"])
    run.sections["readahead"] = (
        "## Segment read-ahead\n\n"
        f"A store holding {n:,} sealed indexes (random delays) is reopened and drained with "
        "`get_scheduled_messages(1000)` while the clock is past every index, the caller pausing 1 ms between "
        "calls (its dispatch); `read_ahead` off and on (`Store(read_ahead=True)`, the default when "
        f"`background=True`), back to back, median of {repeat}. *Hits* are segment loads the reader thread had "
        "decoded before the queue reached them; per-call percentiles also hold the bucket deletions and the "
        "merge of due runs. "
        f"`python tools/bench/bench_maintenance.py --cases readahead --messages {n} --repeats {repeat}` prints "
        "the same figures.\n\n"
        + table(["segments of", "off: caller's wait per segment load, ms", "on: per load, ms",
                 "on: hits / loads", "per call p50 / p99 / max ms, off", "on"], rows))


def merge(run: Run) -> None:
    repeat, messages = int(run.params["merge_repeat"]), int(run.params["merge_simulate"])
    with tempfile.TemporaryDirectory(prefix="figures-") as tmp:
        runs = [bench_merge.merge_once(os.path.join(tmp, f"s{i}"), i) for i in range(repeat)]
    best = min(runs, key=lambda r: r["merge_ms"])
    n = 4 * bench_merge.PER_BUCKET
    timing = table(["merge", "ms", "M indexes/s", "four files, bytes", "merged file, bytes"],
                   [[f"4 × {bench_merge.PER_BUCKET:,} indexes, random delays up to 1 h", f"{best['merge_ms']:.0f}",
                     f"{n / best['merge_ms'] / 1000:.1f}", f"{best['bytes_before']:,.0f}",
                     f"{best['bytes_after']:,.0f}"]])
    ratios = []
    for shape, label, per_bucket in (("A", "A: fixed delay", 50_000), ("B", "B: random delays up to 10 min", 50_000),
                                     ("S", "S: 1 % of entries delayed", 20_000)):
        before, after, k = bench_merge.merge_ratio(shape, per_bucket, 0)
        ratios.append([label, f"{k} × {per_bucket:,}", f"{before:,}", f"{after:,}", f"{after / before:.4f}"])
    level = child_json(f"import json, bench_merge\nprint(json.dumps(bench_merge.simulate_level({messages})))")
    run.sections["merge"] = (
        "## Merge\n\n"
        f"A tracker with `max_num_buckets=4` (maintenance on the caller's thread) seals four buckets and merges "
        f"them at the fifth seal: the merge's time, best of {repeat}.\n\n" + timing + "\n\n"
        "The merged file's size over the sum of the files it replaced (never larger is the aim):\n\n"
        + table(["workload", "sources", "sources, bytes", "merged, bytes", "ratio"], ratios) + "\n\n"
        "Under random delays (B) a merged segment's rows interleave the four ledgers; in delivery order its "
        "ledger column would record how (about 1.9 bits a row), which the denser timestamp differences pay "
        "back only up to what a byte-wise entropy coder loses (1.004 in snapshot versions 4 and 5). From version 6 "
        "such a segment is stored grouped by ledger, each ledger's timestamps as steps, with no ledger "
        "column: its segments cost what the sources' did, and the rest of the file (entry 0, framing, "
        "headers) shrinks. `python tools/bench/bench_merge_bytes.py` shows where the bytes go.\n\n"
        f"`bucketstore simulate` of {level['messages']:,} messages with delays within {level['window_s']} s and "
        f"`max_num_buckets={level['max_num_buckets']}`, the process's RSS sampled while it publishes (past the "
        "first simulated minute the held set is at its steady size; the simulator's own oracle grows by 9 bytes "
        "a message):\n\n"
        + table(["seals", "merges", "most buckets at once", "RSS, first quarter MB", "last quarter MB",
                 "peak MB", "violations"],
                [[f"{level['sealed']}", f"{level['merged']}", f"{level['peak_buckets']}",
                  f"{level['rss_first_mb']:.0f}", f"{level['rss_last_mb']:.0f}", f"{level['rss_peak_mb']:.0f}",
                  f"{level['violations']}"]], right=set(range(7)))
        + f"\n\n`python tools/bench/bench_merge.py --repeat {repeat} --simulate-messages {messages}` prints the "
        "same figures.")


def sparse(run: Run) -> None:
    uses = int(run.params["sparse_use"])
    rows, commands = [], []
    for n, bucket, shapes, repeat in run.params["sparse_runs"]:  # type: ignore[attr-defined]
        commands.append(f"`python tools/bench/bench_sparse.py --indexes {n} --bucket {bucket} --shapes {shapes} "
                        f"--repeat {repeat} --use {uses}`")
        for shape in shapes.split(","):
            with tempfile.TemporaryDirectory(prefix="figures-", dir=os.environ.get("BUCKETSTORE_BENCH_DIR")) as tmp:
                disk, last_ledger = bench_sparse.generate(tmp, shape, n, bucket, 0)
                runs = [bench_sparse.recover(tmp, uses, last_ledger) for _ in range(repeat)]
            held = runs[0]["held"]

            def med(key: str) -> float:
                return statistics.median(r[key] for r in runs)

            label = ("dense (every entry, fixed delay)" if shape == "dense" else
                     f"{shape} % of entries, {held * 100 // int(shape) // bench_sparse.LEDGER_ENTRIES:,} ledgers")
            rows.append([f"{held:,} ({-(-n // bucket)} × {bucket:,})", label, f"{med('seconds') * 1000:.1f}",
                         f"{med('rss_growth') / held:.2f}", f"**{med('used_rss_growth') / held:.2f}**",
                         f"{med('rss_whole') / held:.2f} ({med('rss_imported') / 2**20:.0f} MiB)",
                         f"{med('contains_seconds') / uses * 1e6:.1f}", f"{med('batch_seconds') * 1000:.1f}",
                         f"{disk / held:.2f}"])
    text = (
        "Stores as seals leave them (sealed buckets of contiguous ledger ranges; ledgers of 10,000 entries, a "
        "share of their entries delayed U[0, 10 min), or every entry at a fixed delay). A fresh process opens the "
        "store and the tracker and asks `next_delivery_time()` (*open*, and the RSS growth after it), then is "
        f"used as a broker would: `contains_message` of {uses:,} random positions (random ledgers, so every "
        "bucket) and the first batch due a minute after the first index; *after use* is the RSS growth then, "
        "over the interpreter that had imported bucketstore (and numpy, pyroaring, lmdb); *whole process* is "
        "the process's whole RSS after use over the indexes held, with the RSS of that interpreter before the "
        "open in brackets (a floor no store size changes). "
        f"Medians over fresh processes. " + "; ".join(commands)
        + (" print" if len(commands) > 1 else " prints") + " the same figures. (Its `--baseline "
        "CHECKOUT` also opens each store with another checkout's bucketstore, alternating, for before/after "
        "ratios; that needs a second checkout, so this table does not run it.)\n\n"
        + table(["held (buckets × size)", "shape", "open ms", "resident after open B/index",
                 "resident after use B/index", "whole process after use B/index (before open)", "µs per question",
                 "first batch ms", "disk B/index"], rows, right={2, 3, 4, 5, 6, 7, 8}))
    sparse_rows = [r for r in rows if "ledgers" in r[1]]
    if sparse_rows:
        shapes = "; ".join(f"{r[1]}: {r[4].strip('*')} B/index resident, {r[8]} B/index on disk" for r in sparse_rows)
        whole = sorted(float(r[5].split(" (")[0]) for r in sparse_rows)
        run.headline["sparse"] = (f"Sparse stores of {sparse_rows[0][0].split(' (')[0]} held indexes after a broker's use "
                                  f"({uses:,} `contains_message` questions on random ledgers and the first due "
                                  f"batch), resident over the interpreter that imported bucketstore: {shapes}; the "
                                  f"whole process {whole[0]:.2f}-{whole[-1]:.2f} B/index, "
                                  f"{sparse_rows[0][5].split('(')[1].rstrip(')')} of it before the open.")
    run.regions["memory-sparse"] = text + "\n"
    run.sections["sparse"] = "## Sparse stores: open, resident memory after use, disk\n\n" + text


SPARK_LINE = re.compile(r"^(?P<what>\s*\S.*?)\s+(?P<rows>[\d,]+) rows\s+(?P<s>[\d.]+) s\s+(?P<rate>[\d.]+) M/s\s+"
                        r"(?P<core>[\d.]+) M/s/core(?:\s+(?P<cpu>[\d.]+) CPU s\s+(?P<cpurate>[\d.]+) M/CPU-s)?$", re.M)


def spark(run: Run) -> None:
    rows_n, repeat = int(run.params["spark_rows"]), int(run.params["spark_repeat"])
    command_line = f"python tools/bench/bench_spark.py --rows {rows_n} --repeats {repeat}"
    if importlib.util.find_spec("pyspark") is None or shutil.which("java") is None:
        text = (f"Skipped: PySpark (the `spark` extra) or a Java runtime was not installed where this ran. "
                f"`{command_line}` measures it.")
    else:
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with tempfile.TemporaryDirectory(prefix="figures-") as tmp:
            out = subprocess.run([sys.executable, os.path.join(HERE, "bench_spark.py"), "--rows", str(rows_n),
                                  "--repeats", str(repeat), "--dir", os.path.join(tmp, "spark")], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=7200)
        if out.returncode != 0:
            raise RuntimeError(f"bench_spark.py exited {out.returncode}:\n{out.stderr[-3000:]}")
        shape = re.search(r"^rows=.*buckets=(\d+)\s+partitions=(\d+)", out.stdout, re.M)
        rows = [[m["what"].strip().replace("the same, scrambled input", "the same, scrambled input (shuffled)")
                 .replace("local[", "`local[").replace("]", "]`"), f"{float(m['s']):.2f}",
                 f"{float(m['rate']):.2f}", f"{float(m['core']):.2f}", m["cpu"] or "-", m["cpurate"] or "-"]
                for m in SPARK_LINE.finditer(out.stdout)]
        if len(rows) not in (4, 5) or shape is None:  # 5: the scrambled input's build too
            raise RuntimeError(f"bench_spark.py printed no figures:\n{out.stdout}")
        split = re.search(r"^CPU split of the Spark build \(median run\): (.*)$", out.stdout, re.M)
        fixed = re.search(r"^fixed cost of a Spark build \(([\d,]+) rows, same frame\): ([\d.]+) CPU s; "
                          r"rate beyond it: (.*)$", out.stdout, re.M)
        after = ""
        if split and fixed:
            after = (f"\n\nThe median in-place build's CPU seconds by part: {split.group(1)}. A build of "
                     f"{fixed.group(1)} rows of the same frame costs {fixed.group(2)} CPU s (two Spark jobs, the "
                     f"planning and commit workers, whatever the size); beyond that the build runs at "
                     f"{fixed.group(3)}.")
        text = (f"{rows_n:,} indexes in log order (ledgers of 10,000 entries, delivery times spread over a day, "
                f"generated in the JVM), default `TrackerConfig`: {shape.group(1)} buckets, {shape.group(2)} "
                f"partitions. A warm-up builds the same frames (a tenth of the rows) and reads once, not timed; "
                f"the Spark lines are the median of {repeat}. "
                "*CPU s* is what the whole process tree (driver, JVM, Python workers) spent, and *M/CPU-s* the "
                "rate per CPU-second: the per-core rate on a machine that is all the job's (on a shared "
                f"machine the wall clock swings, CPU seconds much less). `{command_line}` prints the same "
                "figures.\n\n"
                + table(["", "s", "M/s", "M/s/core", "CPU s", "M/CPU-s"], rows) + after)
    run.regions["spark-performance"] = text + "\n"
    run.sections["spark"] = "## Spark: bulk build and read\n\n" + text


def topics(run: Run) -> None:
    n, subs = int(run.params["topics_indexes"]), int(run.params["topics_subscriptions"])
    args = ["--size", str(n), "--subscriptions", str(subs)]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, os.path.join(HERE, "bench_topics.py"), *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=7200)
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"bench_topics.py exited {out.returncode}:\n{out.stdout}\n{out.stderr[-3000:]}")
    text = (f"A topic of {n:,} indexes read by {subs} subscriptions, against the same topic with one "
            "subscription and a lone tracker holding the same indexes (journal mode, `sync_interval_ms=50`; "
            "see docs/topics.md for what each line measures):\n\n"
            # (a text block: console blocks are bucketstore commands the docs tests run; its own
            # first line, the command, names this machine's path)
            + f"```text\n$ python tools/bench/bench_topics.py {' '.join(args)}\n"
            + re.sub(r"^\$ .*\n", "", out.stdout).rstrip() + "\n```\n")
    run.regions["topics-bench"] = text
    run.sections["topics"] = "## Topics: one index for every subscription\n\n" + text


#: Below this RSS growth a row is within the allocator's noise: no ratio is drawn from it.
NOISE_BYTES = 2**20


def compact(run: Run) -> None:
    n, nn = int(run.params["timebucket_messages"]), int(run.params["nack_messages"])
    tb = {(kind, x, y, delay): bench_timebucket._run_row(kind, n, x, y, delay)
          for x, y in [(1, 10), (4, 10), (8, 10), (1, 15), (4, 15), (8, 15)] for delay in ["fixed"]
          for kind in ("timebucket", "seed-map")}
    tb.update({(kind, 4, y, "random"): bench_timebucket._run_row(kind, n, 4, y, "random")
               for y in (10, 15) for kind in ("timebucket", "seed-map")})
    heap = {delay: bench_timebucket._run_row("heap", n, x, 0, delay) for x, delay in ((1, "fixed"), (4, "random"))}

    def mb(r: dict) -> str:
        return f"{r['rss_bytes'] / 2**20:.2f} ({r['rss_bytes'] / n:.3f})"

    def est(r: dict) -> str:
        return f"{r['estimate_bytes'] / 2**20:.2f}" if "estimate_bytes" in r else "-"

    fixed, below_java = [], []
    for x, y in [(1, 10), (4, 10), (8, 10), (1, 15), (4, 15), (8, 15)]:
        t, bare = tb[("timebucket", x, y, "fixed")], tb[("seed-map", x, y, "fixed")]
        java = bench_timebucket.JAVA_MB.get((x, y))
        if java is not None and t["rss_bytes"] >= NOISE_BYTES:
            below_java.append(java * n / 10_000_000 * 2**20 / t["rss_bytes"])
        fixed.append([f"{x}", f"{y}", f"{t['buckets']}", f"**{mb(t)}**", mb(bare),
                      "–" if java is None else f"{java * n / 10_000_000:.2f}", est(t), f"{t['adds_per_s'] / 1e6:.2f}"])
    random_rows = [[f"{y}", f"{tb[('timebucket', 4, y, 'random')]['buckets']}", mb(tb[("timebucket", 4, y, "random")]),
                    mb(tb[("seed-map", 4, y, "random")]), est(tb[("timebucket", 4, y, "random")]),
                    f"{tb[('timebucket', 4, y, 'random')]['adds_per_s'] / 1e6:.2f}"] for y in (10, 15)]
    below_heap = [heap["fixed"]["rss_bytes"] / tb[("timebucket", x, y, "fixed")]["rss_bytes"]
                  for x, y in [(1, 10), (4, 10), (8, 10), (1, 15), (4, 15), (8, 15)]
                  if tb[("timebucket", x, y, "fixed")]["rss_bytes"] >= NOISE_BYTES]
    compare = (f" Where its growth is at least {NOISE_BYTES // 2**20} MB (below that a row is within the "
               f"allocator's noise), TimeBucketIndex is {ratios(below_java)} below the design's Java figures and "
               f"{ratios(below_heap)} below the tuple heap, its reverse lookup included."
               if below_java and below_heap else "")
    random_heap = heap["random"]["rss_bytes"] / tb[("timebucket", 4, 10, "random")]["rss_bytes"]
    timebucket = (
        f"{n:,} messages per row, 50,000 entries per ledger, fixed delay (message `i` published and delivered at "
        "`T0 + i // x`), RSS growth of a fresh process after `gc.collect()` + `malloc_trim(0)`. `bare-map` is the "
        "design's bare `SortedDict{ts >> y: {ledger: BitMap}}` built the same way (no reverse lookup, no run "
        "optimization); the Java column is the TimeBucket design's own figures for 10 M messages, scaled to "
        "this row count. MB (B/msg).\n\n"
        + table(["x msg/ms", "y bits", "buckets", "**TimeBucketIndex**", "bare-map", "Java, the design",
                 "`memory_bytes()` MB", "adds M/s"], fixed)
        + f"\n\nHeap of `(ts, ledger, entry)` tuples (the InMemory baseline), same run: "
        f"**{heap['fixed']['rss_bytes'] / 2**20:,.0f} MB, {heap['fixed']['rss_bytes'] / n:.1f} B/msg**, "
        f"{heap['fixed']['adds_per_s'] / 1e6:.2f} M pushes/s ({heap['random']['adds_per_s'] / 1e6:.2f} M/s for "
        f"the random rows)." + compare + "\n\n"
        "Random delays (delivery at publish time + U[0, 1 h), x = 4):\n\n"
        + table(["y bits", "buckets", "TimeBucketIndex", "bare-map", "`memory_bytes()` MB", "adds M/s"],
                random_rows)
        + f"\n\nAt y = 10 that is {ratio(random_heap)} below the tuple heap. `python tools/bench/bench_timebucket.py "
        f"--messages {n}` prints the same figures.")
    nack_rows, nack = [], {}
    for shape in ("fixed", "batched", "random"):
        for kind in ("nack/8", "nack/0", "dict"):
            nack[(kind, shape)] = child_json(f"import json, bench_nack\nprint(json.dumps(bench_nack.worker("
                                             f"{kind!r}, {nn}, 10, {shape!r})))")
        cells = [f"{nack[(k, shape)]['rss_bytes'] / 2**20:.2f} MB ({nack[(k, shape)]['rss_bytes'] / nn:.2f} B/msg)"
                 for k in ("nack/8", "nack/0", "dict")]
        nack_rows.append([shape, f"**{cells[0]}**", cells[1], cells[2],
                          " / ".join(f"{nack[(k, shape)]['adds_per_s'] / 1e6:.2f}" for k in ("nack/8", "nack/0", "dict"))])
    worst = nack[("nack/0", "random")]["rss_bytes"] / nack[("dict", "random")]["rss_bytes"]
    nack_text = (
        f"{nn:,} nacks per row at 10 per ms (PIP-393's 10,000/s), redelivery after a fixed hour (`fixed`), the same "
        "with 10-message batches each message nacked (`batched`), or after U[0, 1 h) (`random`). `dict` is "
        "`{(ledger, entry, batch_index, partition): redeliver_at}`. RSS growth of a fresh process.\n\n"
        + table(["workload", "NackTracker, 8 bits", "NackTracker, 0 bits", "dict", "adds M/s (8 bits / 0 / dict)"],
                nack_rows)
        + f"\n\nWith random delays at 0 bits NackTracker takes {ratio(worst)} the dict's memory. "
        f"`python tools/bench/bench_nack.py --messages {nn}` prints the same figures.")
    run.regions["compact-timebucket"] = timebucket + "\n"
    run.regions["compact-nack"] = nack_text + "\n"
    run.sections["compact"] = ("## Compact in-memory structures\n\n### TimeBucketIndex: bytes per message\n\n"
                               + timebucket + "\n\n### NackTracker: bytes per nacked message\n\n" + nack_text)


SECTIONS: dict[str, Callable[[Run], None]] = {
    "simulate": simulate, "codec": codec, "seal": seal, "tracker": tracker, "restart": restart, "drain": drain,
    "handoff": handoff, "peers": peers, "maintenance": maintenance,
    "maintenance-before-after": maintenance_before_after, "merge": merge, "sparse": sparse,
    "readahead": readahead, "spark": spark, "compact": compact, "topics": topics,
}


# -- writing -------------------------------------------------------------------------------------------------
def stamp(run: Run, name: str, load: tuple[float, float, float] | None = None) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"*Measured {when}, size `{run.size}`, on {machine(load)}. Command: `{command(run, name)}`.*"


#: Regions that are a command's output or a picture, not a table of measurements: they carry no stamp.
UNSTAMPED = {"simulate-report", "demo-verify", "api-prometheus", "api-checkpoint", "journal-report", "readme-image"}
HEADLINE = re.compile(r"^<!-- headline: (?P<text>.*) -->$", re.M)
README_ORDER = ("simulate", "drain", "restart", "sparse", "codec", "peers", "maintenance-before-after")
#: Sections that compare this tree with a baseline commit: their command names ``--baseline``.
BASELINE_SECTIONS = {"maintenance-before-after"}


def write_benchmarks(run: Run, stamps: dict[str, str]) -> dict[str, str]:
    """Rewrite docs/benchmarks.md: the sections run now, the others as they were. Return its sections."""
    old: dict[str, str] = {}
    if os.path.exists(BENCHMARKS):
        old = {m.group("name"): m.group("body") for m in SECTION.finditer(open(BENCHMARKS).read())}
    parts = ["# Benchmarks\n\n"
             "Every table below is written by `python tools/bench/figures.py` (do not edit this file by hand): "
             "each says when, on which machine and at which size it was measured, and the command that measures "
             "it again. Shared or small machines are noisy: compare rows of one table, measured in one run, "
             "rather than figures of different runs. `--size quick` runs small stores once to check the script; "
             "`--size full` is the documentation's scale.\n\n"]
    sections = {}
    for name in SECTIONS:
        if name in run.sections:
            when = stamps[name]
            headline = (f"<!-- headline: {run.headline[name].rstrip('.')} (size `{run.size}`, "
                        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}). -->\n"
                        if name in run.headline else "")
            sections[name] = f"{run.sections[name].rstrip()}\n\n{when}\n{headline}\n"
        elif name in old:
            sections[name] = old[name]
    with open(BENCHMARKS, "w") as f:
        f.write(("".join(parts) + "".join(f"<!-- section: {n} -->\n{b}" for n, b in sections.items()))
                .rstrip("\n") + "\n")
    return sections


def readme_figures(sections: dict[str, str]) -> str | None:
    """The README's short figures: the headline of each section docs/benchmarks.md holds, as it holds it."""
    lines = [f"* {m.group('text')}" for name in README_ORDER if name in sections
             for m in HEADLINE.finditer(sections[name])]
    if not lines:
        return None
    return ("The headlines of [docs/benchmarks.md](docs/benchmarks.md), which gives each table's command, date, "
            "machine and size (`python tools/bench/figures.py` regenerates them all):\n\n" + "\n".join(lines) + "\n")


def fill_regions(regions: dict[str, str]) -> list[str]:
    """Rewrite the named regions of README.md and docs/*.md; return the files changed."""
    files = [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))
    changed = []
    for path in files:
        text = open(path).read()
        new = REGION.sub(lambda m: m.group(1) + regions.get(m.group("name"), m.group("body")) + m.group(4), text)
        if new != text:
            with open(path, "w") as f:
                f.write(new)
            changed.append(os.path.relpath(path, ROOT))
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="quick",
                   help="quick: minutes, small stores, to check the script; full: the documentation's scale")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    p.add_argument("--baseline", default=before_after.BASELINE, metavar="COMMIT",
                   help=f"the commit {', '.join(sorted(BASELINE_SECTIONS))} compares this tree with "
                        f"(default {before_after.BASELINE}, main before issue 26)")
    args = p.parse_args(argv)
    names = [s for s in args.only.split(",") if s]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        p.error(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}")
    if BASELINE_SECTIONS & set(names):
        try:  # before anything runs: a copy of the tree without git history fails here, in one line
            before_after.resolve(args.baseline)
        except before_after.Unavailable as e:
            print(f"figures: {', '.join(sorted(BASELINE_SECTIONS & set(names)))}: {e}", file=sys.stderr)
            return 2
    run = Run(args.size, SIZES[args.size], baseline=args.baseline)
    stamps = {}
    for name in SECTIONS:
        if name in names:
            started = time.perf_counter()
            print(f"figures: {name} ...", file=sys.stderr, flush=True)
            before = set(run.regions)
            try:
                load: tuple[float, float, float] | None = os.getloadavg()
            except OSError:
                load = None
            SECTIONS[name](run)
            stamps[name] = stamp(run, name, load)
            for region in set(run.regions) - before - UNSTAMPED:  # a figure in a doc says where it came from
                run.regions[region] = f"{run.regions[region].rstrip()}\n\n{stamps[name]}\n"
            print(f"figures: {name} done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    sections = write_benchmarks(run, stamps)
    regions = dict(run.regions)
    figures = readme_figures(sections)
    if figures is not None:
        regions["readme-figures"] = figures
    changed = fill_regions(regions)
    print("wrote docs/benchmarks.md" + (", docs/images/simulate_due.png" if "simulate" in names else "")
          + "".join(f", {c}" for c in changed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
