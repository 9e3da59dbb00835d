"""``bucketstore simulate``: a realistic delayed-message workload, checked against an oracle.

A simulated broker publishes messages into a log of rolling ledgers at a fixed
rate, each with a random delay inside a window (as ``pulsar-perf produce -dr``
does); a consumer polls for due messages every few milliseconds of simulated
time and acknowledges what it receives; the mark-delete position follows the
acknowledgements. Half way through, the process state is thrown away — a
crash — the store is reopened, and the broker replays its log from the
mark-delete position, as Pulsar's dispatcher does in ``sealed`` durability, and
then tells the tracker its replay is done (``replay_done``): until then the
buckets whose segments recovery skipped as already due are kept. (The run opens
the store with ``durability="sealed"``; ``--durability journal`` runs the
journal-mode simulation instead.)

The oracle knows every message's delivery time. A *violation* is a message
delivered before its time (minus one tick, which the non-strict cutoff
allows), a message never delivered, or a delivered position never published.
A message delivered twice (before the crash and again after it, or from the
replay) is Pulsar's at-least-once contract in ``sealed`` mode: the consumer's
acknowledgements filter it, and the report counts it.
"""

from __future__ import annotations

import argparse
import os
from array import array
import random
import resource
import sys
import time
from dataclasses import dataclass, field

from ..config import TrackerConfig
from ..engine.catalog import read_catalog_snapshot
from ..engine.store import open_store
from ..engine.tracker import BucketTracker
from .progress import Progress
from .store_check import NOT_A_STORE, is_store
from .simulate_journal import JournalSimulationConfig, format_journal_report, run_journal_simulation

__all__ = ["SimulationConfig", "SimulationReport", "run_simulation", "add_arguments", "run_from_args",
           "refusal"]

_EPOCH = 1_700_000_000_000
#: The one tracker simulate writes (in both modes): a store holding others is not simulate's.
_TRACKER = "simulate"


@dataclass
class SimulationConfig:
    """The workload: sizes, rates and the tracker's settings."""

    messages: int = 300_000
    rate_per_s: int = 5_000
    delay_window_ms: int = 600_000
    entries_per_ledger: int = 5_000
    poll_interval_ms: int = 100
    poll_max: int = 2_000
    crash_at: float = 0.5
    #: after the last publish the consumer polls for this much simulated time, then stops,
    #: leaving what falls due later held in the store (-1: until everything is delivered)
    deliver_for_ms: int = 300_000
    seed: int = 195
    tracker: TrackerConfig = field(default_factory=lambda: TrackerConfig(
        min_index_count_per_bucket=10_000, max_indexes_per_segment=2_000,
        max_time_step_per_segment_ms=60_000, max_num_buckets=8))


@dataclass
class SimulationReport:
    """What happened, and whether the engine kept its promises."""

    published: int = 0
    delivered: int = 0
    redelivered_filtered: int = 0
    dispatched_on_replay: int = 0
    early: int = 0
    lost: int = 0
    phantom: int = 0
    sealed: int = 0
    merged: int = 0
    deleted: int = 0
    segments_loaded: int = 0
    peak_buckets: int = 0
    peak_bytes_on_disk: int = 0
    peak_indexes_on_disk: int = 0
    recovery_seconds: float = 0.0
    recovered_indexes: int = 0
    max_rss_mb: float = 0.0
    wall_seconds: float = 0.0
    stopped_at_ms: int = 0
    held: int = 0
    held_expected: int = 0
    left_buckets: int = 0
    #: What a sealed-mode reopen at the stop tracks: the sealed part of the backlog (what was
    #: added since the last seal lives in the broker's log only, as sealed mode promises).
    kept_in_store: int = 0

    @property
    def held_mismatch(self) -> int:
        """Held by the tracker at the stop beyond what the oracle says is undelivered (should be 0)."""
        return abs(self.held - self.held_expected)

    @property
    def violations(self) -> int:
        return self.early + self.lost + self.phantom + self.held_mismatch


class _Oracle:
    """The broker's log and the consumer's acknowledgements: the ground truth."""

    def __init__(self, cfg: SimulationConfig) -> None:
        self.cfg = cfg
        self.deliver_at = array("q")  # by log sequence number: 8 bytes a message, not a Python int
        self.acked = bytearray()  # 1 once the consumer received the message
        self.mark_delete_seq = 0  # every seq below this is acknowledged

    def position(self, seq: int) -> tuple[int, int]:
        return divmod(seq, self.cfg.entries_per_ledger)

    def seq_of(self, ledger: int, entry: int) -> int:
        return ledger * self.cfg.entries_per_ledger + entry

    def advance_mark_delete(self) -> None:
        acked, seq = self.acked, self.mark_delete_seq
        while seq < len(acked) and acked[seq]:
            seq += 1
        self.mark_delete_seq = seq


def _check_held(tracker: BucketTracker, oracle: _Oracle, report: SimulationReport) -> None:
    """At the stop: every message not yet received must be held, not due, and nothing else held.

    A message the consumer never received is *lost* if the tracker no longer holds
    it, or if it was due by the stop (it should have been delivered).
    """
    expected = 0
    for seq, received in enumerate(oracle.acked):
        if received:
            continue
        expected += 1
        if oracle.deliver_at[seq] <= report.stopped_at_ms or not tracker.contains_message(*oracle.position(seq)):
            report.lost += 1
    report.held_expected = expected
    report.held = tracker.number_of_delayed_messages


def run_simulation(path: str, cfg: SimulationConfig, *, progress: bool = True) -> SimulationReport:
    """Run the workload on a store at ``path`` (created if missing; emptied first)."""
    rng = random.Random(cfg.seed)
    report = SimulationReport()
    oracle = _Oracle(cfg)
    now = [_EPOCH]
    clock = lambda: now[0]  # noqa: E731 - the simulated clock
    tick = cfg.tracker.tick_time_ms
    started = time.perf_counter()
    publish_gap_ms = 1000.0 / cfg.rate_per_s
    crash_seq = int(cfg.messages * cfg.crash_at)
    store = open_store(path, durability="sealed")
    tracker = store.tracker(_TRACKER, cfg.tracker, clock)
    tracker.clear()  # a re-run starts from an empty tracker
    next_poll = now[0]

    def deliver(positions: list[tuple[int, int]]) -> None:
        cutoff = now[0] + tick
        for ledger, entry in positions:
            seq = oracle.seq_of(ledger, entry)
            if entry >= cfg.entries_per_ledger or seq >= len(oracle.deliver_at):
                report.phantom += 1
                continue
            if oracle.deliver_at[seq] > cutoff:
                report.early += 1
            if oracle.acked[seq]:
                report.redelivered_filtered += 1
                continue
            oracle.acked[seq] = 1
            report.delivered += 1

    def poll() -> None:
        while True:
            got = tracker.get_scheduled_messages(cfg.poll_max)
            deliver(got)
            if len(got) < cfg.poll_max:
                break
        oracle.advance_mark_delete()
        if oracle.mark_delete_seq:
            tracker.mark_delete(*oracle.position(oracle.mark_delete_seq - 1))

    def observe() -> None:
        st = tracker.stats()
        report.peak_buckets = max(report.peak_buckets, st["immutable_buckets"])
        report.peak_bytes_on_disk = max(report.peak_bytes_on_disk, st["snapshot_size_bytes"])
        report.peak_indexes_on_disk = max(report.peak_indexes_on_disk,
                                          sum(int(b.counts.sum()) for b in tracker.buckets()))

    def harvest_ops() -> None:
        st = tracker.stats()
        report.sealed += st["create"]["succeeded"]
        report.merged += st["merge"]["succeeded"]
        report.deleted += st["delete"]["succeeded"]
        report.segments_loaded += st["load"]["succeeded"]

    step = max(1, cfg.messages // 200)
    try:
        with Progress("publish", cfg.messages, unit="msg", quiet=not progress) as bar:
            for seq in range(cfg.messages):
                now[0] = _EPOCH + int(seq * publish_gap_ms)
                at = now[0] + rng.randrange(cfg.delay_window_ms)
                oracle.deliver_at.append(at)
                oracle.acked.append(0)
                ledger, entry = oracle.position(seq)
                report.published += 1
                if not tracker.add_message(ledger, entry, at):
                    deliver([(ledger, entry)])  # already due: dispatched at once
                if now[0] >= next_poll:
                    poll()
                    next_poll = now[0] + cfg.poll_interval_ms
                if seq % step == 0:
                    observe()
                    bar.update(min(step, cfg.messages - seq))
                if seq == crash_seq and 0 < cfg.crash_at < 1:
                    harvest_ops()
                    # The crash: in-memory state is gone, nothing more is written. In
                    # sealed mode close() writes nothing either, so dropping the tracker
                    # and the store's handles is exactly a crash after the last commit.
                    store.close()
                    t0 = time.perf_counter()
                    store = open_store(path, durability="sealed")
                    tracker = store.tracker("simulate", cfg.tracker, clock)
                    report.recovery_seconds = time.perf_counter() - t0
                    report.recovered_indexes = tracker.number_of_delayed_messages
                    # The broker replays its log from the mark-delete position, skipping
                    # what the consumer already acknowledged individually.
                    for replay in range(oracle.mark_delete_seq, seq + 1):
                        if oracle.acked[replay]:
                            continue
                        if not tracker.add_message(*oracle.position(replay), oracle.deliver_at[replay]):
                            report.dispatched_on_replay += 1
                            deliver([oracle.position(replay)])
                    tracker.replay_done()  # the buckets skipped at the reopen may go now
        # Deliver: simulated time runs on to the stop point; what falls due after it stays held.
        last_due = max(oracle.deliver_at, default=now[0]) + tick + cfg.poll_interval_ms
        end = min(last_due, now[0] + cfg.deliver_for_ms) if cfg.deliver_for_ms >= 0 else last_due
        with Progress("deliver", max(0, end - now[0]) // 1000, unit="sim-sec", quiet=not progress) as bar:
            shown = now[0]
            while now[0] < end:
                now[0] = min(end, now[0] + cfg.poll_interval_ms)
                poll()
                if now[0] - shown >= 1000:
                    bar.update((now[0] - shown) // 1000)
                    shown += (now[0] - shown) // 1000 * 1000
        report.stopped_at_ms = now[0]
        observe()
        harvest_ops()
        tracker.wait_for_maintenance()
        _check_held(tracker, oracle, report)
        report.left_buckets = len(tracker.buckets())
    finally:
        store.close()
    with open_store(path, durability="sealed") as store:
        report.kept_in_store = store.tracker("simulate", cfg.tracker, lambda: report.stopped_at_ms
                                             ).number_of_delayed_messages
    report.max_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report.wall_seconds = time.perf_counter() - started
    return report


def format_report(report: SimulationReport, cfg: SimulationConfig, path: str) -> str:
    per_index = (report.peak_bytes_on_disk / report.peak_indexes_on_disk) if report.peak_indexes_on_disk else 0.0
    lines = [
        f"bucketstore simulate: {path}",
        f"  workload        {cfg.messages:,} messages at {cfg.rate_per_s:,}/s, delays U[0, {cfg.delay_window_ms:,} ms), "
        f"{cfg.entries_per_ledger:,} entries per ledger, crash at {cfg.crash_at:.0%}",
        f"  delivered       {report.delivered:,} of {report.published:,} "
        f"({report.dispatched_on_replay:,} dispatched at once on replay, "
        f"{report.redelivered_filtered:,} redeliveries filtered by acks)",
        f"  buckets         {report.sealed} sealed, {report.merged} merged, {report.deleted} deletions, "
        f"{report.segments_loaded} segment loads, at most {report.peak_buckets} at once",
        f"  on disk         peak {report.peak_bytes_on_disk:,} bytes for {report.peak_indexes_on_disk:,} sealed indexes "
        f"({per_index:.2f} B/index)",
        f"  recovery        {report.recovery_seconds * 1000:.1f} ms, {report.recovered_indexes:,} indexes recovered",
        f"  memory          {report.max_rss_mb:.0f} MB peak RSS (whole process, oracle included)",
        f"  time            {report.wall_seconds:.1f} s",
        f"  held at stop    {report.held:,} not yet due at +{(report.stopped_at_ms - _EPOCH) / 1000:,.0f} s "
        f"(the oracle expects {report.held_expected:,}); {report.left_buckets} sealed bucket(s) left in the store",
        f"  in the store    {report.kept_in_store:,} indexes in sealed buckets (a sealed-mode reopen tracks them; "
        f"those added since the last seal are in the broker's log only)",
        f"  checked         every delivery against the oracle: none early, none phantom, every due message "
        f"delivered, every undelivered one still held",
        f"  violations      {report.violations} (early {report.early}, lost {report.lost}, phantom {report.phantom}, "
        f"held mismatch {report.held_mismatch})",
    ]
    return "\n".join(lines)


def next_steps(path: str) -> str:
    """The commands a newcomer can try next on the store the run left."""
    ledgers = os.path.join(path, "ledgers")
    files = sorted(os.listdir(ledgers)) if os.path.isdir(ledgers) else []
    one = os.path.join(ledgers, files[0]) if files else os.path.join(ledgers, "<file>")
    return "\n".join([
        "",
        "The store keeps its sealed buckets; look inside it:",
        f"  bucketstore stats {path}                 trackers, buckets, indexes, bytes",
        f"  bucketstore catalog {path}               every bucket: ledger range, counts, sizes",
        f"  bucketstore dump {one}   one bucket's segments (--indexes 5: rows too)",
        f"  bucketstore verify {path}                every CRC, order and count checked",
        f"  bucketstore stats {path} --plot due.png  what is due when (pip install -e '.[plot]')",
    ])


def refusal(path: str) -> str | None:
    """Why simulate must not run at ``path`` (it would write among files that are not its
    own), or None: a missing path, an empty directory, or a store whose only tracker is
    simulate's (an earlier run, which starts afresh). Reads only; writes nothing."""
    if not os.path.lexists(path):
        return None
    if not os.path.isdir(path):
        return f"{path}: not a directory; simulate creates its store in a new or empty directory"
    if not is_store(path):
        if os.listdir(path):
            return (f"{path}: {NOT_A_STORE}, and not empty: simulate writes only into a new or empty "
                    "directory, or a store an earlier simulate left")
        return None
    if not os.path.isfile(os.path.join(path, "catalog", "data.mdb")):
        return None  # a store without its catalog: opening it says what is wrong, touching nothing
    others = [name for name in read_catalog_snapshot(os.path.join(path, "catalog")).tracker_names()
              if name != _TRACKER]
    if others:
        shown = ", ".join(repr(name) for name in others[:3]) + (", ..." if len(others) > 3 else "")
        return (f"{path}: a store with trackers other than simulate's ({shown}): simulate reuses only a "
                "store it made; give it a new or empty directory")
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    d, j = SimulationConfig(), JournalSimulationConfig()

    def both(sealed: int, journal: int) -> str:
        return f"(default {sealed:,}; journal mode {journal:,})"

    p.add_argument("store", metavar="STORE",
                   help="a new or empty directory (created if missing), or a store an earlier simulate left, "
                        f"which starts afresh (its {_TRACKER!r} tracker is cleared); anything else (a file, a "
                        "directory of other files, a store with other trackers) is refused and left untouched")
    p.add_argument("--durability", choices=["sealed", "journal"], default="sealed",
                   help="sealed (default here; Pulsar's mode): one crash half way, the broker replays its log "
                        "and calls replay_done(); journal (the library's default): the broker is a child "
                        "process SIGKILLed --kills times and checked after each")
    p.add_argument("--messages", type=int, help=f"messages to publish {both(d.messages, j.messages)}")
    p.add_argument("--rate", type=int, help=f"messages per simulated second {both(d.rate_per_s, j.rate_per_s)}")
    p.add_argument("--delay-window-ms", type=int,
                   help=f"delays are uniform in [0, this) {both(d.delay_window_ms, j.delay_window_ms)}")
    p.add_argument("--entries-per-ledger", type=int,
                   help=f"the log rolls to a new ledger after this many entries "
                        f"{both(d.entries_per_ledger, j.entries_per_ledger)}")
    p.add_argument("--deliver-for-ms", type=int,
                   help="after the last publish, deliver for this much simulated time, then stop and leave "
                        f"the rest held in the store {both(d.deliver_for_ms, j.deliver_for_ms)}; -1 in sealed "
                        "mode: deliver everything")
    p.add_argument("--crash-at", type=float, default=d.crash_at,
                   help="sealed mode: fraction of the run at which to crash and recover (0 = no crash)")
    p.add_argument("--kills", type=int, default=j.kills,
                   help=f"journal mode: SIGKILLs of the broker process ({j.kills})")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_from_args(args: argparse.Namespace) -> int:
    journal = args.durability == "journal"
    base = JournalSimulationConfig() if journal else SimulationConfig()
    knobs = {"messages": "messages", "rate": "rate_per_s", "delay_window_ms": "delay_window_ms",
             "entries_per_ledger": "entries_per_ledger", "deliver_for_ms": "deliver_for_ms"}
    for arg, attr in knobs.items():
        if getattr(args, arg) is not None:
            setattr(base, attr, getattr(args, arg))
    for arg, attr in list(knobs.items())[:4]:
        if getattr(base, attr) < 1:
            print(f"bucketstore: --{arg.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if journal and (base.deliver_for_ms < 0 or args.kills < 0):
        print("bucketstore: --deliver-for-ms and --kills must not be negative in journal mode", file=sys.stderr)
        return 2
    if not 0 <= args.crash_at < 1:
        print("bucketstore: --crash-at must be in [0, 1)", file=sys.stderr)
        return 2
    base.seed = args.seed
    path = os.fspath(args.store)
    refused = refusal(path)
    if refused is not None:
        print(f"bucketstore: {refused}", file=sys.stderr)
        return 2
    if journal:
        base.kills = args.kills
        jreport = run_journal_simulation(path, base, progress=not args.no_progress)
        print(format_journal_report(jreport, base, path))
        violations = jreport.violations
    else:
        base.crash_at = args.crash_at
        report = run_simulation(path, base, progress=not args.no_progress)
        print(format_report(report, base, path))
        violations = report.violations
    print(next_steps(path))
    return 0 if violations == 0 else 1
