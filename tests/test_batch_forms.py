"""``add_messages`` batch forms are told apart by type, never by length (issue 14, item 8).

Before: a tuple of exactly three triples was read as three columns, so
``((1, 0, 5000), (1, 1, 5001), (1, 2, 5002))`` tracked positions (1, 1),
(0, 1), (5000, 5001) at times 1, 2, 5002 — bogus positions, no error.
"""

from __future__ import annotations

import numpy as np
import pytest

import bucketstore

T0 = 1_000_000
NOW = [T0]  # the trackers' clock; each test starts at T0


def clock() -> int:
    return NOW[0]
TRIPLES = ((7, 0, T0 + 5_000), (7, 1, T0 + 5_001), (7, 2, T0 + 5_002))
POSITIONS = [(7, 0), (7, 1), (7, 2)]


def _in_memory():
    yield bucketstore.InMemoryTracker(clock=clock)


def _time_bucket():
    yield bucketstore.TimeBucketTracker(config=bucketstore.TrackerConfig(precision_bits=2), clock=clock)


def _bucket(tmp_path, durability):
    def make():
        with bucketstore.open(str(tmp_path / durability), durability=durability) as store:
            yield store.tracker("t", clock=clock)
    return make


@pytest.fixture(params=["in-memory", "time-bucket", "sealed", "journal"])
def tracker(request, tmp_path):
    make = {"in-memory": _in_memory, "time-bucket": _time_bucket,
            "sealed": _bucket(tmp_path, "sealed"), "journal": _bucket(tmp_path, "journal")}[request.param]
    NOW[0] = T0
    gen = make()
    yield next(gen)
    gen.close()


def _delivered(tracker) -> list[tuple[int, int]]:
    NOW[0] = T0 + 10_000  # everything is due
    return sorted(tracker.get_scheduled_messages(100))


@pytest.mark.parametrize("batch", [TRIPLES, list(TRIPLES), tuple(list(t) for t in TRIPLES), (lambda: iter(TRIPLES)),
                                   np.array(TRIPLES, dtype=np.uint64)],
                         ids=["tuple-of-3-triples", "list-of-triples", "tuple-of-3-lists", "iterator", "n-by-3-array"])
def test_rows(tracker, batch) -> None:
    if callable(batch):
        batch = batch()
    assert tracker.add_messages(batch) == 3
    assert all(tracker.contains_message(l, e) for l, e in POSITIONS)
    assert not tracker.contains_message(0, 1) and not tracker.contains_message(5000, 5001)
    assert _delivered(tracker) == POSITIONS


@pytest.mark.parametrize("batch", [
    (np.array([7, 7, 7], np.uint64), np.array([0, 1, 2], np.uint64), np.array([T0 + 5_000, T0 + 5_001, T0 + 5_002])),
    {"ledger_id": [7, 7, 7], "entry_id": [0, 1, 2], "deliver_at": [T0 + 5_000, T0 + 5_001, T0 + 5_002]},
], ids=["tuple-of-arrays", "named"])
def test_columns(tracker, batch) -> None:
    assert tracker.add_messages(batch) == 3
    assert _delivered(tracker) == POSITIONS


@pytest.mark.parametrize("batch", [
    (np.array([7, 7, 7]), [0, 1, 2], [T0 + 1, T0 + 2, T0 + 3]),            # a tuple mixing arrays and lists
    [np.array([7, 0, T0 + 1]), np.array([7, 1, T0 + 2]), np.array([7, 2, T0 + 3])],  # rows or columns?
    ([7, 7, 7, 7], [0, 1, 2, 3], [T0 + 1, T0 + 2, T0 + 3, T0 + 4]),          # columns as lists: not a form
    {"ledger_id": [7], "entry_id": [0]},                                     # a named batch missing a column
    np.zeros((4, 2), np.uint64),                                             # an array of the wrong shape
    "703",
    7,
], ids=["mixed-tuple", "three-arrays-of-3", "list-columns", "named-missing", "wrong-shape", "str", "int"])
def test_ambiguous_or_malformed_is_a_type_error(tracker, batch) -> None:
    with pytest.raises(TypeError):
        tracker.add_messages(batch)
    assert tracker.number_of_delayed_messages == 0
