"""Random programs of public calls on one store holding trackers *and* a topic, with reopens.

Each tracker and each subscription is held to an ``InMemoryTracker`` (the reference semantics)
call by call: every answer (``add_message(s)``, ``get_scheduled_messages``, ``wait_scheduled``,
counts, ``contains_message``, ``next_delivery_time``, ``has_message_available``), the names
``store.trackers()``/``store.topics()``/``topic.subscriptions()`` after each reopen, and a drain at
the end. The other tests hold trackers (test_tracker_differential.py) and topics
(test_topics_differential.py) apart; here they share one store, its worker, its journal pool and
its catalog, in journal mode with random store options (background or not, read-ahead, grouped
adds and confirmations, at-most-once, one pending job, a backlog budget of one row), and the
trackers run with small buckets, merging (``max_num_buckets`` 1 and 2) and paging
(``max_resident_ledgers=1``). Trackers and subscriptions are deleted and created mid-run, and a
read-only handle looks beside the writer. Two programs in three use ledger and entry ids at the
edges of 32 and 64 bits.

A reopen either confirms first ("restart": nothing comes back) or not ("reopen"): then, in the
default at-least-once mode, the batches returned and not confirmed are delivered again first and
count as tracked until they are (``redo`` below). A tracker or a subscription that re-adds a
position of its unconfirmed batch tracks it once, at its new time (and after a reopen, a position
coming back is tracked like any other: a re-add keeps its first time, a due one untracks it), as
docs/durability.md and docs/topics.md say.

``BUCKETSTORE_EXAMPLES`` scales the number of programs (default 8, of 80 calls each).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bucketstore
from bucketstore import InMemoryTracker, TrackerConfig

from helpers import FakeClock, example_count

BASE = dict(tick_time_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=3, max_time_step_per_segment_ms=200)
CONFIGS = {
    "t0": TrackerConfig(**BASE, max_resident_ledgers=1),
    "t1": TrackerConfig(**BASE, max_num_buckets=1),
    "t2": TrackerConfig(**{**BASE, "tick_time_ms": 3}, max_num_buckets=2),
}
TOPIC_CONFIG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4)
#: Positions: small ids, or ids at the edges of 32 and 64 bits (bitmaps switch width at 2**32).
NARROW = (list(range(4)), list(range(6)))
WIDE = ([0, 1, 2**40, 2**63 - 1], [0, 1, 2**32 - 1, 2**32, 2**62, 2**63 - 1])
#: One narrow and one wide entry per ledger: a ledger's bitmap empties often and comes back
#: 32-bit beside stale rows of its wide entry (how a wide row was once delivered again).
TWO = ([0, 1, 2**40, 2**63 - 1], [1, 2**40])
STEPS = 80
KINDS = ["add"] * 6 + ["batch"] * 2 + ["advance"] * 3 + ["get"] * 3 + [
    "wait", "confirm", "mark", "clear", "look", "look", "flush", "restart", "reopen",
    "new_sub", "delete_sub", "delete_tracker", "read_only", "stats"]


class MixedRun:
    """One store, its handles (``t0``.. and ``T/<sub>``), and a model per handle."""

    def __init__(self, rnd: random.Random, path: str) -> None:
        self.r, self.path = rnd, path
        self.ledgers, self.entries = rnd.choice([NARROW, WIDE, TWO])
        self.opts = dict(background=rnd.choice([True, False]), confirm_sync_ms=rnd.choice([0, 100]),
                         sync_interval_ms=rnd.choice([0, 0, 30]), max_pending_maintenance=rnd.choice([1, 2]),
                         max_backlog_bytes=rnd.choice([24, 1 << 28]),
                         delivery=rnd.choice(["at-least-once", "at-least-once", "at-most-once"]))
        self.opts["read_ahead"] = self.opts["background"] and rnd.random() < 0.5
        self.clock = FakeClock(rnd.choice([1_000, 4_090]))  # 4_090: just before a topic window ends
        self.models: dict[str, InMemoryTracker] = {}
        #: Per handle, rows (deliver_at, ledger, entry) of the batch returned last, not confirmed,
        #: and those a reopen brings back (delivered again first).
        self.unconfirmed: dict[str, list[tuple[int, int, int]]] = {}
        self.redo: dict[str, list[tuple[int, int, int]]] = {}
        self.handles: dict[str, object] = {}
        self.created = 0
        self._open()
        for name in CONFIGS:
            self._new_tracker(name)
        for _ in range(rnd.randint(1, 3)):
            self._new_sub("earliest")

    def _open(self) -> None:
        self.store = bucketstore.open(self.path, "journal", **self.opts)
        self.topic = self.store.topic("T", TOPIC_CONFIG, clock=self.clock)

    def _track(self, name: str, handle: object, config: TrackerConfig) -> None:
        self.handles[name] = handle
        self.models[name] = InMemoryTracker(config, self.clock)
        self.unconfirmed[name], self.redo[name] = [], []

    def _forget(self, name: str) -> None:
        for table in (self.models, self.unconfirmed, self.redo, self.handles):
            del table[name]

    def _new_tracker(self, name: str) -> None:
        self._track(name, self.store.tracker(name, CONFIGS[name], clock=self.clock), CONFIGS[name])

    def _new_sub(self, start: str) -> None:
        name = f"T/s{self.created}"
        self.created += 1
        self._track(name, self.topic.subscription(name[2:], start=start), TOPIC_CONFIG)

    def subs(self) -> list[str]:
        return sorted(n for n in self.models if n.startswith("T/"))

    def trackers(self) -> list[str]:
        return sorted(n for n in self.models if not n.startswith("T/"))

    # -- the model's answers -------------------------------------------------------------------
    def _model_add(self, name: str, row: tuple[int, int, int]) -> bool:
        model, position = self.models[name], row[:2]
        acked = model._mark_delete is not None and position <= model._mark_delete
        if not acked and position in {u[1:] for u in self.redo[name]}:
            # A position coming back after a reopen is tracked like any other: a re-add keeps its
            # first time, a due one untracks it.
            if row[2] <= model._cutoff.advance():
                self.redo[name] = [u for u in self.redo[name] if u[1:] != position]
                return False
            return True
        tracked = model.add_message(*row)
        if tracked:
            # Re-added before its batch was confirmed: it comes back once, at its new time.
            self.unconfirmed[name] = [u for u in self.unconfirmed[name] if u[1:] != position]
        return tracked

    def count(self, name: str) -> int:
        return self.models[name].number_of_delayed_messages + len(self.redo[name])

    # -- the calls -----------------------------------------------------------------------------
    def add(self, target: str, rows: list[tuple[int, int, int]]) -> None:
        names = self.subs() if target.startswith("T") else [target]  # the topic's add is every sub's
        expected = {n: [self._model_add(n, row) for row in rows] for n in names}
        if target == "T":
            if len(rows) == 1:
                self.topic.add_message(*rows[0])
            else:
                self.topic.add_messages(rows)
            return
        handle = self.handles[target]
        if len(rows) == 1:
            assert handle.add_message(*rows[0]) == expected[target][0], (target, rows)
        else:
            assert handle.add_messages(rows) == sum(expected[target]), (target, rows)

    def deliver(self, name: str, n: int, wait: bool) -> None:
        model, again = self.models[name], self.redo[name]
        first, self.redo[name] = again[:n], again[n:]
        times = dict(model._tracked)
        rest = model.get_scheduled_messages(n - len(first)) if n > len(first) else []
        handle = self.handles[name]
        got = handle.wait_scheduled(n, timeout=0) if wait else handle.get_scheduled_messages(n)
        assert got == sorted([r[1:] for r in first] + rest), (name, n)
        self.unconfirmed[name] = first + [(times[p], *p) for p in rest]

    def look(self, name: str) -> None:
        handle, model, again = self.handles[name], self.models[name], self.redo[name]
        assert handle.number_of_delayed_messages == self.count(name), name
        assert handle.next_delivery_time() == (min(r[0] for r in again) if again else model.next_delivery_time())
        assert handle.has_message_available() == (bool(again) or model.has_message_available())
        back = {r[1:] for r in again}
        for ledger in self.ledgers:
            for entry in self.entries:
                expect = model.contains_message(ledger, entry) or (ledger, entry) in back
                assert handle.contains_message(ledger, entry) == expect, (name, ledger, entry)

    def mark(self, name: str, ledger: int, entry: int) -> None:
        previous = self.models[name]._mark_delete
        if previous is None or (ledger, entry) >= previous:
            self.redo[name] = [u for u in self.redo[name] if u[1:] > (ledger, entry)]
            self.unconfirmed[name] = [u for u in self.unconfirmed[name] if u[1:] > (ledger, entry)]
        self.handles[name].mark_delete(ledger, entry)
        self.models[name].mark_delete(ledger, entry)

    def reopen(self, confirm: bool) -> None:
        if confirm:
            for name, handle in self.handles.items():
                handle.confirm_delivered() if self.r.random() < 0.5 else handle.flush()
                self.unconfirmed[name] = []
        self.store.close()  # a close confirms nothing
        self._open()
        assert self.store.trackers() == self.trackers()
        assert self.store.topics() == ["T"]
        assert self.topic.subscriptions() == [s[2:] for s in self.subs()]
        comes_back = self.opts["delivery"] == "at-least-once"
        for name in list(self.handles):
            if comes_back:
                self.redo[name] = sorted(set(self.redo[name]) | set(self.unconfirmed[name]))
            self.unconfirmed[name] = []
            self.handles[name] = (self.topic.subscription(name[2:]) if name.startswith("T/")
                                  else self.store.tracker(name, CONFIGS[name], clock=self.clock))

    def read_only(self) -> None:
        with bucketstore.open(self.path, read_only=True) as view:
            assert view.trackers() == self.trackers() and view.topics() == ["T"]
            view.topic_stats("T")
            if self.opts["sync_interval_ms"] == 0:  # every acknowledged add is durable: it is seen
                for name in self.trackers():
                    tracker = view.tracker(name)
                    assert all(tracker.contains_message(*p) for p in self.models[name]._tracked), name
                    tracker.peek_scheduled(5)

    def step(self) -> None:
        r = self.r
        kind = r.choice(KINDS)
        names = sorted(self.models)
        name = r.choice(names) if names else None
        target = r.choice(names + ["T"])

        def row() -> tuple[int, int, int]:
            ahead = r.choice([r.randint(-5, 40), r.randint(-5, 40), 4_096, 8_200, r.randint(0, 600)])
            return r.choice(self.ledgers), r.choice(self.entries), self.clock() + ahead

        if kind == "add":
            self.add(target, [row()])
        elif kind == "batch":
            self.add(target, [row() for _ in range(r.randint(0, 8))])
        elif kind == "advance":
            self.clock.advance(r.choice([0, 5, 15, 50, 300, 4_096]))
        elif kind in ("get", "wait") and name:
            self.deliver(name, r.randint(0, 6), wait=kind == "wait")
        elif kind in ("confirm", "flush") and name:
            self.handles[name].confirm_delivered() if kind == "confirm" else self.handles[name].flush()
            self.unconfirmed[name] = []
        elif kind == "mark" and name:
            self.mark(name, r.choice(self.ledgers), r.choice(self.entries))
        elif kind == "clear" and name:
            self.handles[name].clear()
            self.models[name].clear()
            self.unconfirmed[name], self.redo[name] = [], []
        elif kind == "look" and name:
            self.look(name)
        elif kind == "new_sub":
            self._new_sub("latest")  # sees what is added from now on, as a new tracker would
        elif kind == "delete_sub" and self.subs():
            sub = r.choice(self.subs())
            self.topic.delete_subscription(sub[2:])
            self._forget(sub)
        elif kind == "delete_tracker" and self.trackers():
            tracker = r.choice(self.trackers())
            self.store.delete_tracker(tracker)
            self._forget(tracker)
            if r.random() < 0.7:
                self._new_tracker(tracker)  # the same name again: a new, empty tracker
        elif kind == "stats":
            self.store.stats()
            self.topic.stats()
            for handle in self.handles.values():
                handle.stats()
        elif kind == "read_only":
            self.read_only()
        elif kind in ("restart", "reopen"):
            self.reopen(confirm=kind == "restart")
        for n, handle in self.handles.items():
            assert handle.number_of_delayed_messages == self.count(n), (kind, n)

    def finish(self) -> None:
        self.clock.advance(10**7)
        for name in sorted(self.handles):
            self.deliver(name, 10**6, wait=False)
            assert self.handles[name].number_of_delayed_messages == 0
        self.store.close()


@settings(max_examples=example_count(8), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_trackers_and_subscriptions_in_one_store_agree_with_in_memory_trackers(tmp_path_factory, seed) -> None:
    run = MixedRun(random.Random(seed), str(tmp_path_factory.mktemp("mixed") / "s"))
    try:
        for _ in range(STEPS):
            run.step()
        run.finish()
    finally:
        run.store.close()
