"""``bucketstore simulate``: a realistic delayed-message workload, checked against an oracle.

A simulated broker lives a day: it publishes messages into a log of rolling
ledgers at a fixed rate, each with a random delay inside a window (as
``pulsar-perf produce -dr`` does); a consumer polls for due messages every few
milliseconds of simulated time and acknowledges what it receives; the
mark-delete position follows the acknowledgements. On the way the broker is
stopped for longer than every delay and restarted, crashes and recovers, sees
its clock step forward at once, and has a second subscription cleared,
acknowledged far ahead with one ``mark_delete`` and deleted, each followed by a
reopen. After every restart it replays its log from the mark-delete position,
as Pulsar's dispatcher does in ``sealed`` durability, and says so
(``replay_done``): until then the buckets whose segments recovery skipped as
already due are kept. Every event ends with a check of the whole tracker
against the oracle. (The run opens the store with ``durability="sealed"``;
``--durability journal`` runs the journal-mode simulation instead.)

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
import tempfile
import time
from dataclasses import dataclass, field, replace

from ..config import TrackerConfig
from ..engine.catalog.catalog import read_catalog_snapshot
from ..engine.store.store import open_store
from ..engine.tracker.tracker import BucketTracker
from .progress import Progress
from ..checking.store_check import NOT_A_STORE, is_store
from .simulate_journal import JournalSimulationConfig, format_journal_report, run_journal_simulation
from .simulate_topics import TopicSimulation, format_topic_report, run_topic_simulation

__all__ = ["SimulationConfig", "SimulationReport", "run_simulation", "add_arguments", "run_from_args",
           "refusal"]

_EPOCH = 1_700_000_000_000
#: The one tracker simulate writes (in both modes): a store holding others is not simulate's.
_TRACKER = "simulate"
_SIDE = "simulate-side"  # the second subscription, cleared and deleted during the day


@dataclass
class SimulationConfig:
    """The workload: sizes, rates and the tracker's settings."""

    messages: int = 300_000
    rate_per_s: int = 5_000
    delay_window_ms: int = 600_000
    entries_per_ledger: int = 5_000
    poll_interval_ms: int = 100
    poll_max: int = 2_000
    #: the day's events, as fractions of the publishing (0: skip the event)
    long_stop_at: float = 0.2
    side_at: float = 0.35
    crash_at: float = 0.5
    clock_step_at: float = 0.65
    look_at: float = 0.8
    #: how far the clock jumps at ``clock_step_at`` (-1: a fifth of the delay window)
    clock_step_ms: int = -1
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
    #: Rows the left buckets' files hold, delivered ones included until their bucket goes: the
    #: figure ``bucketstore stats`` prints as "indexes".
    rows_in_files: int = 0
    #: What a sealed-mode reopen at the stop tracks: the sealed part of the backlog (what was
    #: added since the last seal lives in the broker's log only, as sealed mode promises).
    kept_in_store: int = 0
    restarts: int = 0
    #: one line per event of the day and its check against the oracle
    steps: list[str] = field(default_factory=list)
    #: checks at which the tracker's count differed from the oracle's
    step_mismatches: int = 0
    #: what the second subscription still held after its clear, mark-delete or deletion
    side_violations: int = 0
    #: differences between the read-only view, a checkpoint of the live store and the oracle
    look_violations: int = 0

    @property
    def held_mismatch(self) -> int:
        """Held by the tracker at the stop beyond what the oracle says is undelivered (should be 0)."""
        return abs(self.held - self.held_expected)

    @property
    def violations(self) -> int:
        return (self.early + self.lost + self.phantom + self.step_mismatches + self.side_violations
                + self.look_violations)


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


class _Broker:
    """The simulated broker: its store, its subscription's tracker, the clock and the log.

    Every step of the day is a method; each ends with :meth:`check`, which holds
    the tracker to the oracle at that moment.
    """

    def __init__(self, path: str, cfg: SimulationConfig, oracle: _Oracle, report: SimulationReport) -> None:
        self.path, self.cfg, self.oracle, self.report = path, cfg, oracle, report
        self.now = _EPOCH
        self.skew = 0  # simulated time the broker spent stopped or the clock jumped
        self.store = open_store(path, durability="sealed")
        for earlier in set(self.store.trackers()) & {_TRACKER, _SIDE}:
            # A re-run starts afresh: clear() would keep the earlier run's mark-delete position.
            self.store.delete_tracker(earlier)
        self.tracker = self.store.tracker(_TRACKER, cfg.tracker, self.clock)
        self.ops: dict[str, int] = {"create": 0, "merge": 0, "delete": 0, "load": 0}

    def clock(self) -> int:
        return self.now

    # -- the consumer ---------------------------------------------------------------------------
    def deliver(self, positions: list[tuple[int, int]]) -> None:
        cfg, oracle, report = self.cfg, self.oracle, self.report
        cutoff = self.now + cfg.tracker.tick_time_ms
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

    def poll(self) -> None:
        """Take every due message, acknowledge it, and move the mark-delete position."""
        while True:
            got = self.tracker.get_scheduled_messages(self.cfg.poll_max)
            self.deliver(got)
            if len(got) < self.cfg.poll_max:
                break
        self.oracle.advance_mark_delete()
        if self.oracle.mark_delete_seq:
            self.tracker.mark_delete(*self.oracle.position(self.oracle.mark_delete_seq - 1))

    def observe(self) -> None:
        st = self.tracker.stats()
        report = self.report
        report.peak_buckets = max(report.peak_buckets, st["immutable_buckets"])
        report.peak_bytes_on_disk = max(report.peak_bytes_on_disk, st["snapshot_size_bytes"])
        report.peak_indexes_on_disk = max(report.peak_indexes_on_disk,
                                          sum(int(b.counts.sum()) for b in self.tracker.buckets()))

    def harvest_ops(self) -> None:
        """Add this tracker handle's operation counts to the report (a handle starts from zero)."""
        st = self.tracker.stats()
        for op in self.ops:
            self.ops[op] += st[op]["succeeded"]
        self.report.sealed, self.report.merged = self.ops["create"], self.ops["merge"]
        self.report.deleted, self.report.segments_loaded = self.ops["delete"], self.ops["load"]

    # -- the producer ---------------------------------------------------------------------------
    def publish(self, seq: int, delay: int) -> None:
        at = self.now + delay
        self.oracle.deliver_at.append(at)
        self.oracle.acked.append(0)
        self.report.published += 1
        ledger, entry = self.oracle.position(seq)
        if not self.tracker.add_message(ledger, entry, at):
            self.deliver([(ledger, entry)])  # already due: dispatched at once

    # -- the day's events -----------------------------------------------------------------------
    def restart(self, *, stopped_for_ms: int = 0) -> float:
        """Stop the broker, let ``stopped_for_ms`` pass, start it again; returns the open's seconds.

        In ``sealed`` durability a clean close writes nothing either, so a crash and
        a clean stop leave the same store: sealed buckets only. The broker then does
        what Pulsar's dispatcher does: it replays its log from the mark-delete
        position (skipping what the consumer acknowledged one by one), and tells the
        tracker the replay is done, which lets go of the buckets recovery skipped.
        """
        self.harvest_ops()
        self.store.close()
        self.now += stopped_for_ms
        self.skew += stopped_for_ms
        t0 = time.perf_counter()
        self.store = open_store(self.path, durability="sealed")
        self.tracker = self.store.tracker(_TRACKER, self.cfg.tracker, self.clock)
        seconds = time.perf_counter() - t0
        oracle = self.oracle
        for seq in range(oracle.mark_delete_seq, len(oracle.deliver_at)):
            if oracle.acked[seq]:
                continue
            if not self.tracker.add_message(*oracle.position(seq), oracle.deliver_at[seq]):
                self.report.dispatched_on_replay += 1
                self.deliver([oracle.position(seq)])
        self.tracker.replay_done()
        self.report.restarts += 1
        return seconds

    def check(self, step: str) -> None:
        """Hold the tracker to the oracle now: every message not received is held and not due.

        A message the consumer never received is *lost* if the tracker no longer
        holds it, or if it was due by now (the last poll should have delivered it);
        the tracker's count must equal the oracle's.
        """
        self.poll()
        oracle, tracker = self.oracle, self.tracker
        expected = lost = 0
        for seq, received in enumerate(oracle.acked):
            if received:
                continue
            expected += 1
            if oracle.deliver_at[seq] <= self.now or not tracker.contains_message(*oracle.position(seq)):
                lost += 1
        held = tracker.number_of_delayed_messages
        self.report.lost += lost
        self.report.held, self.report.held_expected = held, expected
        if held != expected:
            self.report.step_mismatches += 1
        self.report.steps.append(f"{step}: {held:,} held (oracle {expected:,}), {lost} lost")

    def side_tracker_day(self) -> None:
        """A second subscription is cleared, then acknowledged far ahead with one mark-delete.

        Both are bulk deletions of sealed buckets followed by a reopen: the
        catalog must open again, the side tracker must come back empty, and the
        main tracker must not notice. The side tracker is deleted at the end.
        """
        cfg = self.cfg
        # Sized to the run: a few buckets of at most the main tracker's size, whatever --messages says.
        per_bucket = max(10, min(cfg.tracker.min_index_count_per_bucket, cfg.messages // 40))
        side_config = replace(cfg.tracker, min_index_count_per_bucket=per_bucket)
        side = self.store.tracker(_SIDE, side_config, self.clock)
        rng = random.Random(cfg.seed + 1)
        first_ledger = 1 + len(self.oracle.deliver_at) // cfg.entries_per_ledger + 1_000
        n = 4 * per_bucket
        per_ledger = max(1, per_bucket // 2)

        def fill() -> tuple[int, int]:
            last = (first_ledger, 0)
            for i in range(n):
                last = (first_ledger + i // per_ledger, i % per_ledger)
                side.add_message(*last, self.now + cfg.tracker.tick_time_ms + 1 + rng.randrange(cfg.delay_window_ms))
            side.wait_for_maintenance()
            return last

        fill()
        buckets = len(side.buckets())
        side.clear()
        cleared = side.number_of_delayed_messages
        self.restart()
        side = self.store.tracker(_SIDE, side_config, self.clock)
        after_clear = side.number_of_delayed_messages + len(side.buckets())
        last = fill()
        buckets_md = len(side.buckets())
        side.mark_delete(*last)
        acked = side.number_of_delayed_messages
        self.restart()
        side = self.store.tracker(_SIDE, side_config, self.clock)
        after_md = side.number_of_delayed_messages + len(side.buckets())
        self.store.delete_tracker(_SIDE)
        self.restart()
        gone = _SIDE not in self.store.trackers()
        bad = cleared + after_clear + acked + after_md + (0 if gone else 1)
        self.report.side_violations += bad
        self.report.steps.append(
            f"second subscription: {n:,} added ({buckets} buckets), clear(), reopen: {after_clear} held; "
            f"{n:,} added ({buckets_md} buckets), one mark_delete past them all, reopen: {after_md} held; "
            f"deleted: {'gone' if gone else 'STILL THERE'}")


    def look_beside_the_writer(self) -> None:
        """An operator looks while the broker runs: a read-only open and a checkpoint.

        The read-only view takes no lock and changes nothing; a checkpoint copies the live
        store; opened as a store (what a crash now would leave), the copy must answer as the
        view does: the same count and the same next batch. Every position the view says is
        due was published and is due by the oracle; the writer sees no change.
        """
        self.tracker.wait_for_maintenance()  # a seal landing between the two looks would part them
        before = self.tracker.number_of_delayed_messages
        with open_store(self.path, read_only=True) as ro:
            view = ro.tracker(_TRACKER, clock=self.clock)
            held, peek = view.number_of_delayed_messages, view.peek_scheduled(self.cfg.poll_max)
        with tempfile.TemporaryDirectory(prefix="bucketstore-simulate-") as tmp:
            copy_path = os.path.join(tmp, "checkpoint")
            self.store.checkpoint(copy_path)
            with open_store(copy_path, durability="sealed") as copy:
                twin = copy.tracker(_TRACKER, self.cfg.tracker, self.clock)
                copy_held, copy_batch = twin.number_of_delayed_messages, twin.get_scheduled_messages(self.cfg.poll_max)
        cutoff = self.now + self.cfg.tracker.tick_time_ms
        oracle = self.oracle
        strangers = sum(1 for ledger, entry in peek
                        if entry >= self.cfg.entries_per_ledger or oracle.seq_of(ledger, entry) >= len(oracle.deliver_at)
                        or oracle.deliver_at[oracle.seq_of(ledger, entry)] > cutoff)
        bad = (held != copy_held) + (peek != copy_batch) + strangers + (self.tracker.number_of_delayed_messages != before)
        self.report.look_violations += bad
        self.report.steps.append(
            f"read-only open beside the writer: {held:,} held, next batch of {len(peek):,}; a checkpoint of the "
            f"live store opens with {copy_held:,} and the same batch: {'yes' if peek == copy_batch else 'NO'}; "
            f"writer unchanged: {'yes' if self.tracker.number_of_delayed_messages == before else 'NO'}")


def run_simulation(path: str, cfg: SimulationConfig, *, progress: bool = True) -> SimulationReport:
    """Run a broker's day on a store at ``path`` (created if missing; the tracker emptied first).

    The day: publishing with random delays while the consumer polls; a long stop
    (longer than every delay) and a restart; a crash and a recovery; the clock
    stepping forward at once; a second subscription cleared and acknowledged far
    ahead; then delivery up to the stop point, which leaves a backlog held. Each
    event ends with a check against the oracle (``report.steps``).
    """
    rng = random.Random(cfg.seed)
    report = SimulationReport()
    oracle = _Oracle(cfg)
    started = time.perf_counter()
    publish_gap_ms = 1000.0 / cfg.rate_per_s
    tick = cfg.tracker.tick_time_ms
    events = {int(cfg.messages * at): name for name, at in
              (("long stop", cfg.long_stop_at), ("second subscription", cfg.side_at), ("crash", cfg.crash_at),
               ("clock step", cfg.clock_step_at), ("look", cfg.look_at)) if 0 < at < 1}
    broker = _Broker(path, cfg, oracle, report)
    next_poll = broker.now
    step = max(1, cfg.messages // 200)
    try:
        with Progress("publish", cfg.messages, unit="msg", quiet=not progress) as bar:
            for seq in range(cfg.messages):
                broker.now = _EPOCH + broker.skew + int(seq * publish_gap_ms)
                broker.publish(seq, rng.randrange(cfg.delay_window_ms))
                if broker.now >= next_poll:
                    broker.poll()
                    next_poll = broker.now + cfg.poll_interval_ms
                if seq % step == 0:
                    broker.observe()
                    bar.update(min(step, cfg.messages - seq))
                event = events.get(seq)
                if event == "crash":
                    # In sealed mode a clean close writes nothing, so this is a crash after the last commit.
                    report.recovery_seconds = broker.restart()
                    report.recovered_indexes = broker.tracker.number_of_delayed_messages
                    broker.check(f"crash at {cfg.crash_at:.0%}, recovery in {report.recovery_seconds * 1000:.1f} ms "
                                 f"and the log replayed")
                elif event == "long stop":
                    gap = cfg.delay_window_ms + 60_000
                    broker.restart(stopped_for_ms=gap)
                    broker.check(f"stopped {gap // 1000:,} s (longer than every delay), restarted")
                elif event == "clock step":
                    jump = cfg.clock_step_ms if cfg.clock_step_ms >= 0 else cfg.delay_window_ms // 5
                    broker.now += jump
                    broker.skew += jump
                    broker.check(f"clock stepped {jump / 1000:,.0f} s forward at once")
                elif event == "second subscription":
                    broker.side_tracker_day()
                    broker.check("main subscription after the second one's deletions")
                elif event == "look":
                    broker.look_beside_the_writer()
                if event is not None:
                    next_poll = broker.now
        # Deliver: simulated time runs on to the stop point; what falls due after it stays held.
        last_due = max(oracle.deliver_at, default=broker.now) + tick + cfg.poll_interval_ms
        end = min(last_due, broker.now + cfg.deliver_for_ms) if cfg.deliver_for_ms >= 0 else last_due
        with Progress("deliver", max(0, end - broker.now) // 1000, unit="sim-sec", quiet=not progress) as bar:
            shown = broker.now
            while broker.now < end:
                broker.now = min(end, broker.now + cfg.poll_interval_ms)
                broker.poll()
                if broker.now - shown >= 1000:
                    bar.update((broker.now - shown) // 1000)
                    shown += (broker.now - shown) // 1000 * 1000
        report.stopped_at_ms = broker.now
        broker.observe()
        broker.harvest_ops()
        broker.tracker.wait_for_maintenance()
        broker.check("stop")
        left = broker.tracker.buckets()
        report.left_buckets = len(left)
        report.rows_in_files = sum(int(b.counts.sum()) for b in left)
    finally:
        broker.store.close()
    with open_store(path, durability="sealed") as store:
        report.kept_in_store = store.tracker(_TRACKER, cfg.tracker, lambda: report.stopped_at_ms
                                             ).number_of_delayed_messages
    report.max_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report.wall_seconds = time.perf_counter() - started
    return report


def format_report(report: SimulationReport, cfg: SimulationConfig, path: str) -> str:
    per_index = (report.peak_bytes_on_disk / report.peak_indexes_on_disk) if report.peak_indexes_on_disk else 0.0
    lines = [
        f"bucketstore simulate: {path}",
        f"  workload        {cfg.messages:,} messages at {cfg.rate_per_s:,}/s, delays U[0, {cfg.delay_window_ms:,} ms), "
        f"{cfg.entries_per_ledger:,} entries per ledger, sealed durability (the broker replays its log)",
        f"  delivered       {report.delivered:,} of {report.published:,} "
        f"({report.dispatched_on_replay:,} dispatched at once on replay, "
        f"{report.redelivered_filtered:,} redeliveries filtered by acks)",
        f"  buckets         {report.sealed} sealed, {report.merged} merged, {report.deleted} deletions, "
        f"{report.segments_loaded} segment loads, at most {report.peak_buckets} at once",
        f"  on disk         peak {report.peak_bytes_on_disk:,} bytes for {report.peak_indexes_on_disk:,} sealed indexes "
        f"({per_index:.2f} B/index)",
        f"  recovery        {report.recovery_seconds * 1000:.1f} ms after the crash, {report.recovered_indexes:,} "
        f"indexes recovered; {report.restarts} restarts in all",
        f"  memory          {report.max_rss_mb:.0f} MB peak RSS (whole process, oracle included)",
        f"  time            {report.wall_seconds:.1f} s",
        "  the day, each event checked against the oracle:",
        *(f"    {i}. {step}" for i, step in enumerate(report.steps, 1)),
        f"  held at stop    {report.held:,} not yet due at +{(report.stopped_at_ms - _EPOCH) / 1000:,.0f} s "
        f"(the oracle expects {report.held_expected:,}); {report.left_buckets} sealed bucket(s) left in the store",
        f"  in the store    {report.kept_in_store:,} undelivered indexes in sealed buckets (a sealed-mode reopen "
        f"tracks them; those added since the last seal are in the broker's log only); the files hold "
        f"{report.rows_in_files:,} rows, delivered ones included until their bucket is deleted ('stats' counts those)",
        f"  checked         every delivery against the oracle: none early, none phantom, every due message "
        f"delivered, every undelivered one still held",
        f"  violations      {report.violations} (early {report.early}, lost {report.lost}, phantom {report.phantom}, "
        f"held mismatches {report.step_mismatches}, second subscription {report.side_violations}, "
        f"read-only view {report.look_violations})",
    ]
    return "\n".join(lines)


def next_steps(path: str, stopped_at_ms: int | None = None) -> str:
    """The commands a newcomer can try next on the store the run left.

    :param stopped_at_ms: the simulated clock at the stop, for the read-only peek of a
        sealed-mode store: by the real clock (years later) a sealed-mode view skips every
        segment as due, as Pulsar's recovery does, and shows nothing.
    """
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
        f"  bucketstore checkpoint {path} {path}-copy   a consistent copy, even beside a live writer",
        "From Python, without changing a byte (no lock, no recovery that writes):",
        f"  python -c \"import bucketstore; t = bucketstore.open({path!r}, read_only=True).tracker('{_TRACKER}'"
        + ("" if stopped_at_ms is None else f", clock=lambda: {stopped_at_ms}")
        + "); print(t.number_of_delayed_messages, t.next_delivery_time(), t.peek_scheduled(3))\"",
    ])


#: Where ``bucketstore simulate`` puts its store when no STORE is given (relative to the
#: working directory): the demo needs no argument, and a second run reuses it.
DEFAULT_STORE = "demo-store"


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
              if name not in (_TRACKER, _SIDE)]
    if others:
        shown = ", ".join(repr(name) for name in others[:3]) + (", ..." if len(others) > 3 else "")
        return (f"{path}: a store with trackers other than simulate's ({shown}): simulate reuses only a "
                "store it made; give it a new or empty directory")
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    d, j = SimulationConfig(), JournalSimulationConfig()

    def both(sealed: int, journal: int) -> str:
        return f"(default {sealed:,}; journal mode {journal:,})"

    p.add_argument("store", metavar="STORE", nargs="?", default=DEFAULT_STORE,
                   help=f"default ./{DEFAULT_STORE}: a new or empty directory (created if missing), or a store an "
                        "earlier simulate left, "
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
    p.add_argument("--subscriptions", type=int, default=0,
                   help="N >= 1: simulate one topic with N subscriptions instead (one lagging), each checked "
                        "against an independent in-memory tracker (docs/topics.md)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _run_topics(path: str, base: SimulationConfig, args: argparse.Namespace) -> int:
    if args.subscriptions < 1:
        print("bucketstore: --subscriptions must be at least 1", file=sys.stderr)
        return 2
    sim = TopicSimulation(subscriptions=args.subscriptions, messages=base.messages, rate_per_s=base.rate_per_s,
                          delay_window_ms=base.delay_window_ms, entries_per_ledger=base.entries_per_ledger,
                          durability=args.durability, seed=args.seed)
    run_topic_simulation(path, sim, progress=not args.no_progress)
    print(format_topic_report(sim, path))
    return 0 if sim.mismatches == 0 else 1


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
    if args.subscriptions:
        return _run_topics(path, base, args)
    if journal:
        base.kills = args.kills
        jreport = run_journal_simulation(path, base, progress=not args.no_progress)
        print(format_journal_report(jreport, base, path))
        violations, stopped_at = jreport.violations, None
    else:
        base.crash_at = args.crash_at
        report = run_simulation(path, base, progress=not args.no_progress)
        print(format_report(report, base, path))
        violations, stopped_at = report.violations, report.stopped_at_ms
    print(next_steps(path, stopped_at))
    return 0 if violations == 0 else 1
