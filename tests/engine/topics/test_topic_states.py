"""Each subscription's state of each topic row (``engine/topics/topic_states.py``, what the Spark
reader exports) on random topics, rows in sealed runs and in the level: the bounds compared a
batch at a time equal the row-by-row rule (``SubscriptionState.may_see``, ``tracked_row``), and
per subscription the rows not done are as many as ``describe_topics`` counts it tracking, the
unconfirmed ones as its unconfirmed. ``BUCKETSTORE_EXAMPLES`` raises the example count."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.topics.topic_reader import _each, _reading, describe_topics, topic_view
from bucketstore.engine.topics.subscription_state import SubscriptionState
from bucketstore.engine.topics.topic_states import STATES, read_topic_states
from bucketstore.format.topic_codec import MULTI, decode_topic, split_sub_key, topic_prefix

from helpers import SUBSCRIPTION_ACTIONS, FakeClock, act_on_subscription, example_count

position = st.tuples(st.integers(0, 1), st.integers(0, 3))
ahead = st.one_of(st.integers(1, 40), st.integers(1, 20_000))
sub = st.integers(0, 3)
op = st.one_of(
    st.tuples(st.just("add"), position, ahead),
    st.tuples(st.just("advance"), st.integers(0, 9_000)),
    st.tuples(st.just("deliver"), sub, st.integers(1, 6)),
    st.tuples(st.just("confirm"), sub),
    st.tuples(st.just("mark"), sub, position),
    st.tuples(st.just("clear"), sub),
    st.tuples(st.just("create"), st.sampled_from(["earliest", "latest"])),
    st.tuples(st.just("reopen"),),
    st.tuples(st.just("readd"), sub, position, ahead),
)


def row_by_row(path: str) -> tuple[list[tuple[int, int, int, int]], dict[str, list[str]]]:
    """The rows, and per subscription each row's state, one row at a time from the definitions."""
    with _reading(path) as view:
        _, txn, dbs = view
        record = decode_topic(txn.get(b"t", db=dbs["topics"]))
        tid = record["id"]
        rows_view = topic_view(txn, dbs, tid)
        rows = list(rows_view.rows_after(txn, tid, None))
        versions: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for ts, ledger, entry, seq in rows:
            versions.setdefault((ledger, entry), []).append((seq, ts))
        multi = {MULTI.unpack(k)[1:] for k, _ in _each(txn, dbs["multi"], topic_prefix(tid))} | set(rows_view.dead)
        out = {}
        for key, value in _each(txn, dbs["subs"], topic_prefix(tid)):
            name = split_sub_key(key)[1]
            state = SubscriptionState.decode(name, value)
            again = set(state.redeliver)
            codes = []
            for row in rows:
                pos = (row[1], row[2])
                seen = state.may_see(row) and (pos not in multi or state.tracked_row(*pos, sorted(versions[pos])) == row)
                codes.append((row, "pending" if seen else "unconfirmed" if row in again else "done"))
            # An unconfirmed row every other subscription has passed is gone from the rows: still its.
            codes += [(row, "unconfirmed") for row in sorted(again - set(rows))]
            out[name] = codes
    return rows, out


@pytest.mark.parametrize("seal", [1_000_000, 4], ids=["level", "sealed"])
@settings(max_examples=example_count(25), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(first=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 99), ahead), max_size=40),
       ops=st.lists(op, min_size=5, max_size=30), subs=st.integers(1, 3), chunk=st.sampled_from([1, 7, 1 << 16]))
# Found by this test: "s1" delivers a position, adds it again and never confirms; "s0" passes it:
# the old row leaves the topic, and "s1" still has it to deliver again.
@example(first=[], ops=[("add", (0, 0), 1), ("readd", 1, (0, 0), 1), ("deliver", 0, 1), ("mark", 0, (0, 0))],
         subs=2, chunk=1)
def test_states_equal_the_row_by_row_rule_and_the_counts(tmp_path_factory, seal, first, ops, subs, chunk) -> None:
    path = str(tmp_path_factory.mktemp("states"))
    clock = FakeClock(100_000)
    config = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=seal)
    store = bucketstore.open(path)
    try:
        topic = store.topic("t", config=config, clock=clock)
        handles = {f"s{i}": topic.subscription(f"s{i}") for i in range(subs)}
        topic.add_messages([(ledger, entry, clock() + dt) for ledger, entry, dt in first])
        for action in ops:
            kind, names = action[0], sorted(handles)
            name = names[action[1] % len(names)] if kind in SUBSCRIPTION_ACTIONS else None
            if kind == "add":
                topic.add_message(*action[1], clock() + action[2])
            elif kind == "advance":
                clock.advance(action[1])
            elif kind == "create":
                handles[f"s{len(handles)}"] = topic.subscription(f"s{len(handles)}", start=action[1])
            elif kind == "reopen":  # batches not confirmed come back as rows to deliver again
                store.close()
                store = bucketstore.open(path)
                topic = store.topic("t", config=config, clock=clock)
                handles = {n: topic.subscription(n) for n in handles}
            elif kind in SUBSCRIPTION_ACTIONS:
                act_on_subscription(handles[name], clock, action)
        store.close()  # the records as a reader finds them: unconfirmed batches to deliver again
        rows, want = row_by_row(path)
        chunks = list(read_topic_states(path, "t", chunk_rows=chunk))
        got_rows = [tuple(r) for c in chunks if len(c.states) != 1 or len(want) == 1 for r in c.rows.tolist()]
        assert got_rows[:len(rows)] == rows
        figures = describe_topics(path, now_ms=clock())["t"]["subscriptions"]
        assert sorted(want) == sorted(figures) == sorted(handles)
        for name, codes in want.items():
            got = [(tuple(row), STATES[code]) for c in chunks if name in c.states
                   for row, code in zip(c.rows.tolist(), c.states[name].tolist())]
            assert got == codes, name
            got = [state for _, state in got]
            assert len(got) - got.count("done") == figures[name]["number_of_delayed_messages"], name
            assert got.count("unconfirmed") == figures[name]["unconfirmed"], name
    finally:
        store.close()
