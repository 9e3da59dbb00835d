"""What a store must hold after a crash in ``sealed`` mode, computed from its committed catalog.

Shared by the crash-point enumeration and the crash state machine. The oracle
is stated in terms of the catalog state ``S`` that LMDB had committed when the
process died (read from the still-open environment before it is abandoned):

* **may** (no phantom): a recovered position lies in a bucket that ``S`` lists
  (after the enclosing range of an unfinished merge wins) and is not at or
  before ``S``'s mark-delete position;
* **must** (no loss): every index of those buckets whose time is after the
  reopen cutoff is tracked again. Due indexes may be skipped (Pulsar §3.9: the
  embedder replays them), delivered ones may come back (at-least-once), and
  what only the mutable bucket or the queue held was never durable.

It also checks the store's files against its catalog after recovery: every key
names a file that verifies, and nothing else is left in ``ledgers/``.

For ``durability="journal"`` the oracle is exact: :class:`Model` is the
specification of one tracker (what it tracks, at what time, its cutoff), advanced
call by call beside the real tracker; :class:`JournalBounds` pairs the model after
the last call that returned with the model had the call in flight also returned,
and :func:`check_journal_recovered` holds a recovered tracker to them.

>>> from bucketstore.testing import FakeClock, Model
>>> clock = FakeClock(1_000)
>>> model = Model(clock, tick_ms=10)
>>> model.add(3, 1, 1_500), model.add(3, 2, 1_005)   # the second is due already
(True, False)
>>> clock.advance(600)
>>> model.pop(10)
[(3, 1)]
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bucketstore.engine.durability.journal import journal_directory
from bucketstore.format.journal_codec import parse_file
from bucketstore.format.ledger_file import ledger_file_name
from bucketstore.format.snapshot import BucketFile, parse_bucket_key
from bucketstore.checking import check_file

Triple = tuple[int, int, int]  # (deliver_at, ledger, entry)
Position = tuple[int, int]


@dataclass(frozen=True)
class CatalogState:
    """One tracker's committed catalog: bucket key -> ledger id, and the mark-delete position."""

    keys: tuple[tuple[str, int], ...]
    mark_delete: Position | None

    @classmethod
    def read(cls, catalog: Any, tracker: str) -> "CatalogState":
        state = catalog.tracker_state(tracker) or {}
        md = state.get("mark_delete")
        return cls(tuple(sorted(catalog.buckets(tracker).items())), tuple(md) if md else None)

    def diff_kind(self, before: "CatalogState") -> str:
        """Name the atomic operation that turned ``before`` into this state."""
        old, new = dict(before.keys), dict(self.keys)
        added, removed = new.keys() - old.keys(), old.keys() - new.keys()
        if added and removed:
            return "merge"
        if added:
            return "seal"
        if removed:
            return "delete"
        if self.mark_delete != before.mark_delete:
            return "mark-delete"
        return "tracker-state"


@dataclass
class Expectation:
    """The bounds a recovered tracker must meet."""

    must: set[Position] = field(default_factory=set)
    may: set[Position] = field(default_factory=set)
    triples: set[Triple] = field(default_factory=set)  # every index in S's live buckets


def read_bucket(path: Path) -> list[Triple]:
    """Every index of a sealed bucket file, segment by segment."""
    out: list[Triple] = []
    with BucketFile(path) as bf:
        for k in range(1, bf.segment_count + 1):
            seg = bf.read_segment(k)
            out.extend(zip(seg.timestamps.tolist(), seg.ledger_ids.tolist(), seg.entry_ids.tolist()))
    return out


def live_keys(state: CatalogState) -> list[tuple[str, int]]:
    """The keys recovery keeps: a range enclosed by another is a merge leftover."""
    ranges = [(parse_bucket_key(k), k, lid) for k, lid in state.keys]
    return [(k, lid) for (s, e), k, lid in ranges
            if not any((s2, e2) != (s, e) and s2 <= s and e <= e2 for (s2, e2), _, _ in ranges)]


def expect(state: CatalogState, ledgers_dir: Path, cutoff: int) -> Expectation:
    """Bounds for a tracker recovered from ``state`` with the given reopen cutoff.

    Reads the bucket files the state names; call it before crash damage is
    applied (a committed key must name a file that survives any damage, which
    is what the recovery then checks).
    """
    out = Expectation()
    md = state.mark_delete
    for _key, lid in live_keys(state):
        for ts, ledger, entry in read_bucket(ledgers_dir / ledger_file_name(lid)):
            out.triples.add((ts, ledger, entry))
            if md is not None and (ledger, entry) <= md:
                continue
            out.may.add((ledger, entry))
            if ts > cutoff:
                out.must.add((ledger, entry))
    return out


def check_nothing_unreceived_deleted(store: Any, tracker_name: str, state: CatalogState, context: str) -> None:
    """``sealed`` mode: recovery deleted no bucket of ``state`` but a merge's leftovers and those
    whose whole range lies before the mark-delete position's ledger. The segments it skips as
    due were never delivered: their buckets stay until the embedder's ``replay_done()``."""
    first_live = state.mark_delete[0] if state.mark_delete else 0
    kept = store.catalog.buckets(tracker_name)
    for key, lid in live_keys(state):
        if parse_bucket_key(key)[1] >= first_live:
            assert kept.get(key) == lid, f"{context}: recovery deleted bucket {key} (ledger {lid}), " \
                                         f"which mark-delete {state.mark_delete} had not passed"


def check_recovered(tracker: Any, exp: Expectation, universe: set[Position], context: str) -> set[Position]:
    """Assert the recovered tracker meets ``exp``; return the positions it tracks.

    ``universe`` is every position the workload ever added: the count must equal
    the tracked positions found among it, so nothing outside it is tracked.
    """
    tracker._check()
    got = {p for p in universe if tracker.contains_message(*p)}
    assert tracker.number_of_delayed_messages == len(got), \
        f"{context}: count {tracker.number_of_delayed_messages} but {len(got)} positions tracked"
    lost = exp.must - got
    assert not lost, f"{context}: lost {len(lost)} durable, undue indexes, e.g. {sorted(lost)[:5]}"
    phantom = got - exp.may
    assert not phantom, f"{context}: {len(phantom)} phantom indexes, e.g. {sorted(phantom)[:5]}"
    return got


def check_files(store: Any, tracker_name: str, context: str) -> None:
    """After recovery: every key's file exists and verifies; no orphan or temporary file is left."""
    ledgers = Path(store.ledgers_dir)
    referenced = set()
    for key, lid in store.catalog.buckets(tracker_name).items():
        path = ledgers / ledger_file_name(lid)
        assert path.is_file(), f"{context}: key {key} names missing {path.name}"
        findings = check_file(path).findings
        assert not findings, f"{context}: {path.name} does not verify: {[str(f) for f in findings]}"
        referenced.add(path.name)
    on_disk = set(os.listdir(ledgers))
    assert on_disk == referenced, \
        f"{context}: ledgers/ holds {sorted(on_disk - referenced)} beyond the catalog's files"


# -- the journal-mode oracle ------------------------------------------------------------------------
class Model:
    """The specification of one tracker: what is tracked, at what time, and the cutoff.

    ``unconfirmed`` holds the positions delivered by returned calls whose delivery is
    not confirmed yet (``delivery="at-least-once"``: the batches since the last
    ``get_scheduled_messages``, ``flush`` or ``confirm_delivered``), at their times; a
    position tracked again leaves it (its new time replaces its redelivery). After a
    crash or a clean close they are tracked again. ``durable_frontier`` is the largest
    ``(ts, ledger, entry)`` whose delivery is confirmed (in journal mode with
    ``sync_interval_ms=0`` it is durable); with ``at_least_once=False`` every delivery
    is confirmed as it is returned.

    With ``precision_bits`` (``TrackerConfig.precision_bits``) a position is tracked at its
    time rounded down to a multiple of ``2**precision_bits``, or at its exact time when that
    key would sort at or before the delivered frontier (the tracker's rule, which keeps the
    delivered set a prefix of the index order); ``where`` and ``rows`` hold those times.
    """

    def __init__(self, clock: Any, tick_ms: int, rows: dict[Position, int] | None = None,
                 acked: Position | None = None, cutoff: int = -1,
                 durable_frontier: Triple | None = None, at_least_once: bool = True,
                 precision_bits: int = 0) -> None:
        self.clock = clock
        self.tick_ms = tick_ms
        self.precision_bits = precision_bits
        self.where: dict[Position, int] = dict(rows or {})
        self.rows = sorted((ts, ledger, entry) for (ledger, entry), ts in self.where.items())
        self.acked = acked
        self.cutoff = cutoff
        self.durable_frontier = durable_frontier
        self.frontier = durable_frontier  # the largest delivered, confirmed or not
        self.at_least_once = at_least_once
        self.unconfirmed: dict[Position, int] = {}
        self.advance()  # a tracker reads the clock when it is opened

    def copy(self) -> "Model":
        twin = Model.__new__(Model)
        twin.__dict__.update(self.__dict__)
        twin.where, twin.rows = dict(self.where), list(self.rows)  # not advanced: no clock read
        twin.unconfirmed = dict(self.unconfirmed)
        return twin

    @property
    def recoverable(self) -> dict[Position, int]:
        """What a restart brings back: the tracked positions and the unconfirmed deliveries."""
        return {**self.unconfirmed, **self.where}

    def confirm(self) -> None:
        """``confirm_delivered`` (and the start of ``get_scheduled_messages``, ``flush``)."""
        self.unconfirmed.clear()
        self.durable_frontier = self.frontier

    def flush(self) -> None:
        self.confirm()

    def reopened(self) -> None:
        """A clean close and reopen: the unconfirmed deliveries are tracked again."""
        for (ledger, entry), ts in self.unconfirmed.items():
            self.where[(ledger, entry)] = ts
            bisect.insort(self.rows, (ts, ledger, entry))
        self.unconfirmed.clear()

    def advance(self) -> int:
        self.cutoff = max(self.cutoff, self.clock() + self.tick_ms)
        return self.cutoff

    def _remove(self, ledger: int, entry: int) -> None:
        ts = self.where.pop((ledger, entry))
        self.rows.remove((ts, ledger, entry))

    def add(self, ledger: int, entry: int, at: int) -> bool:
        self.advance()
        if self.acked is not None and (ledger, entry) <= self.acked:
            return False  # acknowledged already
        if at <= self.cutoff:
            if (ledger, entry) in self.where:
                self._remove(ledger, entry)  # an expired re-add untracks it
            return False
        if (ledger, entry) not in self.where:
            if self.precision_bits:
                trimmed = at >> self.precision_bits << self.precision_bits
                if self.frontier is None or (trimmed, ledger, entry) > self.frontier:
                    at = trimmed
            self.where[(ledger, entry)] = at
            bisect.insort(self.rows, (at, ledger, entry))
            self.unconfirmed.pop((ledger, entry), None)  # superseded: comes back at its new time
        return True

    def add_batch(self, rows: list[tuple[int, int, int]]) -> int:
        """``add_messages`` of distinct positions: the rows one by one."""
        return sum(self.add(*row) for row in rows)

    def pop(self, n: int) -> list[Position]:
        self.confirm()  # the embedder is back for more
        cutoff = self.advance()
        out = []
        while self.rows and len(out) < n and self.rows[0][0] <= cutoff:
            ts, ledger, entry = self.rows[0]
            self._remove(ledger, entry)
            out.append((ledger, entry))
            self.frontier = max(self.frontier or (ts, ledger, entry), (ts, ledger, entry))
            if self.at_least_once:
                self.unconfirmed[(ledger, entry)] = ts
        if not self.at_least_once:
            self.durable_frontier = self.frontier
        return sorted(out)

    def mark_delete(self, ledger: int, entry: int) -> None:
        # (mark_delete and clear do not read the clock: the tracker's cutoff stays.)
        if self.acked is not None and (ledger, entry) < self.acked:
            return
        self.acked = (ledger, entry)
        for _, l2, e2 in [r for r in self.rows if (r[1], r[2]) <= (ledger, entry)]:
            self._remove(l2, e2)
        for p in [p for p in self.unconfirmed if p <= (ledger, entry)]:
            del self.unconfirmed[p]  # acknowledged: never to come back

    def clear(self) -> None:
        self.where.clear()
        self.rows.clear()
        self.confirm()  # clear forgets unconfirmed deliveries too


@dataclass
class JournalBounds:
    """What a journal-mode tracker recovered after a crash must hold.

    ``before`` is the model after the last call that returned; ``after`` the model
    had the call in flight at the crash also returned (equal when none was). The
    in-flight call may have taken effect in part (a batch that sealed a bucket
    midway, a confirmation not yet synced, a clear whose catalog commit landed).
    What a crash brings back is each model's *recoverable* set (tracked, or
    delivered without confirmation), so:

    * **must** (nothing acknowledged lost, no unconfirmed delivery lost): every
      position recoverable in both;
    * **may** (no phantom, nothing confirmed back): every position recoverable in
      either, at its time there.
    """

    before: Model
    after: Model

    @property
    def must(self) -> set[Position]:
        return self.before.recoverable.keys() & self.after.recoverable.keys()

    @property
    def times(self) -> dict[Position, int]:
        return {**self.before.recoverable, **self.after.recoverable}

    def time_of(self, position: Position, tracker: Any) -> int:
        """The time a recovered position is tracked at. Only an in-flight re-add of an
        unconfirmed delivery leaves two candidates; the re-add landed iff the old row is
        dead (its journaled untrack made the position a ghost, retimed to the new time)."""
        old, new = self.before.recoverable.get(position), self.after.recoverable.get(position)
        if old is None or new is None or old == new:
            return new if new is not None else old
        # The index holds a sealed bucket's positions once the bucket is opened; contains_message
        # does not open it (it answers from a spilled copy), so open it here.
        tracker._open_covering(position[0])
        return new if not tracker._index.is_live(*position, old) else old


@dataclass
class WindowBounds(JournalBounds):
    """:class:`JournalBounds` when confirmations are group-committed (``confirm_sync_ms``):
    the durable state is one of ``window``, the model states since the last journal
    commit (oldest first, ending with ``before``), or the in-flight ``after``. A recovery
    must hold what every one of them can bring back, and nothing none of them can: a batch
    confirmed inside the window may come back.
    """

    window: list[Model] = field(default_factory=list)

    def _states(self) -> list[Model]:
        return [*self.window, self.before, self.after] if self.window else [self.before, self.after]

    @property
    def must(self) -> set[Position]:
        return set.intersection(*(set(m.recoverable) for m in self._states()))

    @property
    def times(self) -> dict[Position, int]:
        out: dict[Position, int] = {}
        for m in self._states():
            out.update(m.recoverable)
        return out

    def time_of(self, position: Position, tracker: Any) -> int:
        # Inside a window nothing is added (an add commits), so a position has one time in
        # it; only the in-flight call may retime it (the base rule decides that case).
        if position in self.before.recoverable or position in self.after.recoverable:
            return super().time_of(position, tracker)
        return self.times[position]

    @property
    def oldest(self) -> Model:
        return self.window[0] if self.window else self.before


def check_journal_recovered(tracker: Any, bounds: JournalBounds, universe: set[Position],
                            context: str) -> set[Position]:
    """Assert the recovered tracker holds every must position and nothing outside may;
    return the positions it tracks."""
    tracker._check()
    got = {p for p in universe if tracker.contains_message(*p)}
    assert tracker.number_of_delayed_messages == len(got), \
        f"{context}: count {tracker.number_of_delayed_messages} but {len(got)} positions tracked"
    lost = bounds.must - got
    assert not lost, f"{context}: lost {len(lost)} acknowledged, undelivered indexes, e.g. {sorted(lost)[:5]}"
    back = got - bounds.times.keys()
    assert not back, (f"{context}: {len(back)} indexes tracked that were delivered, acknowledged or never added, "
                      f"e.g. {sorted(back)[:5]}")
    # The recovered cutoff is the clock's, raised to the durable frontier: never behind
    # what was delivered, never ahead of what the process had reached.
    cutoff = tracker.stats()["cutoff"]
    now = bounds.before.clock() + bounds.before.tick_ms
    fr = (bounds.oldest if isinstance(bounds, WindowBounds) else bounds.before).durable_frontier
    assert cutoff >= now and (fr is None or cutoff >= fr[0]), f"{context}: cutoff {cutoff} behind {now} / {fr}"
    assert cutoff <= max(now, bounds.after.cutoff), f"{context}: cutoff {cutoff} ahead of {bounds.after.cutoff}"
    return got


def reseed(bounds: JournalBounds, got: set[Position], tracker: Any) -> Model:
    """The model of a recovered tracker: what it holds (within the bounds), at the bounds' times."""
    after = bounds.after
    stats = tracker.stats()
    # An in-flight mark_delete may or may not have committed: take the recovered one.
    acked = tuple(stats["mark_delete"]) if stats["mark_delete"] else None
    assert acked in (bounds.before.acked, after.acked), f"recovered mark-delete {acked} was never set"
    # The in-flight call's frontier may not have become durable: keep the returned calls' one.
    durable = (bounds.oldest if isinstance(bounds, WindowBounds) else bounds.before).durable_frontier
    return Model(after.clock, after.tick_ms, {p: bounds.time_of(p, tracker) for p in got}, acked,
                 stats["cutoff"], durable, after.at_least_once, after.precision_bits)


def check_deliveries(tracker: Any, model: Model, context: str) -> None:
    """Deliver what is due now, then everything: exactly the model's rows, each at its time
    (an old row of a re-added position delivered early would show here)."""
    due = model.pop(10**9)
    cutoff = model.cutoff
    got = tracker.get_scheduled_messages(10**9)
    assert got == due, (f"{context}: at cutoff {cutoff} delivered {sorted(set(got) - set(due))[:5]} early / "
                        f"left {sorted(set(due) - set(got))[:5]} due")
    assert tracker.next_delivery_time() == (model.rows[0][0] if model.rows else None), \
        f"{context}: next delivery time"
    assert tracker.number_of_delayed_messages == len(model.where), f"{context}: count after delivering"



def check_journal_files(store_path: Path, tracker: str, context: str) -> None:
    """After recovery the tracker's journal is exactly one file, a complete checkpoint."""
    directory = journal_directory(str(store_path), tracker)
    names = sorted(os.listdir(directory))
    assert len(names) == 1 and names[0].endswith(".journal"), f"{context}: journal directory holds {names}"
    path = os.path.join(directory, names[0])
    with open(path, "rb") as f:
        parsed = parse_file(f.read(), path, int(names[0][:20]), last=True)
    records = parsed.records
    assert parsed.torn_at is None and records and records[0] == ("c",) and ("e",) in records, \
        f"{context}: the journal file does not start with a complete checkpoint"
