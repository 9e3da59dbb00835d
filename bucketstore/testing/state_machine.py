"""Hypothesis state machines that crash a tracker at random I/O calls: base classes to subclass.

Needs hypothesis (``pip install 'bucketstore[testing]'``; the ``test`` extra has it too).

:class:`CrashMachine` (``durability="sealed"``) and :class:`JournalCrashMachine`
(``durability="journal"``) run one tracker on a
:class:`~bucketstore.testing.faults.FaultyFileSystem`. Their rules add indexes (one by
one and in batches, across rolling ledgers so that buckets seal), move the clock, take
due indexes, acknowledge (mark-delete), flush, clear, arm a crash at a random upcoming durable
call (or crash right now) under a random damage mode, and reopen cleanly.

:class:`BackgroundCrashMachine` and :class:`BackgroundJournalCrashMachine` run seals and
merges as background jobs on a :class:`~bucketstore.testing.stepped_worker.SteppedWorker`;
their ``background_work`` rule lets the next job write its file, install, or all pending
jobs finish, or nothing run, at random points between the other rules and the crashes, and
``background_work_second`` has the job behind the oldest write its file first, as the store's
second maintenance thread may. :class:`BackgroundMergingCrashMachine` and
:class:`BackgroundMergingJournalCrashMachine` merge too (``max_num_buckets=2``), so a seal and a
merge are in flight together.

Between restarts the tracker must match the reference
:class:`~bucketstore.testing.oracle.Model` exactly. At a restart (crash or clean reopen)
the recovered tracker must meet the oracle's bounds: in sealed mode those of the catalog
state committed at that moment (no phantom, no durable undue index lost); in journal
mode :class:`~bucketstore.testing.oracle.JournalBounds` (nothing acknowledged lost,
nothing delivered by a returned call back). The model is then reseeded with what was
recovered, and a new lifetime begins. Invariants after every step: the count equals the
model's, ``contains_message`` agrees on every position ever added, the tracker's
``_check()`` holds, and no position is delivered twice within one lifetime.

An embedder subclasses one of them and adds rules for their own layer, running each
tracker call through :meth:`CrashMachine.step` with the model's version of it, so a
crash inside the call is checked like any other::

    class NackingMachine(JournalCrashMachine):
        @rule(delay=st.integers(1, 500))
        def nack_a_delivery(self, delay):
            # The consumer rejects a message it was handed: the embedder tracks it again, later.
            if self.delivered:
                position = min(self.delivered)
                at = self.clock.now + delay
                ok, tracked = self.step(lambda: self.tracker.add_message(*position, at),
                                        lambda model: model.add(*position, at))
                if ok and tracked:
                    self.delivered.discard(position)

    TestNacking = NackingMachine.TestCase
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bucketstore import TrackerConfig
from bucketstore.engine.store.store import Store
from bucketstore.testing.clock import FakeClock
from bucketstore.testing.faults import DAMAGES, Damage, FaultyFileSystem, SimulatedCrash, abandon_store
from bucketstore.testing.stepped_worker import SteppedWorker
from bucketstore.testing.oracle import (CatalogState, JournalBounds, Model, WindowBounds, check_files,
                                        check_journal_files,
                                        check_journal_recovered, check_nothing_unreceived_deleted, check_recovered,
                                        expect, reseed)

T = TypeVar("T")
NAME = "sub"
CONFIG = TrackerConfig(tick_time_ms=10, min_index_count_per_bucket=4, max_indexes_per_segment=3,
                       max_time_step_per_segment_ms=100)


class CrashMachine(RuleBasedStateMachine):
    """Random operations, crashes and reopens of one sealed-mode tracker.

    What a subclass's rules may use:

    :ivar tracker: the open tracker (replaced at every restart).
    :ivar store: its store, on the faulty layer ``fs``.
    :ivar model: the :class:`~bucketstore.testing.oracle.Model` of what it holds.
    :ivar clock: the :class:`~bucketstore.testing.clock.FakeClock` both read.
    :ivar base: the embedder's current ledger id (batches roll it forward).
    :ivar universe: every position ever added: add yours before adding them.
    :ivar delivered: the positions delivered in this lifetime (since the last restart).
    :ivar path: the store directory.
    """

    DURABILITY = "sealed"
    DELIVERY = "at-least-once"
    #: The tracker's configuration (small buckets and segments: a few adds seal).
    CONFIG = CONFIG
    #: True: seals and merges are background jobs on a :class:`SteppedWorker`, run by the
    #: ``background_work`` rule (or when the tracker waits for them); False: the synchronous design.
    BACKGROUND = False
    #: The store's backlog limit in background runs (adds wait, running jobs, when it is full).
    MAX_PENDING = 4
    #: The store's ``confirm_sync_ms``: 0, so that a returned confirmation is durable and the
    #: oracle exact (a wall-clock window would make the crash images depend on timing).
    CONFIRM_SYNC_MS = 0

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="bucketstore-sm-"))
        self.path = self.dir / "store"
        self.clock = FakeClock(1_000)
        self.base = 1  # the embedder's current ledger
        self.universe: set[tuple[int, int]] = set()
        self.damage: Damage = DAMAGES[0]
        self.seed = 0
        self.restarts = 0
        self.crashes_in_ops = 0
        self.seals = 0
        self.bg_steps = 0
        self.in_flight: Model | None = None
        self._open(FaultyFileSystem())
        self.model = Model(self.clock, self.CONFIG.tick_time_ms, at_least_once=self.DELIVERY == "at-least-once",
                           precision_bits=self.CONFIG.precision_bits)

    # -- plumbing ------------------------------------------------------------------------------
    def _open(self, fs: FaultyFileSystem) -> None:
        self.fs = fs
        #: The stepped worker of a background machine (None otherwise).
        self.worker = SteppedWorker(calls=lambda: fs.calls) if self.BACKGROUND else None
        self.store = Store(self.path, durability=self.DURABILITY, fs=fs, delivery=self.DELIVERY,
                           confirm_sync_ms=self.CONFIRM_SYNC_MS,
                           background=self.BACKGROUND, maintenance=self.worker,
                           max_pending_maintenance=self.MAX_PENDING, read_ahead=False)
        fs.attach(self.store.catalog)
        self.tracker = self.store.tracker(NAME, self.CONFIG, self.clock)
        self.delivered: set[tuple[int, int]] = set()  # in this lifetime

    def _die_and_reopen(self, crashed: bool) -> str:
        """Die under the armed damage (or close cleanly), reopen with a fresh faulty layer;
        return the context string that names this restart in failures."""
        self.seals += self._seals()
        self.bg_steps += self._background_steps()
        context = f"restart {self.restarts} ({'crash, ' + str(self.damage) if crashed else 'clean'})"
        if crashed:
            abandon_store(self.store)
            self.fs.materialize(self.damage, random.Random(self.seed))
        else:
            self.store.close()
        self.restarts += 1
        self._open(FaultyFileSystem())
        return context

    def _background_steps(self) -> int:
        return len(self.worker.history) if self.worker is not None else 0

    def _seals(self) -> int:
        return sum(1 for op, _ in self.fs.log if op == "rename")

    def _restart(self, crashed: bool) -> None:
        """Die (or close cleanly), reopen, check the recovery, reseed the model."""
        committed = CatalogState.read(self.store.catalog, NAME)
        cutoff = self.clock.now + self.CONFIG.tick_time_ms
        exp = expect(committed, self.path / "ledgers", cutoff)
        context = self._die_and_reopen(crashed)
        if self.DURABILITY == "sealed":
            check_nothing_unreceived_deleted(self.store, NAME, committed, context)
        got = check_recovered(self.tracker, exp, self.universe, context)
        times = {(ledger, entry): ts for ts, ledger, entry in exp.triples}
        self.model = Model(self.clock, self.CONFIG.tick_time_ms, {p: times[p] for p in got}, committed.mark_delete,
                           precision_bits=self.CONFIG.precision_bits)

    def _call(self, fn: Callable[[], T]) -> tuple[bool, T | None]:
        """Run a tracker call; on a simulated crash, restart and report that it did not complete."""
        try:
            return True, fn()
        except SimulatedCrash:
            self.crashes_in_ops += 1
            self._restart(crashed=True)
            return False, None

    def _step(self, call: Callable[[], T], apply: Callable[[Model], object]) -> tuple[bool, T | None]:
        """Run a tracker call and the model's version of it; if it returns, the results must agree
        and the model moves on; if the process dies in it, ``in_flight`` holds what the model
        would have become (the journal oracle's at-least-once window)."""
        after = self.model.copy()
        expected = apply(after)
        self.in_flight = after
        ok, result = self._call(call)
        self.in_flight = None
        if ok:
            assert result == expected, f"tracker returned {result!r}, the model {expected!r}"
            self.model = after
        return ok, result

    def step(self, call: Callable[[], T], apply: Callable[[Model], object]) -> tuple[bool, T | None]:
        """Run one tracker call and the model's version of it, surviving a crash inside the call.

        ``apply`` gets a copy of the model and returns what the call must return. If
        the call returns, its result must equal ``apply``'s and the copy becomes the
        model; if the simulated process dies inside it, the store is reopened and the
        recovery checked against the model before and after the call.

        :param call: the tracker call, e.g. ``lambda: self.tracker.add_message(1, 2, at)``.
        :param apply: the same operation on a :class:`~bucketstore.testing.oracle.Model`.
        :return: ``(True, result)`` if the call returned, ``(False, None)`` if it crashed.
        """
        return self._step(call, apply)

    def teardown(self) -> None:
        event(f"restarts: {min(self.restarts, 3)}+, crashes mid-operation: {min(self.crashes_in_ops, 2)}+, "
              f"seals: {min(self.seals + self._seals(), 3)}+"
              + (f", background half-steps: {min(self.bg_steps + self._background_steps(), 6)}+"
                 if self.BACKGROUND else ""))
        abandon_store(self.store)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- rules ---------------------------------------------------------------------------------
    @initialize(ledgers=st.integers(0, 4), spread=st.integers(50, 800))
    def start(self, ledgers: int, spread: int) -> None:
        """Begin with a few sealed buckets (most examples), so crashes have files to hit."""
        for _ in range(ledgers):
            self.add_batch_next_ledger(0, 6, spread)

    @rule(ledger=st.integers(-3, 2), entry=st.integers(0, 30), delay=st.integers(-20, 600))
    def add(self, ledger: int, entry: int, delay: int) -> None:
        position = (max(0, self.base + ledger), entry)
        at = self.clock.now + delay
        self.universe.add(position)
        ok, result = self._step(lambda: self.tracker.add_message(*position, at), lambda m: m.add(*position, at))
        if ok and result:
            self.delivered.discard(position)  # tracked anew: delivering it again is right

    @rule(data=st.data(), delay=st.integers(1, 600))
    def re_add_delivered(self, data: st.DataObject, delay: int) -> None:
        """Track a position delivered in this lifetime again, due later (in journal mode often
        before its delivery is confirmed: its new time must replace its redelivery)."""
        if not self.delivered:
            return
        position = data.draw(st.sampled_from(sorted(self.delivered)))
        at = self.clock.now + self.CONFIG.tick_time_ms + delay
        ok, result = self._step(lambda: self.tracker.add_message(*position, at), lambda m: m.add(*position, at))
        if ok and result:
            self.delivered.discard(position)

    @rule(first=st.integers(0, 40), count=st.integers(1, 12), spread=st.integers(1, 800))
    def add_batch_next_ledger(self, first: int, count: int, spread: int) -> None:
        """A batch for the next ledger: the log rolls over, which seals the mutable bucket."""
        self.base += 1
        rows = [(self.base, first + i, self.clock.now + 15 + (i * 37) % spread) for i in range(count)]
        self.universe.update((r[0], r[1]) for r in rows)
        ok, _ = self._step(lambda: self.tracker.add_messages(rows), lambda m: m.add_batch(rows))
        if ok:
            self.delivered.difference_update((r[0], r[1]) for r in rows if (r[0], r[1]) in self.model.where)

    @precondition(lambda self: self.model.where)
    @rule(pick=st.integers(0, 2**16), later=st.integers(1, 600))
    def expire_tracked(self, pick: int, later: int) -> None:
        """Re-add a tracked position with a time already due (it is untracked and dispatched
        by the caller), then again with a later time (tracked anew): the row it had may still
        sit in a sealed bucket, which must neither come back nor shadow the new one."""
        positions = sorted(self.model.where)
        position = positions[pick % len(positions)]
        due = self.clock.now - 1
        ok, _ = self._step(lambda: self.tracker.add_message(*position, due), lambda m: m.add(*position, due))
        if not ok:
            return
        at = self.clock.now + self.CONFIG.tick_time_ms + later
        ok, result = self._step(lambda: self.tracker.add_message(*position, at), lambda m: m.add(*position, at))
        if ok and result:
            self.delivered.discard(position)

    @rule(by=st.integers(1, 3))
    def roll_ledger(self, by: int) -> None:
        self.base += by

    @rule(ms=st.integers(-30, 400))
    def tick(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(n=st.integers(0, 20))
    def get_scheduled(self, n: int) -> None:
        ok, got = self._step(lambda: self.tracker.get_scheduled_messages(n), lambda m: m.pop(n))
        if ok:
            assert not self.delivered & set(got), "a position was delivered twice in one lifetime"
            self.delivered |= set(got)

    @rule(back=st.integers(0, 4), entry=st.integers(0, 30))
    def mark_delete(self, back: int, entry: int) -> None:
        position = (max(0, self.base - back), entry)
        self._step(lambda: self.tracker.mark_delete(*position), lambda m: m.mark_delete(*position))

    @rule()
    def flush(self) -> None:
        self._step(self.tracker.flush, lambda m: m.flush())

    @rule()
    def clear(self) -> None:
        """Forget everything (with background work in flight: its jobs are cancelled)."""
        ok, _ = self._step(self.tracker.clear, lambda m: m.clear())
        if ok:
            self.delivered.clear()

    @rule()
    def replay_done(self) -> None:
        """The embedder's replay is done: buckets held for it may go (tracked indexes do not change)."""
        self._step(self.tracker.replay_done, lambda m: None)

    @rule()
    def confirm_delivered(self) -> None:
        self._step(self.tracker.confirm_delivered, lambda m: m.confirm())

    @rule(after=st.integers(0, 12), damage=st.sampled_from(DAMAGES), seed=st.integers(0, 2**16))
    def arm_crash(self, after: int, damage: Damage, seed: int) -> None:
        """Die before the ``after``-th durable call from now (whichever operation makes it;
        a seal makes six, a bucket delete three)."""
        self.fs.crash_at = self.fs.calls + after
        self.damage, self.seed = damage, seed

    @rule(damage=st.sampled_from(DAMAGES), seed=st.integers(0, 2**16))
    def crash_now(self, damage: Damage, seed: int) -> None:
        self.fs.crash()
        self.damage, self.seed = damage, seed
        self._restart(crashed=True)

    @rule()
    def reopen(self) -> None:
        if self.worker is not None and self.worker.pending:
            # A clean close finishes the pending jobs first (an armed crash may hit them):
            # do that as a step of its own, so the restart below is a clean one.
            ok, _ = self._call(lambda: self.tracker.wait_for_maintenance())
            if not ok:
                return
        self._restart(crashed=False)

    @precondition(lambda self: self.worker is not None and self.worker.pending)
    @rule(how=st.sampled_from(["work", "install", "all", "nothing"]))
    def background_work(self, how: str) -> None:
        """Let the background worker run, or stall, at a random point: the next job's
        off-lock part only (its file written, not installed), its install, every pending
        job, or nothing (the other rules run meanwhile; a crash may come at any of them).
        The tracker must match the model whatever is in flight."""
        worker = self.worker
        assert worker is not None
        run = {"work": worker.work, "install": worker.install, "all": worker.run_all, "nothing": lambda: None}[how]
        event(f"background: {how} ({worker.pending} pending, head {'written' if worker.head_worked else 'queued'})")
        self._step(lambda: (run(), None)[1], lambda m: None)

    @precondition(lambda self: self.worker is not None and self.worker.pending)
    @rule()
    def background_step(self) -> None:
        """The worker makes one half-step: the next job writes its file, or installs it."""
        worker = self.worker
        assert worker is not None
        self._step(lambda: (worker.step(), None)[1], lambda m: None)

    @precondition(lambda self: self.worker is not None and self.worker.pending >= 2 and not self.worker.worked(1))
    @rule()
    def background_work_second(self) -> None:
        """The job behind the oldest pending one writes its file before the oldest installs, as
        the store's second maintenance thread may (two seals, a seal beside a merge); it
        installs after the oldest all the same."""
        worker = self.worker
        assert worker is not None
        head, second = worker.pending_kinds()[:2]
        event(f"background: a {second}'s work beside a {'written' if worker.head_worked else 'queued'} {head}")
        self._step(lambda: (worker.work(1), None)[1], lambda m: None)

    @precondition(lambda self: self.worker is not None and self.worker.pending)
    @rule(written=st.booleans(), count=st.integers(4, 10), spread=st.integers(1, 800))
    def start_second_job(self, written: bool, count: int, spread: int) -> None:
        """Hold one job and start a second beside it: install the oldest jobs until a merge (with
        merges on) is one of the two oldest or one job is left, write the oldest's file if
        ``written``, roll the ledger twice if no job is behind it (a seal queues), and write
        the file of the job behind the oldest first."""
        worker = self.worker
        assert worker is not None
        while worker.pending > 1 and "merge" not in worker.pending_kinds()[:2]:
            ok, _ = self._step(lambda: (worker.install(), None)[1], lambda m: None)
            if not ok:
                return  # crashed: the machine restarted
        if written and not self._step(lambda: (worker.work(), None)[1], lambda m: None)[0]:
            return
        if worker.pending < 2:
            self.add_batch_next_ledger(0, count, spread)
            self.add_batch_next_ledger(0, 1, spread)  # rolls over: the mutable bucket's rows seal
        if self.worker is worker and worker.pending >= 2 and not worker.worked(1):
            self.background_work_second()

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def matches_model(self) -> None:
        self.tracker._check()
        assert self.tracker.number_of_delayed_messages == len(self.model.where)
        for position in self.universe:
            assert self.tracker.contains_message(*position) == (position in self.model.where), position



class JournalCrashMachine(CrashMachine):
    """The same rules with ``durability="journal"`` (``sync_interval_ms=0``) and the exact journal oracle.

    At a restart the recovered tracker must hold every position the model could
    bring back after the last call that returned — tracked, or delivered and not yet
    confirmed (``delivery="at-least-once"``) — and nothing the model could not bring
    back before or after the call in flight (nothing whose delivery a returned call
    confirmed, nothing acknowledged or never added); a clean reopen must recover
    exactly the tracked and unconfirmed positions (a close does not confirm). The
    cutoff comes back raised to the durable frontier, so a clock that went back
    cannot re-admit an index due before it.
    """

    DURABILITY = "journal"

    @rule(ms=st.integers(50, 1000), damage=st.sampled_from(DAMAGES), seed=st.integers(0, 2**16))
    def crash_with_clock_behind(self, ms: int, damage: Damage, seed: int) -> None:
        """Die, and come back with a clock behind the last delivery: the frontier must keep
        the cutoff, or an index due before it would be tracked behind it."""
        self.clock.advance(-min(ms, self.clock.now - 1_000))  # epoch times stay positive
        self.crash_now(damage, seed)

    def _bounds(self) -> JournalBounds:
        return JournalBounds(self.model, self.in_flight or self.model)

    def _restart(self, crashed: bool) -> None:
        bounds = self._bounds()
        context = self._die_and_reopen(crashed)
        got = check_journal_recovered(self.tracker, bounds, self.universe, context)
        if not crashed:
            assert got == self.model.recoverable.keys(), f"{context}: a clean reopen changed the tracked set"
        check_files(self.store, NAME, context)
        check_journal_files(self.path, NAME, context)
        self.model = reseed(bounds, got, self.tracker)


class BackgroundCrashMachine(CrashMachine):
    """:class:`CrashMachine` with seals and merges as background jobs (``background=True``) on a
    :class:`~bucketstore.testing.stepped_worker.SteppedWorker`, run or stalled by the
    ``background_work`` rule between the other operations and crashes."""

    BACKGROUND = True


class BackgroundJournalCrashMachine(JournalCrashMachine):
    """:class:`JournalCrashMachine` with background seals and merges (see :class:`BackgroundCrashMachine`)."""

    BACKGROUND = True


#: The machines' configuration with merges (more than two buckets merge).
MERGING_CONFIG = dataclasses.replace(CONFIG, max_num_buckets=2)


class BackgroundMergingCrashMachine(BackgroundCrashMachine):
    """:class:`BackgroundCrashMachine` with merges (``max_num_buckets=2``): a merge is planned by
    the install that leaves three buckets, so merges and seals are pending together, and the
    ``background_work_second`` rule runs a seal's write beside a merge's (either one first)."""

    CONFIG = MERGING_CONFIG
    #: A batch that finds two jobs pending installs the oldest first: buckets pile up, merges come.
    MAX_PENDING = 2


class BackgroundMergingJournalCrashMachine(BackgroundJournalCrashMachine):
    """:class:`BackgroundJournalCrashMachine` with merges (see :class:`BackgroundMergingCrashMachine`)."""

    CONFIG = MERGING_CONFIG
    MAX_PENDING = 2


class JournalGroupedConfirmCrashMachine(JournalCrashMachine):
    """The journal machine with grouped confirmations (``confirm_sync_ms`` longer than any
    run: a confirmation is durable only with the next add, flush, checkpoint, bucket
    deletion or close). The oracle is :class:`~bucketstore.testing.oracle.WindowBounds`
    over the model states since the last journal commit, read off the file layer's log: a
    batch confirmed inside the window may come back, nothing acknowledged may be lost."""

    CONFIRM_SYNC_MS = 10**9

    def _open(self, fs: FaultyFileSystem) -> None:
        super()._open(fs)
        self._log_at = 0
        #: Model states since the last journal commit, before the current one (a fresh open
        #: checkpointed: empty).
        self.window: list[Model] = []

    def _journal_committed(self) -> bool:
        log = self.fs.log
        done = any(op in ("fsync", "rename") and "journal" in str(target) for op, target in log[self._log_at:])
        self._log_at = len(log)
        return done

    def _step(self, call: Callable[[], T], apply: Callable[[Model], object]) -> tuple[bool, T | None]:
        before = self.model
        ok, result = super()._step(call, apply)
        if ok:
            # A commit inside the call made some state from ``before`` on durable.
            self.window = [before] if self._journal_committed() else [*self.window, before]
        return ok, result

    def _bounds(self) -> JournalBounds:
        return WindowBounds(self.model, self.in_flight or self.model, window=list(self.window))

    def _commit_pending(self) -> None:
        with self.tracker._lock:
            self.tracker._commit()

    def _restart(self, crashed: bool) -> None:
        if not crashed and self.tracker._journal.has_pending:
            # A clean close commits the pending confirmations: do that as a step of its own,
            # so that an armed crash hits it as a crash of a call, not inside the close.
            ok, _ = self._step(self._commit_pending, lambda model: None)
            if not ok:
                return
        confirmed_back = bool(self.window) and crashed
        before = set(self.model.recoverable)
        super()._restart(crashed)
        if confirmed_back and set(self.model.recoverable) - before:
            event("a batch confirmed inside the window came back")


class JournalAtMostOnceCrashMachine(JournalCrashMachine):
    """The journal machine with ``delivery="at-most-once"``: a delivery is confirmed as it
    returns, so nothing a returned call delivered ever comes back (and the model's
    recoverable set is just what it tracks)."""

    DELIVERY = "at-most-once"


class JournalPrecisionCrashMachine(JournalCrashMachine):
    """The journal machine with ``precision_bits=5``: times are trimmed to multiples of 32 ms,
    so an add due within a step can trim to a key at or before the delivery frontier (it
    must then keep its exact time, or recovery takes it as delivered)."""

    CONFIG = dataclasses.replace(CONFIG, precision_bits=5)
