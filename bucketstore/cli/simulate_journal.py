"""``bucketstore simulate --durability journal``: a journal-mode broker SIGKILLed again and again.

The broker is a child process (``os.fork``): it publishes ledgers of messages
with random delays (``add_messages``, durable when it returns), moves a
simulated clock and polls for due messages with at-least-once delivery (a
batch is confirmed by the next poll or ``flush``). This process kills it with
SIGKILL at random steps of its clock (read from its side log as it grows, so a
kill lands mid-work however fast the machine), checks the store after each kill, and starts a new
child, which reopens the store (replaying the journal) and goes on where the
side log says the last one stopped. The last child runs to the stop point,
flushes and closes, leaving a backlog held in the store and its journal.

**The side log** is the broker's downstream: one JSON line per event, fsynced
before the child goes on, so that what it says happened did happen:

``{"adding": L, "n": n, "at": t}`` before ``add_messages`` of ledger ``L``'s
    entries ``0..n-1`` (their due times follow from the seed, ``L`` and ``t``);
``{"added": L}`` after it returned: acknowledged to the producer;
``{"got": [[l, e], ...], "batch": b, "at": t}`` after a poll at clock ``t`` returned;
``{"confirming": b}`` / ``{"confirmed": b}`` around the call that confirms batch ``b``;
``{"clock": t}`` before the clock moves; ``{"done": 1}`` after the clean close.

After a kill this process settles what the kill left in doubt by looking in
the store, and writes it down, so later checks hold the outcome:
``{"resolved": L, "present": k}`` for an add that never returned (``k`` of its
positions are held: the producer, never acknowledged, publishes them again on
a new ledger) and ``{"confirmed": b}`` or ``{"unconfirmed": b}`` for a
confirmation the kill interrupted.

**What is checked**, after every kill and at the end: every acknowledged
message that no confirmed batch delivered is still held (nothing lost); no
message of a confirmed batch is held, nor delivered again later (redelivery
only within the documented window: a batch returned but not confirmed when the
child died); no delivery early (its due time is at most the poll's clock plus
one tick); no position delivered or held that was never announced; at the stop,
every due message was delivered and the held count equals the oracle's.
"""

from __future__ import annotations

import os
import random
import select
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from ..config import TrackerConfig
from ..engine.store.store import open_store
from .progress import Progress
from .side_log import SideLog, read_side_log

__all__ = ["JournalSimulationConfig", "JournalSimulationReport", "run_journal_simulation", "format_journal_report"]

_EPOCH = 1_700_000_000_000
_NAME = "simulate"


@dataclass
class JournalSimulationConfig:
    """The workload, the kills and the tracker's settings (smaller than sealed mode's: every add is fsynced)."""

    messages: int = 50_000
    rate_per_s: int = 2_000
    delay_window_ms: int = 120_000
    entries_per_ledger: int = 500
    poll_max: int = 1_000
    deliver_for_ms: int = 60_000
    kills: int = 8
    seed: int = 195
    tracker: TrackerConfig = field(default_factory=lambda: TrackerConfig(
        min_index_count_per_bucket=2_000, max_indexes_per_segment=1_000,
        max_time_step_per_segment_ms=20_000, max_num_buckets=6))


@dataclass
class JournalSimulationReport:
    """What the kills did and what the checks found."""

    acknowledged: int = 0
    kills: int = 0
    kills_in_add: int = 0
    in_doubt_added: int = 0
    in_doubt_dropped: int = 0
    delivered: int = 0
    dispatched_at_once: int = 0
    redelivered_unconfirmed: int = 0
    redelivered_confirmed: int = 0
    held_confirmed: int = 0
    lost: int = 0
    early: int = 0
    phantom: int = 0
    held: int = 0
    held_expected: int = 0
    stopped_at_ms: int = 0
    checks: int = 0
    sealed_buckets: int = 0
    journal_bytes: int = 0
    wall_seconds: float = 0.0

    @property
    def held_mismatch(self) -> int:
        return abs(self.held - self.held_expected)

    @property
    def violations(self) -> int:
        return (self.lost + self.early + self.phantom + self.redelivered_confirmed + self.held_confirmed
                + self.held_mismatch)


def _deliver_at(cfg: JournalSimulationConfig, ledger: int, n: int, at: int) -> list[int]:
    """The due times of ledger ``ledger``'s ``n`` entries published at ``at``: a function of the seed."""
    rng = random.Random(cfg.seed * 1_000_003 + ledger)
    return [at + rng.randrange(cfg.delay_window_ms) for _ in range(n)]


def _tracked_rows(cfg: JournalSimulationConfig, ledger: int, n: int, at: int) -> list[tuple[int, int, int]]:
    """The rows the broker hands to the tracker: those not already due (at or before the cutoff,
    ``at`` plus one tick) when published. The others it dispatches at once, as ``add_message``
    returning False tells it to; they never enter the store."""
    cutoff = at + cfg.tracker.tick_time_ms
    return [(ledger, e, due) for e, due in enumerate(_deliver_at(cfg, ledger, n, at)) if due > cutoff]


@dataclass
class _State:
    """What the side log says so far (the oracle, and where a new child resumes)."""

    due: dict[tuple[int, int], int] = field(default_factory=dict)  # announced position -> due time
    acknowledged: set[tuple[int, int]] = field(default_factory=set)
    confirmed: set[tuple[int, int]] = field(default_factory=set)
    delivered: set[tuple[int, int]] = field(default_factory=set)
    batches: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    in_doubt_add: list[tuple[int, int]] | None = None  # the positions of an add that never returned
    in_doubt_confirm: int | None = None
    acked_count: int = 0  # messages published and acknowledged (those dispatched at once included)
    at_once: int = 0
    next_ledger: int = 0
    clock: int = _EPOCH
    last_batch: int = -1
    last_publish: int | None = None
    done: bool = False


def _replay(cfg: JournalSimulationConfig, records: list[dict[str, Any]],
            report: JournalSimulationReport | None = None) -> _State:
    """Fold the side log into a state; with ``report``, count what deliveries did on the way."""
    s = _State()
    pending: tuple[int, int, int] | None = None
    for r in records:
        if "adding" in r:
            ledger, n, at = r["adding"], r["n"], r["at"]
            for entry, due in enumerate(_deliver_at(cfg, ledger, n, at)):
                s.due[(ledger, entry)] = due
            pending = [(row[0], row[1]) for row in _tracked_rows(cfg, ledger, n, at)]
            s.in_doubt_add = pending
            s.next_ledger = max(s.next_ledger, ledger + 1)
            s.last_publish = at
        elif "added" in r and pending is not None:
            s.acknowledged.update(pending)
            s.acked_count += r["n"]
            s.at_once += r["n"] - len(pending)  # dispatched by the broker itself, once the add returned
            pending, s.in_doubt_add = None, None
        elif "resolved" in r:
            present = r["present"]
            s.acknowledged.update(tuple(p) for p in present)
            if report is not None:
                report.in_doubt_added += len(present)
                report.in_doubt_dropped += r["n"] - len(present)
            pending, s.in_doubt_add = None, None
        elif "clock" in r:
            s.clock = max(s.clock, r["clock"])
        elif "got" in r:
            got = [(p[0], p[1]) for p in r["got"]]
            s.batches[r["batch"]] = got
            s.last_batch = max(s.last_batch, r["batch"])
            if report is not None:
                _judge_batch(cfg, s, got, r["at"], report)
            s.delivered.update(got)
        elif "confirming" in r:
            s.in_doubt_confirm = r["confirming"]
        elif "confirmed" in r:
            s.confirmed.update(s.batches.get(r["confirmed"], ()))
            s.in_doubt_confirm = None
        elif "unconfirmed" in r:
            s.in_doubt_confirm = None
        elif "done" in r:
            s.done = True
    return s


def _judge_batch(cfg: JournalSimulationConfig, s: _State, got: list[tuple[int, int]], at: int,
                 report: JournalSimulationReport) -> None:
    cutoff = at + cfg.tracker.tick_time_ms
    for p in got:
        due = s.due.get(p)
        if due is None:
            report.phantom += 1
            continue
        if due > cutoff:
            report.early += 1
        if p in s.confirmed:
            report.redelivered_confirmed += 1  # beyond the window: never allowed
        elif p in s.delivered:
            report.redelivered_unconfirmed += 1  # returned, not confirmed, then killed: the window
        else:
            report.delivered += 1


# -- the child: the broker -------------------------------------------------------------------------
def _child(path: str, log_path: str, cfg: JournalSimulationConfig, ready: int) -> None:
    s = _replay(cfg, read_side_log(log_path))
    side = SideLog(log_path)
    now = [s.clock]
    # confirm_sync_ms=0: the side log records a confirmation as durable once its call returns,
    # so the broker pays one fsync per confirming poll (grouped confirmations would widen the
    # redelivery window this check allows; tests/crash/test_sigkill.py checks that window).
    store = open_store(path, durability="journal", confirm_sync_ms=0)
    tracker = store.tracker(_NAME, cfg.tracker, lambda: now[0])
    os.write(ready, b"r")
    batch = s.last_batch
    pending: int | None = None  # a batch handed on, not yet confirmed (a new process has none)
    gap_ms = max(1, cfg.entries_per_ledger * 1000 // cfg.rate_per_s)
    ledger, acked = s.next_ledger, s.acked_count
    stop = None if s.last_publish is None or acked < cfg.messages else s.last_publish + cfg.deliver_for_ms

    def poll() -> None:
        nonlocal batch, pending
        while True:
            if pending is not None:
                side.write({"confirming": pending})
            got = tracker.get_scheduled_messages(cfg.poll_max)  # confirms the batch before
            if pending is not None:
                side.write({"confirmed": pending})
                pending = None
            if not got:
                return
            batch += 1
            side.write({"got": got, "batch": batch, "at": now[0]})
            pending = batch
            if len(got) < cfg.poll_max:
                return

    while stop is None or now[0] < stop:
        target = now[0] + gap_ms
        side.write({"clock": target})  # durable before the clock moves: never a poll "in the past"
        now[0] = target
        if acked < cfg.messages:
            n = min(cfg.entries_per_ledger, cfg.messages - acked)
            side.write({"adding": ledger, "n": n, "at": now[0]})
            tracker.add_messages(_tracked_rows(cfg, ledger, n, now[0]))
            side.write({"added": ledger, "n": n})
            ledger, acked = ledger + 1, acked + n
            if acked >= cfg.messages:
                stop = now[0] + cfg.deliver_for_ms
        poll()
    if pending is not None:
        side.write({"confirming": pending})
    tracker.flush()  # confirms the last batch and makes the journal durable
    if pending is not None:
        side.write({"confirmed": pending})
    store.close()
    side.write({"done": 1})


def _fork_child(path: str, log_path: str, cfg: JournalSimulationConfig) -> tuple[int, int]:
    """Start a broker; return (pid, read end of its ready pipe). No store is open here across the fork."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            _child(path, log_path, cfg, w)
        except BaseException:  # noqa: BLE001 - never return into the parent's stack
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


# -- the parent: kills and checks ------------------------------------------------------------------
def _check_store(path: str, log_path: str, cfg: JournalSimulationConfig, report: JournalSimulationReport,
                 *, final: bool) -> None:
    """Open the store as the next broker would and hold it to the side log; settle what was in doubt."""
    s = _replay(cfg, read_side_log(log_path))
    side = SideLog(log_path)
    try:
        with open_store(path, durability="journal", background=False) as store:
            tracker = store.tracker(_NAME, cfg.tracker, lambda: s.clock)
            report.checks += 1
            if s.in_doubt_add is not None:  # the kill cut an add: which of its positions made it?
                present = [[l, e] for l, e in s.in_doubt_add if tracker.contains_message(l, e)]
                side.write({"resolved": 1, "n": len(s.in_doubt_add), "present": present})
                report.kills_in_add += 1
                s.acknowledged.update((l, e) for l, e in present)
            maybe: set[tuple[int, int]] = set()
            if s.in_doubt_confirm is not None:  # the kill cut a confirmation: all of it or none
                maybe = set(s.batches.get(s.in_doubt_confirm, ())) - s.confirmed
                back = {p for p in maybe if tracker.contains_message(*p)}
                if maybe and back == maybe:
                    side.write({"unconfirmed": s.in_doubt_confirm})
                else:
                    side.write({"confirmed": s.in_doubt_confirm})
                    s.confirmed |= maybe
                    report.held_confirmed += len(back)  # a part came back: a torn confirmation
            # Counted per check; a defect seen after one kill is seen after the next ones too: keep the worst.
            must = s.acknowledged - s.confirmed
            report.lost = max(report.lost, sum(1 for p in must if not tracker.contains_message(*p)))
            report.held_confirmed = max(report.held_confirmed,
                                        sum(1 for p in s.confirmed if tracker.contains_message(*p)))
            if final:
                report.held = tracker.number_of_delayed_messages
                report.held_expected = len(must)
                report.stopped_at_ms = s.clock
                # Due by the stop yet never delivered: lost too (the last polls returned all that was due).
                report.lost += sum(1 for p in must if s.due[p] <= s.clock and p not in s.delivered)
                report.lost = max(report.lost, report.held_expected - report.held)
                report.sealed_buckets = len(store.catalog.buckets(_NAME))
    finally:
        side.close()


def _journal_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(os.path.join(path, "journal")):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


class _StepCounter:
    """Counts the broker's clock steps in the side log as it grows (reads only what was appended)."""

    def __init__(self, path: str) -> None:
        self.path, self.offset, self.steps, self._partial = path, 0, 0, b""

    def update(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.steps
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # a line still being written
        self.steps += sum(1 for line in lines if line.startswith(b'{"clock"'))
        return self.steps


def _wait_for_step(pid: int, counter: _StepCounter, step: int | None) -> int | None:
    """Wait for the broker ``pid`` to end (its wait status) or, when ``step`` is given, to reach
    that clock step, where it is SIGKILLed (None)."""
    if step is None:
        return os.waitpid(pid, 0)[1]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if counter.update() >= step:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.001)


def run_journal_simulation(path: str, cfg: JournalSimulationConfig, *,
                           progress: bool = True) -> JournalSimulationReport:
    """Run the workload at ``path`` (emptied first), killing the broker ``cfg.kills`` times."""
    started = time.perf_counter()
    rng = random.Random(cfg.seed)
    report = JournalSimulationReport()
    with open_store(path, durability="journal", background=False) as store:
        store.tracker(_NAME, cfg.tracker).clear()  # a re-run starts from an empty tracker
    # Kills fall at random steps of the broker's simulated clock (one side-log "clock" record a
    # step), not at random wall times: however fast or loaded the machine, each lands mid-work.
    gap_ms = max(1, cfg.entries_per_ledger * 1000 // cfg.rate_per_s)
    steps = -(-cfg.messages // cfg.entries_per_ledger) + cfg.deliver_for_ms // gap_ms
    kill_at = sorted(rng.sample(range(1, steps), min(cfg.kills, steps - 1))) if steps > 1 else []
    with tempfile.TemporaryDirectory(prefix="bucketstore-simulate-") as tmp, \
            Progress("kill+check", len(kill_at) + 1, unit="run", quiet=not progress) as bar:
        log_path = os.path.join(tmp, "side.log")
        progress_seen = _StepCounter(log_path)
        while True:
            pid, ready = _fork_child(path, log_path, cfg)
            try:
                select.select([ready], [], [], 300)
            finally:
                os.close(ready)
            try:
                status = _wait_for_step(pid, progress_seen, kill_at[report.kills] if report.kills < len(kill_at)
                                        else None)
            except BaseException:  # Ctrl-C: leave no broker running behind us
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise
            if status is None:  # killed at its step
                report.kills += 1
                _check_store(path, log_path, cfg, report, final=False)
                bar.update()
                continue
            if os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError(f"the simulated broker failed unkilled (exit status "
                                   f"{os.waitstatus_to_exitcode(status)}; its traceback is above)")
            break
        _check_store(path, log_path, cfg, report, final=True)
        bar.update()
        _replay(cfg, read_side_log(log_path), report)
        final = _replay(cfg, read_side_log(log_path))
        report.acknowledged = final.acked_count
        report.dispatched_at_once = final.at_once
    report.journal_bytes = _journal_bytes(path)
    report.wall_seconds = time.perf_counter() - started
    return report


def format_journal_report(report: JournalSimulationReport, cfg: JournalSimulationConfig, path: str) -> str:
    return "\n".join([
        f"bucketstore simulate --durability journal: {path}",
        f"  workload        {cfg.messages:,} messages at {cfg.rate_per_s:,}/s, delays U[0, {cfg.delay_window_ms:,} ms), "
        f"{cfg.entries_per_ledger:,} per ledger, each add durable on return, at-least-once delivery",
        f"  kills           {report.kills} SIGKILLs of the broker process ({report.kills_in_add} inside an add), "
        f"each followed by a reopen and a check ({report.checks} checks)",
        f"  in doubt        {report.in_doubt_added + report.in_doubt_dropped:,} messages of adds a kill cut "
        f"({report.in_doubt_added:,} found held, {report.in_doubt_dropped:,} not; the producer published them again)",
        f"  delivered       {report.delivered + report.dispatched_at_once:,} of {report.acknowledged:,} acknowledged "
        f"({report.dispatched_at_once:,} at once: due when published); "
        f"{report.redelivered_unconfirmed:,} again after a kill (returned, not yet confirmed: the documented window)",
        f"  held at stop    {report.held:,} not yet due at +{(report.stopped_at_ms - _EPOCH) / 1000:,.0f} s "
        f"(the oracle expects {report.held_expected:,}); {report.sealed_buckets} sealed bucket(s), "
        f"{report.journal_bytes:,} journal bytes left in the store",
        "  checked         after every kill: every acknowledged, unconfirmed message still held, no confirmed one; "
        "over the run: none early, none phantom, none confirmed delivered again, every due one delivered",
        f"  violations      {report.violations} (lost {report.lost}, early {report.early}, phantom {report.phantom}, "
        f"confirmed redelivered {report.redelivered_confirmed}, confirmed held {report.held_confirmed}, "
        f"held mismatch {report.held_mismatch})",
    ])
