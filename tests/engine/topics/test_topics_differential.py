"""Differential test of topics (issue 25): N subscriptions of one topic against N independent
``InMemoryTracker`` s that receive the same adds, call by call.

Every add (through the topic or through any subscription) goes to every model: that is what
"a subscription behaves as an independent tracker that had received the same adds" means.
Random interleavings of adds, re-adds at other times, due adds, deliveries at different clock
times, confirmations, mark-deletes, clears, subscriptions created (``start="latest"``) and
deleted mid-run, restarts of the store after confirming, and reopens without confirming (the
batches returned and not confirmed are then delivered again first, and count as tracked until
they are: the model adds them on top of the independent tracker's answers; a position re-added
before the reopen leaves its batch, one re-added after it stays at its old time, as a journal-mode
tracker's delivery handoff does), with every answer compared. ``BUCKETSTORE_EXAMPLES`` raises the example count.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import bucketstore
from bucketstore import InMemoryTracker, TrackerConfig

from helpers import FakeClock, example_count

LEDGERS, ENTRIES = 3, 5
POSITIONS = [(lg, en) for lg in range(LEDGERS) for en in range(ENTRIES)]

ledger = st.integers(0, LEDGERS - 1)
entry = st.integers(0, ENTRIES - 1)
sub = st.integers(0, 7)
# Mostly a few ms ahead; sometimes a window or two of the ``rows`` table (4.096 s) ahead, so
# deliveries read and cross several windows (engine/topics/topic_windows.py). The clock starts just
# before a window's end.
ahead = st.one_of(st.integers(-5, 40), st.integers(-5, 40), st.sampled_from([4_090, 4_100, 8_200]))
op = st.one_of(
    st.tuples(st.just("add"), st.integers(-1, 7), ledger, entry, ahead),
    st.tuples(st.just("batch"), st.integers(-1, 7), st.lists(st.tuples(ledger, entry, ahead), max_size=6)),
    st.tuples(st.just("advance"), st.one_of(st.integers(0, 15), st.just(4_096))),
    st.tuples(st.just("deliver"), sub, st.integers(0, 4)),
    st.tuples(st.just("confirm"), sub),
    st.tuples(st.just("mark"), sub, ledger, entry),
    st.tuples(st.just("clear"), sub),
    st.tuples(st.just("look"), sub),
    st.tuples(st.just("create"),),
    st.tuples(st.just("delete"), sub),
    st.tuples(st.just("restart"),),
    st.tuples(st.just("reopen"),),
)


class Run:
    def __init__(self, path: str, durability: str, subs: int, tick: int) -> None:
        self.path, self.durability = path, durability
        self.clock = FakeClock(4_080)
        # Few: the topic seals its rows into runs every few adds (docs/topics.md, "Sealed runs"),
        # so the subscriptions read rows from runs and from the tables, and rows gone from runs.
        self.config = TrackerConfig(tick_time_ms=tick, min_index_count_per_bucket=4)
        self.created = 0
        self._open()
        self.subs: dict[str, object] = {}
        self.models: dict[str, InMemoryTracker] = {}
        #: Per subscription, the rows (deliver_at, ledger, entry) of the batch returned last and
        #: not confirmed since, and those a reopen brought back (delivered again first).
        self.unconfirmed: dict[str, list[tuple[int, int, int]]] = {}
        self.redeliver: dict[str, list[tuple[int, int, int]]] = {}
        for _ in range(subs):
            self.create("earliest")

    def _open(self) -> None:
        # "journal-grouped": adds wait for the group commit (sync_interval_ms), as in sealed mode.
        grouped = self.durability == "journal-grouped"
        self.store = bucketstore.open(self.path, durability="journal" if grouped else self.durability,
                                      sync_interval_ms=60_000 if grouped else 0)
        self.topic = self.store.topic("t", config=self.config, clock=self.clock)

    def create(self, start: str) -> None:
        name = f"s{self.created}"
        self.created += 1
        self.subs[name] = self.topic.subscription(name, start=start)
        self.models[name] = InMemoryTracker(self.config, self.clock)
        self.unconfirmed[name], self.redeliver[name] = [], []

    def pick(self, i: int) -> str | None:
        names = sorted(self.subs)
        return names[i % len(names)] if names else None

    def add(self, via: int, rows: list[tuple[int, int, int]]) -> None:
        name = self.pick(via) if via >= 0 else None
        rows = [(lg, en, self.clock() + dt) for lg, en, dt in rows]
        expected = {n: [self.model_add(n, r) for r in rows] for n in self.models}
        if name is None:
            acked_by_all = [bool(self.models) and all(m._mark_delete is not None and (r[0], r[1]) <= m._mark_delete
                                                      for m in self.models.values()) for r in rows]
            due = [r[2] <= max(m._cutoff.value for m in self.models.values()) if self.models else None for r in rows]
            got = [self.topic.add_message(*r) for r in rows] if len(rows) == 1 else None
            if got is not None and self.models:
                assert got == [not d and not a for d, a in zip(due, acked_by_all)]
            if got is None:
                self.topic.add_messages(rows)
        elif len(rows) == 1:
            assert self.subs[name].add_message(*rows[0]) == expected[name][0]
        else:
            assert self.subs[name].add_messages(rows) == sum(expected[name])

    def model_add(self, name: str, row: tuple[int, int, int]) -> bool:
        """The add as subscription ``name`` answers it, the delivery handoff's rows included: a
        position waiting to be delivered again is tracked at its old time (ignored; untracked if
        the add is due), and one of the batch not confirmed that is tracked again leaves it
        (its new time replaces its redelivery), as a tracker's handoff supersedes it."""
        m, pos = self.models[name], row[:2]
        if any(r[1:] == pos for r in self.redeliver[name]):
            if row[2] > m._cutoff.advance():
                return True
            self.redeliver[name] = [r for r in self.redeliver[name] if r[1:] != pos]
        tracked = pos in m._tracked
        answer = m.add_message(*row)
        if answer and not tracked:
            self.unconfirmed[name] = [r for r in self.unconfirmed[name] if r[1:] != pos]
        return answer

    def count(self, name: str) -> int:
        return self.models[name].number_of_delayed_messages + len(self.redeliver[name])

    def look(self, name: str) -> None:
        s, m, again = self.subs[name], self.models[name], self.redeliver[name]
        assert s.number_of_delayed_messages == self.count(name)
        # Rows delivered again come first: they were due before anything the model tracks.
        assert s.next_delivery_time() == (min(r[0] for r in again) if again else m.next_delivery_time())
        assert s.has_message_available() == (bool(again) or m.has_message_available())
        for pos in POSITIONS:
            assert s.contains_message(*pos) == (m.contains_message(*pos) or pos in {r[1:] for r in again}), pos
        last = s.last_delivery_time()
        truth = [*m._tracked.values(), *(r[0] for r in again)]
        assert (last is None) == (not truth)
        if last is not None:
            assert last >= max(truth)  # an upper bound: hold it to the truth

    def deliver(self, name: str, n: int) -> None:
        m, again = self.models[name], self.redeliver[name]
        first, self.redeliver[name] = again[:n], again[n:]
        times = dict(m._tracked)
        rest = m.get_scheduled_messages(n - len(first)) if n > len(first) else []
        assert self.subs[name].get_scheduled_messages(n) == sorted([r[1:] for r in first] + rest)
        self.unconfirmed[name] = first + [(times[p], *p) for p in rest]  # the batch before: confirmed

    def step(self, action: tuple) -> None:
        kind = action[0]
        name = self.pick(action[1]) if kind in ("deliver", "confirm", "mark", "clear", "look", "delete") else None
        if kind in ("deliver", "confirm", "mark", "clear", "look", "delete") and name is None:
            return
        if kind == "add":
            self.add(action[1], [action[2:]])
        elif kind == "batch":
            self.add(action[1], action[2])
        elif kind == "advance":
            self.clock.advance(action[1])
        elif kind == "deliver":
            self.deliver(name, action[2])
        elif kind == "confirm":
            self.subs[name].confirm_delivered()
            self.unconfirmed[name] = []
        elif kind == "mark":
            md = self.models[name]._mark_delete
            if md is None or action[2:] >= md:
                self.redeliver[name] = [r for r in self.redeliver[name] if r[1:] > action[2:]]
                self.unconfirmed[name] = [r for r in self.unconfirmed[name] if r[1:] > action[2:]]  # never back
            self.subs[name].mark_delete(action[2], action[3])
            self.models[name].mark_delete(action[2], action[3])
        elif kind == "clear":
            self.subs[name].clear()
            self.models[name].clear()
            self.unconfirmed[name], self.redeliver[name] = [], []
        elif kind == "look":
            self.look(name)
        elif kind == "create":
            self.create("latest")
        elif kind == "delete":
            self.topic.delete_subscription(name)
            del self.subs[name], self.models[name], self.unconfirmed[name], self.redeliver[name]
        elif kind in ("restart", "reopen"):
            if kind == "restart":
                for n, s in self.subs.items():
                    s.flush()  # confirms: the restart then delivers nothing again
                    self.unconfirmed[n] = []
            self.store.close()  # a close confirms nothing: the batches not confirmed come back
            self._open()
            for n in self.subs:
                self.redeliver[n] = sorted(set(self.redeliver[n]) | set(self.unconfirmed[n]))
                self.unconfirmed[n] = []
            self.subs = {n: self.topic.subscription(n) for n in self.subs}
            assert self.topic.subscriptions() == sorted(self.subs)
        for n, s in self.subs.items():
            assert s.number_of_delayed_messages == self.count(n), (n, action)
        if kind in ("restart", "reopen", "delete"):  # the topic's row count is kept, not counted
            with self.topic._file.read() as txn:  # rows in the tables and in the runs, not gone
                assert self.topic._rows == sum(1 for _ in self.topic._view.rows_after(txn, self.topic._id, None))

    def close(self) -> None:
        self.store.close()


@pytest.mark.parametrize("durability", ["journal", "journal-grouped", "sealed"])
@settings(max_examples=example_count(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=60), subs=st.integers(1, 4), tick=st.sampled_from([0, 3]))
# A batch not confirmed, one of its positions re-added before the reopen (it leaves the batch:
# delivered once, at its new time), another re-added after it (ignored: at its old time), or due.
@example(ops=[("batch", -1, [(1, 1, 5), (1, 2, 5), (1, 3, 5)]), ("advance", 10), ("deliver", 0, 4),
              ("add", 0, 1, 1, 30), ("look", 0), ("reopen",), ("look", 0), ("add", -1, 1, 2, 30),
              ("add", 0, 1, 3, -5), ("look", 0), ("deliver", 0, 4)], subs=2, tick=0)
# The other subscription delivered and confirmed the batch: the re-add after the reopen is a new
# row for it alone.
@example(ops=[("batch", -1, [(1, 1, 5), (1, 2, 5)]), ("advance", 10), ("deliver", 0, 4), ("deliver", 1, 4),
              ("confirm", 1), ("reopen",), ("add", 0, 1, 2, 30), ("look", 0), ("look", 1), ("deliver", 0, 4),
              ("advance", 40), ("look", 0), ("deliver", 0, 4), ("deliver", 1, 4)], subs=2, tick=0)
def test_subscriptions_agree_with_independent_trackers(tmp_path_factory, durability, ops, subs, tick) -> None:
    run = Run(str(tmp_path_factory.mktemp("topic")), durability, subs, tick)
    try:
        for action in ops:
            run.step(action)
        run.clock.advance(8_200)
        for name in list(run.subs):  # drain everything: the same positions, in the same batches
            run.clock.advance(100)
            run.look(name)
            run.deliver(name, 1000)
            run.look(name)
    finally:
        run.close()
