"""Regenerate every figure the documentation shows: docs/benchmarks.md, the README's short figures,
the demo picture and the sample outputs of the command line in docs/.

Nothing in those places is typed by hand: this script runs the benchmarks of ``tools/bench/`` (as
functions, or as subprocesses where they measure fresh processes), runs ``bucketstore simulate`` and
the tools on the store it leaves, and rewrites

* ``docs/benchmarks.md`` whole: each table with the command that reproduces it, the date, the
  machine and the size it was measured at;
* the regions between ``<!-- figures: NAME -->`` and ``<!-- /figures -->`` in README.md and
  docs/*.md (the README's headline figures, the demo picture, ``simulate``'s reports, console
  examples);
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

import bench_codec  # noqa: E402
import bench_drain_scale  # noqa: E402
import bench_handoff  # noqa: E402
import bench_restart  # noqa: E402
import bench_seal  # noqa: E402
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
              "handoff_messages": 50_000, "handoff_repeat": 1, "peers_positions": 100_000, "peers_repeat": 1},
    "full": {"codec_indexes": 50_000, "codec_repeat": 5, "seal_indexes": 1_000_000, "seal_repeat": 5,
             "tracker_messages": 1_000_000, "restart_sizes": [1_000_000, 10_000_000, 100_000_000],
             "restart_repeats": 5, "drain_sizes": [1_000_000, 10_000_000], "drain_repeat": 3,
             "drain_positions": 1_000_000, "handoff_messages": 200_000, "handoff_repeat": 3,
             "peers_positions": 1_000_000, "peers_repeat": 3},
}


@dataclass
class Run:
    """What a section measured: its table (markdown), and the values the README and regions quote."""

    size: str
    params: dict[str, object]
    sections: dict[str, str] = field(default_factory=dict)
    regions: dict[str, str] = field(default_factory=dict)
    headline: dict[str, str] = field(default_factory=dict)


# -- the machine -------------------------------------------------------------------------------------------
def machine() -> str:
    """One line a reader can compare with their own machine."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    try:
        load = "load average %.1f / %.1f / %.1f at the start" % os.getloadavg()
    except OSError:
        load = "load average unknown"
    return (f"{model}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, numpy {np.__version__}; {load}")


def command(run: Run, section: str) -> str:
    return f"python tools/bench/figures.py --size {run.size} --only {section}"


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
    for name, label in names.items():
        r = results[name] = bench_codec.measure(name, n, 195, repeat)
        rows.append([label, f"**{r['file']:.3f}**", f"{r['v1_file']:.3f}", f"{r['p_total']:.2f}",
                     f"{r['enc']:.1f}", f"{r['dec']:.1f}"])
    run.sections["codec"] = (
        "## On-disk size and codec speed\n\n"
        f"One bucket of {n:,} indexes per workload, 5,000 per segment, written as a ledger file (bytes of the "
        f"whole file per index) in the current format (v2) and the first (v1), against the same segments in "
        f"Pulsar's protobuf layout; encode and decode in M indexes/s, best of {repeat}. "
        f"`python tools/bench/bench_codec.py` prints the same figures.\n\n"
        + table(["workload", "v2 B/index", "v1 B/index", "Pulsar B/index", "encode M/s", "decode M/s"], rows))
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
            store = os.path.join(tmp, "store")
            buckets = bench_drain_scale.generate_store(store, size, 1)
            for mode in ("sealed", "journal"):
                r = max((bench_drain_scale.measure(ROOT, store, tmp, mode, 1000, min(size, limit), size, "keepup")
                         for _ in range(repeat)), key=lambda x: x["rate"])
                best[(size, mode)] = r
                rows.append([f"{size:,}", f"{buckets}", mode, f"**{r['rate'] / 1e6:.2f}**",
                             f"{r['us_per_call']:.0f}", f"{r['first'] * 1e3:.0f}"])
            shutil.rmtree(store)
    run.sections["drain"] = (
        "## Delivery while keeping up\n\n"
        "The regime a broker's dispatcher lives in: a store whose every bucket overlaps one 10-minute window "
        "of due times is drained in batches of 1,000, the clock stepping by the arrival time of one batch "
        f"whenever a call comes back short. The first {limit:,} positions are timed in a fresh process; best "
        f"of {repeat}. M positions/s, µs per call, and the first call's time (it opens every bucket with a "
        "row due). `python tools/bench/bench_drain_scale.py --regimes keepup --shapes overlap --batches 1000 "
        "--merged ''` prints the same figures.\n\n"
        + table(["positions", "buckets", "mode", "M positions/s", "µs/call", "first call ms"], rows, right={0, 1, 3, 4, 5}))
    big = sizes[-1]
    run.headline["drain"] = (f"Delivery while keeping up, {big:,} positions in {rows[-1][1]} buckets, batches of "
                             f"1,000: {best[(big, 'sealed')]['rate'] / 1e6:.2f} M/s sealed, "
                             f"{best[(big, 'journal')]['rate'] / 1e6:.2f} M/s journal.")


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
    args = [sys.executable, os.path.join(HERE, "bench_peers.py"), "--positions", str(n), "--repeat", str(repeat),
            "--json"]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    results = json.loads(out[out.index("\n{") + 1:])
    base = results["bucketstore-journal"]["drain"]
    rows = [[subject, f"{r['add'] / 1e6:.2f}", f"{r['restart_ms']:.1f}", f"{r['drain'] / 1e6:.2f}",
             f"{r['bytes']:.1f}", f"{r['drain'] / base:.2f}"] for subject, r in results.items()]
    run.sections["peers"] = (
        "## Against the stores a delay queue would otherwise use\n\n"
        f"{n:,} positions (50,000 entries per ledger, delays U[0, 10 min)) added in batches of 10,000, then a "
        "fresh process opens the store, takes the first due batch (restart) and drains in batches of 1,000, "
        "deleting each batch as delivered. Each peer in its idiomatic design (key = big-endian "
        "`(deliver_at, ledger, entry)`); LevelDB and RocksDB run when plyvel and rocksdict are installed. "
        f"Best of {repeat}, subjects round-robin. `python tools/bench/bench_peers.py` prints the same figures.\n\n"
        + table(["subject", "add M/s", "restart ms", "drain M/s", "B/position", "drain vs bucketstore journal"],
                rows))
    others = {s: r for s, r in results.items() if not s.startswith("bucketstore")}
    if others:
        sql = results.get("sqlite-normal")
        run.headline["peers"] = (
            f"Against the peers ({n:,} positions): bucketstore journal adds "
            f"{results['bucketstore-journal']['add'] / 1e6:.2f} M/s and stores "
            f"{results['bucketstore-journal']['bytes']:.1f} B/position"
            + (f"; SQLite (WAL, NORMAL) {sql['add'] / 1e6:.2f} M/s and {sql['bytes']:.1f} B/position" if sql else "")
            + ".")


SECTIONS: dict[str, Callable[[Run], None]] = {
    "simulate": simulate, "codec": codec, "seal": seal, "tracker": tracker, "restart": restart, "drain": drain,
    "handoff": handoff, "peers": peers,
}


# -- writing -------------------------------------------------------------------------------------------------
def stamp(run: Run, name: str) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"*Measured {when}, size `{run.size}`, on {machine()}. Command: `{command(run, name)}`.*"


HEADLINE = re.compile(r"^<!-- headline: (?P<text>.*) -->$", re.M)
README_ORDER = ("simulate", "drain", "restart", "codec", "peers")


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
    args = p.parse_args(argv)
    names = [s for s in args.only.split(",") if s]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        p.error(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}")
    run = Run(args.size, SIZES[args.size])
    stamps = {}
    for name in SECTIONS:
        if name in names:
            started = time.perf_counter()
            print(f"figures: {name} ...", file=sys.stderr, flush=True)
            SECTIONS[name](run)
            stamps[name] = stamp(run, name)
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
