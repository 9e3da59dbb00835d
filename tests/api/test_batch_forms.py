"""``add_messages`` batch forms are told apart by type, never by length (issue 14, item 8; issue 24, item 7).

Issue 14: a tuple of exactly three triples was read as three columns, so
``((1, 0, 5000), (1, 1, 5001), (1, 2, 5002))`` tracked positions (1, 1),
(0, 1), (5000, 5001) at times 1, 2, 5002 — bogus positions, no error.
Issue 24: then three columns as lists, ``([1, 1, 1], [0, 1, 2], [t, t, t])``,
were read as three triples. Now a tuple of three lists or arrays is columns
(whatever their length), a list of triples is rows, and a tuple of three
tuples (rows? or columns from ``zip(*rows)``?) is a TypeError naming both.
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


COLUMNS = ([7, 7, 7], [0, 1, 2], [T0 + 5_000, T0 + 5_001, T0 + 5_002])


@pytest.mark.parametrize("batch", [list(TRIPLES), [list(t) for t in TRIPLES], (lambda: iter(TRIPLES)),
                                   np.array(TRIPLES, dtype=np.uint64), TRIPLES + ((7, 2, T0 + 5_002),)],
                         ids=["list-of-triples", "list-of-lists", "iterator", "n-by-3-array", "tuple-of-4-triples"])
def test_rows(tracker, batch) -> None:
    if callable(batch):
        batch = batch()
    expected = len(batch) if hasattr(batch, "__len__") else 3  # a repeated row counts as tracked
    assert tracker.add_messages(batch) == expected
    assert all(tracker.contains_message(l, e) for l, e in POSITIONS)
    assert not tracker.contains_message(0, 1) and not tracker.contains_message(5000, 5001)
    assert _delivered(tracker) == POSITIONS


@pytest.mark.parametrize("batch", [
    (np.array([7, 7, 7], np.uint64), np.array([0, 1, 2], np.uint64), np.array([T0 + 5_000, T0 + 5_001, T0 + 5_002])),
    {"ledger_id": [7, 7, 7], "entry_id": [0, 1, 2], "deliver_at": [T0 + 5_000, T0 + 5_001, T0 + 5_002]},
    COLUMNS,                                                                  # issue 24's batch: three lists of 3
    (np.array([7, 7, 7]), [0, 1, 2], [T0 + 5_000, T0 + 5_001, T0 + 5_002]),   # arrays and lists
    ([7, 7, 7], range(3), np.arange(T0 + 5_000, T0 + 5_003)),                # a range is a column too
], ids=["tuple-of-arrays", "named", "tuple-of-3-lists", "arrays-and-lists", "with-a-range"])
def test_columns(tracker, batch) -> None:
    assert tracker.add_messages(batch) == 3
    assert not tracker.contains_message(0, 1) and not tracker.contains_message(7, 7)
    assert _delivered(tracker) == POSITIONS


def test_columns_of_any_length_are_columns(tracker) -> None:
    for n in (1, 2, 3, 4, 5):
        before = tracker.number_of_delayed_messages
        assert tracker.add_messages(([10 + n] * n, list(range(n)), [T0 + 5_000 + e for e in range(n)])) == n
        assert tracker.number_of_delayed_messages == before + n
        assert all(tracker.contains_message(10 + n, e) for e in range(n))


@pytest.mark.parametrize("batch", [
    TRIPLES,                                                                 # three rows, or three columns?
    tuple(zip(*[(7, e, T0 + e) for e in range(4)])),                         # columns from zip(*rows): tuples
    ((7, 0, T0 + 1), [7, 1, T0 + 2], [7, 2, T0 + 3]),                        # a tuple mixing tuples and lists
], ids=["tuple-of-3-triples", "tuple-of-3-tuples", "tuples-and-lists"])
def test_a_tuple_of_three_that_could_be_rows_or_columns_names_both_readings(tracker, batch) -> None:
    with pytest.raises(TypeError) as info:
        tracker.add_messages(batch)
    message = str(info.value)
    assert "three rows" in message and "three columns" in message and "list of tuples" in message
    assert tracker.number_of_delayed_messages == 0


@pytest.mark.parametrize("batch", [
    [np.array([7, 0, T0 + 1]), np.array([7, 1, T0 + 2]), np.array([7, 2, T0 + 3])],  # rows or columns?
    ([7, 7, 7, 7], [0, 1, 2], [T0 + 1, T0 + 2, T0 + 3, T0 + 4]),             # columns of different lengths
    (np.zeros((2, 2)), [0, 1], [T0, T0]),                                    # a column that is not 1-D
    (7, 0, T0 + 1),                                                          # one row is not a batch
    {"ledger_id": [7], "entry_id": [0]},                                     # a named batch missing a column
    np.zeros((4, 2), np.uint64),                                             # an array of the wrong shape
    "703",
    7,
], ids=["three-arrays-of-3", "uneven-columns", "2d-column", "one-row", "named-missing", "wrong-shape", "str",
        "int"])
def test_ambiguous_or_malformed_is_a_type_error(tracker, batch) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        tracker.add_messages(batch)
    assert info.type is TypeError or "differ in length" in str(info.value)
    assert tracker.number_of_delayed_messages == 0


def test_a_numpy_integer_in_a_single_add_is_refused_with_the_way_out(tracker) -> None:
    """A single add takes plain ints; a numpy scalar is told how to get one, or to use the batch."""
    with pytest.raises(TypeError, match=r"not int64 \(int\(x\) converts one; add_messages takes numpy columns"):
        tracker.add_message(np.int64(1), 2, 3)
    with pytest.raises(TypeError, match=r"deliver_at .* not uint64 \(int\(x\)"):
        tracker.add_message(1, 2, np.uint64(3))
    tracker.add_messages(np.array([[1, 2, 10**13]], dtype=np.uint64))
    assert tracker.contains_message(1, 2)
