"""``mark_delete``'s count by columns (``engine/topics/topic_marks.py``) against judging every position.

Random topics whose rows live in the LMDB level and in sealed runs of several segments (the
segment size is made small), with re-added positions (several rows), adds already due (rows gone
from a run), subscriptions part way through runs, created with ``start="latest"``, cleared and
acknowledged; for every subscription and ranges of positions, :func:`tracked_in_range` must
equal the count of the positions whose rows :meth:`SubscriptionState.tracked_row` finds tracked,
read row by row in acknowledgement order (what ``mark_delete`` did before).
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import bucketstore
import bucketstore.format.topic_run as topic_run
from bucketstore import TrackerConfig
from bucketstore.engine.topics.topic_marks import tracked_in_range

from helpers import FakeClock, example_count

CONFIG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=6)
LEDGERS, ENTRIES = 6, 10
GRID = [None, (0, 0), (1, 3), (2, 9), (3, 4), (5, 9)]

row = st.tuples(st.integers(0, LEDGERS - 1), st.integers(0, ENTRIES - 1), st.integers(-5, 300))
op = st.one_of(
    st.tuples(st.just("add"), st.lists(row, min_size=1, max_size=12)),
    st.tuples(st.just("add"), st.lists(row, min_size=1, max_size=12)),
    st.tuples(st.just("advance"), st.integers(0, 60)),
    st.tuples(st.just("deliver"), st.integers(0, 7), st.integers(1, 15)),
    st.tuples(st.just("mark"), st.integers(0, 7), st.integers(0, LEDGERS - 1), st.integers(0, ENTRIES - 1)),
    st.tuples(st.just("clear"), st.integers(0, 7)),
    st.tuples(st.just("create"),),
)


def reference(txn, view, tid, state, after, upto) -> int:
    seen: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for ts, lg, en, seq in view.positions_after(txn, tid, after, upto):
        if (lg, en) > upto:
            break
        seen.setdefault((lg, en), []).append((seq, ts))
    return sum(1 for (lg, en), versions in seen.items() if state.tracked_row(lg, en, versions) is not None)


@settings(max_examples=example_count(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=40))
# One run of six segments, a subscription's frontier part way through it (segments wholly passed).
@example(ops=[("add", [(e % 3, e % 10, 10 * e) for e in range(1, 13)]), ("advance", 60), ("deliver", 0, 15)])
# Two rows a time, a segment each: the frontier on the first of a segment's two (not wholly passed).
@example(ops=[("add", [(e % 3, e % 10, 10 * ((e + 1) // 2)) for e in range(1, 13)]), ("advance", 60),
              ("deliver", 0, 1)])
def test_the_count_by_columns_equals_the_judgement_of_every_position(tmp_path_factory, monkeypatch, ops) -> None:
    monkeypatch.setattr(topic_run, "SEGMENT_ROWS", 2)  # runs of several segments
    clock = FakeClock(1_000)
    with bucketstore.open(tmp_path_factory.mktemp("marks"), durability="journal", sync_interval_ms=60_000) as store:
        topic = store.topic("t", config=CONFIG, clock=clock)
        subs = [topic.subscription(f"s{i}") for i in range(3)]
        for action in ops:
            kind = action[0]
            if kind == "add":
                topic.add_messages([(lg, en, clock.now + dt) for lg, en, dt in action[1]])
            elif kind == "advance":
                clock.advance(action[1])
            elif kind == "deliver":
                subs[action[1] % len(subs)].get_scheduled_messages(action[2])
            elif kind == "mark":
                subs[action[1] % len(subs)].mark_delete(action[2], action[3])
            elif kind == "clear":
                subs[action[1] % len(subs)].clear()
            else:
                subs.append(topic.subscription(f"s{len(subs)}", start="latest"))
        topic.flush()
        with topic._file.read() as txn:
            for state in topic._subs.values():
                for after in GRID:
                    for upto in GRID[1:]:
                        if after is not None and after >= upto:
                            continue
                        want = reference(txn, topic._view, topic._id, state, after, upto)
                        got = tracked_in_range(txn, topic._view, topic._id, state, topic._judged(), after, upto)
                        assert got == want, (state, after, upto)
