"""A topic's per-subscription figures (``held_rows``, ``due_undelivered``, ``oldest_due_age_ms``)
by range scans (``engine/topics/topic_figures.py``) equal the pass over every row they replaced
(``bucketstore.testing.topic_oracle``), on random topics; and a scrape reads the due rows and
the windows held, not every row once per subscription. ``BUCKETSTORE_EXAMPLES`` raises the
example count.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.topics import topic_reader, topic_rows
from bucketstore.engine.topics.topic_reader import describe_topics
from bucketstore.format.topic_codec import MAX_KEY
from bucketstore.testing.topic_oracle import scan_figures

from helpers import SUBSCRIPTION_ACTIONS, FakeClock, act_on_subscription, example_count

CFG = TrackerConfig(tick_time_ms=0)
FIGURES = ("held_rows", "due_undelivered", "oldest_due_age_ms")

position = st.tuples(st.integers(0, 1), st.integers(0, 2))  # few: re-adds make positions with several rows
# Delivery times a few ms to ~20 s ahead: several 4.096 s windows of the ``rows`` table, some
# whole inside a range counted, some holding its bounds; repeated times share a window.
ahead = st.one_of(st.integers(1, 40), st.integers(1, 20_000), st.sampled_from([4_096, 8_192, 8_193]))
sub = st.integers(0, 5)
op = st.one_of(
    st.tuples(st.just("add"), position, ahead),
    st.tuples(st.just("add"), position, ahead),
    st.tuples(st.just("advance"), st.integers(0, 9_000)),
    st.tuples(st.just("deliver"), sub, st.integers(1, 6)),
    st.tuples(st.just("mark"), sub, position),
    st.tuples(st.just("clear"), sub),
    st.tuples(st.just("create"), st.sampled_from(["earliest", "latest"])),
    st.tuples(st.just("delete"), sub),
    st.tuples(st.just("reopen"),),
    # One subscription delivers a position and adds it again while the others still track it:
    # a position with two rows, each subscription seeing one.
    st.tuples(st.just("readd"), sub, position, ahead),
)


def check(path, clock, topic) -> None:
    fast = describe_topics(path, now_ms=clock())
    slow = scan_figures(path, now_ms=clock())
    assert set(fast) == set(slow)
    for name, doc in fast.items():
        assert doc["rows"] == slow[name]["rows"]
        got = {s: {k: fig[k] for k in FIGURES} for s, fig in doc["subscriptions"].items()}
        assert got == slow[name]["subscriptions"]
    live = topic.stats()["subscriptions"]  # the open topic's own figures, by the same functions
    assert {s: fig["held_rows"] for s, fig in live.items()} == {
        s: fig["held_rows"] for s, fig in slow["t"]["subscriptions"].items()}


# ``sealed``: the topic seals its rows into runs every few adds (docs/topics.md, "Sealed runs"),
# so the figures count rows in runs, in the tables, and rows gone from runs.
@pytest.mark.parametrize("config", [CFG, TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4)],
                         ids=["level", "sealed"])
@settings(max_examples=example_count(100), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(first=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 99), ahead), max_size=40),
       ops=st.lists(op, min_size=5, max_size=40), subs=st.integers(2, 4))
def test_range_scan_figures_equal_a_full_scan(tmp_path_factory, config, first, ops, subs) -> None:
    path = tmp_path_factory.mktemp("figures")
    clock = FakeClock(100_000)
    store = bucketstore.open(path)
    topic = store.topic("t", config=config, clock=clock)
    handles = {f"s{i}": topic.subscription(f"s{i}") for i in range(subs)}
    created = subs
    topic.add_messages([(ledger, entry, clock() + dt) for ledger, entry, dt in first])
    try:
        for action in ops:
            kind = action[0]
            names = sorted(handles)
            chosen = names and kind in ("deliver", "mark", "clear", "delete", "readd")
            name = names[action[1] % len(names)] if chosen else None
            if kind == "add":
                (ledger, entry), dt = action[1], action[2]
                topic.add_message(ledger, entry, clock() + dt)
            elif kind == "advance":
                clock.advance(action[1])
            elif kind == "create":
                handles[f"s{created}"] = topic.subscription(f"s{created}", start=action[1])
                created += 1
            elif kind == "reopen":  # batches not confirmed come back as rows to redeliver
                store.close()
                store = bucketstore.open(path)
                topic = store.topic("t", config=config, clock=clock)
                handles = {n: topic.subscription(n) for n in handles}
            elif name is None:
                continue
            elif kind in SUBSCRIPTION_ACTIONS:
                act_on_subscription(handles[name], clock, action)
            elif kind == "delete":
                topic.delete_subscription(name)
                del handles[name]
            check(path, clock, topic)
    finally:
        store.close()


def test_count_between_counts_whole_windows_and_bounds(tmp_path) -> None:
    rng = random.Random(25)
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        topic.subscription("s")
        # Clusters of equal times and gaps of several windows.
        topic.add_messages([(i // 50, i % 50, 2_000 + rng.choice([0, 1, 4_095, 4_096, 9_000, 40_000 + i]))
                            for i in range(600)])
        topic.flush()  # written into the level (they waited in the journal)
        tables, tid = topic._file.tables, topic._id
        with topic._file.read() as txn:
            rows = list(tables.rows_after(txn, tid, None))
            bounds = [None, (0, 0, 0, 0), MAX_KEY, *rng.sample(rows, 40),
                      *[(r[0], r[1], r[2], r[3] + 1) for r in rng.sample(rows, 20)],
                      *[(t, 0, 0, 0) for t in (2_000, 6_096, 6_097, 8_192, 11_000)]]
            for lo in bounds:
                for hi in bounds:
                    want = sum(1 for r in rows if (lo is None or r > lo) and (hi is None or r <= hi))
                    assert tables.count_between(txn, tid, lo, hi) == want, (lo, hi)


@pytest.mark.parametrize("subs, due", [(20, 0), (20, 300), (1, 0), (20, 12_000)])
def test_a_scrape_reads_windows_not_every_row_per_subscription(tmp_path, monkeypatch, subs, due) -> None:
    """20,000 rows 10 ms apart (410 a window), one stalled subscription among ``subs``: reading
    the figures decodes the rows of the windows bounding each range (due, held), not every row
    once per subscription, nor the 12,000 due rows or 20,000 held rows of the stalled one."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        handles = [topic.subscription(f"s{i}") for i in range(subs)]
        topic.add_messages([(i // 1000, i % 1000, 2_000 + 10 * i) for i in range(20_000)])
        clock.advance(2_000 + 10 * due - 1 - clock())  # the first ``due`` rows are due
        for h in handles[1:]:
            while h.get_scheduled_messages(5_000):
                pass
            h.confirm_delivered()
        decoded = []
        for module in (topic_rows, topic_reader):
            real = module.row_from
            monkeypatch.setattr(module, "row_from", lambda k, v, real=real: decoded.append(1) or real(k, v))
        doc = describe_topics(tmp_path, now_ms=clock())["t"]["subscriptions"]
        stats = topic.stats()["subscriptions"]
    held = 20_000 if subs == 1 else due
    assert doc["s0"]["held_rows"] == stats["s0"]["held_rows"] == held
    assert doc["s0"]["due_undelivered"] == stats["s0"]["due_undelivered"] == due
    assert all(doc[f"s{i}"]["held_rows"] == doc[f"s{i}"]["due_undelivered"] == 0 for i in range(1, subs))
    # Twice (the reader, then the open topic): the bounding windows of the stalled one's due and
    # held ranges, and a row or two per subscription.
    assert len(decoded) <= 2 * (4 * 410 + 2 * subs + 10), len(decoded)


def test_a_position_with_two_rows_is_due_once_for_each_subscription(tmp_path) -> None:
    """``b`` still tracks the first row of (1, 1) when ``a``, having delivered it, adds it again:
    the second row is ``a``'s alone, and each counts one due row."""
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path) as store:
        topic = store.topic("t", config=CFG, clock=clock)
        a, b = topic.subscription("a"), topic.subscription("b")
        a.add_message(1, 1, 1_100)
        clock.advance(200)
        assert a.get_scheduled_messages(10) == [(1, 1)]
        a.confirm_delivered()
        assert a.add_message(1, 1, 1_300)
        clock.advance(200)
        doc = describe_topics(tmp_path, now_ms=clock())["t"]
        assert doc["multi_positions"] == 1 and doc["rows"] == 2
        assert {s: f["due_undelivered"] for s, f in doc["subscriptions"].items()} == {"a": 1, "b": 1}
        assert doc["subscriptions"]["b"]["oldest_due_age_ms"] == 300
        assert {s: f["held_rows"] for s, f in doc["subscriptions"].items()} == {"a": 0, "b": 1}
        assert b.has_message_available()  # the open topic judges "due" by its cutoff, moved by its calls
        assert {s: f["due_undelivered"] for s, f in topic.stats()["subscriptions"].items()} == {"a": 1, "b": 1}
        assert scan_figures(tmp_path, now_ms=clock())["t"]["subscriptions"] == {
            s: {k: f[k] for k in FIGURES} for s, f in doc["subscriptions"].items()}
