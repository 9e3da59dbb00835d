"""Deduplicator: the two-generation rule, snapshots and damaged snapshots."""

from __future__ import annotations

import doctest
import os

import msgpack
import pytest
from pyroaring import BitMap
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bucketstore.memory.dedup
from bucketstore.memory.dedup import Deduplicator
from bucketstore.errors import CorruptLedgerError
from bucketstore.format.ledger_file import write_ledger

WIDE = 1 << 32


def test_docstring_examples() -> None:
    assert doctest.testmod(bucketstore.memory.dedup).failed == 0


@given(capacity=st.integers(2, 12),
       ops=st.lists(st.tuples(st.sampled_from(["a", "b"]),
                              st.one_of(st.integers(0, 30), st.integers(WIDE - 1, WIDE + 1))), max_size=120))
def test_matches_a_two_generation_model(capacity: int, ops: list[tuple[str, int]]) -> None:
    """Every answer equals a model of two sets per key that swap at half the capacity."""
    half = capacity // 2
    model = {"a": [set(), set()], "b": [set(), set()]}
    dedup = Deduplicator(["a", "b"], capacity)
    for key, message_id in ops:
        current, previous = model[key]
        expected = message_id in current or message_id in previous
        if not expected:
            if len(current) >= half:
                model[key] = [set(), current]
            model[key][0].add(message_id)
        assert dedup.is_duplicate_and_add(key, message_id) == expected
        dedup._check()
    for key, (current, previous) in model.items():
        for message_id in range(31):
            assert dedup.is_duplicate(key, message_id) == (message_id in current or message_id in previous)


def test_bounded_memory_remembers_the_recent_half() -> None:
    dedup = Deduplicator(["k"], 1000)
    for message_id in range(100_000):
        assert not dedup.is_duplicate_and_add("k", message_id)
    remembered = [i for i in range(100_000) if dedup.is_duplicate("k", i)]
    assert 500 <= len(remembered) <= 1000
    assert remembered == list(range(100_000 - len(remembered), 100_000))


def test_keys_are_independent() -> None:
    """The seed's shared counter let one key's traffic flush another key; here it must not."""
    dedup = Deduplicator(["quiet", "busy"], 4)
    dedup.is_duplicate_and_add("quiet", 7)
    for message_id in range(100):
        dedup.is_duplicate_and_add("busy", message_id)
    assert dedup.is_duplicate("quiet", 7)


def test_reconstruct_replaces_and_keeps_the_latest() -> None:
    dedup = Deduplicator(["k"], 10)
    dedup.is_duplicate_and_add("k", 999)
    dedup.reconstruct("k", range(100))
    assert not dedup.is_duplicate("k", 999)
    assert all(dedup.is_duplicate("k", i) for i in range(95, 100))
    assert not dedup.is_duplicate("k", 50)
    with pytest.raises(ValueError):
        dedup.reconstruct("k", [1, -2])
    assert dedup.is_duplicate("k", 99), "a rejected reconstruct must not change the key"
    dedup._check()


@pytest.mark.parametrize("call, error", [
    (lambda: Deduplicator(["k"], 1), ValueError),
    (lambda: Deduplicator(["k"], 4.0), TypeError),
    (lambda: Deduplicator(["k"], True), TypeError),
    (lambda: Deduplicator([3], 4), TypeError),
    (lambda: Deduplicator(["k"], 4).is_duplicate("other", 1), ValueError),
    (lambda: Deduplicator(["k"], 4).is_duplicate_and_add(b"k", 1), TypeError),
    (lambda: Deduplicator(["k"], 4).is_duplicate_and_add("k", -1), ValueError),
    (lambda: Deduplicator(["k"], 4).is_duplicate_and_add("k", 1 << 64), ValueError),
    (lambda: Deduplicator(["k"], 4).reconstruct("nope", [1]), ValueError),
])
def test_argument_errors(call, error) -> None:
    with pytest.raises(error):
        call()


def _filled() -> Deduplicator:
    dedup = Deduplicator(["orders", "payments", "empty"], 2000)
    for message_id in range(1500):
        dedup.is_duplicate_and_add("orders", message_id)
    for message_id in (5, WIDE + 5, 1 << 63):
        dedup.is_duplicate_and_add("payments", message_id)
    return dedup


def _same(a: Deduplicator, b: Deduplicator) -> None:
    assert a.keys == b.keys and a.max_capacity == b.max_capacity
    for key in a.keys:
        assert [list(g) for g in a._generations[key]] == [list(g) for g in b._generations[key]]


def test_snapshot_round_trip_and_replace(tmp_path) -> None:
    path = tmp_path / "dedup.snap"
    dedup = _filled()
    dedup.save(path)
    loaded = Deduplicator.load(path)
    loaded._check()
    _same(dedup, loaded)
    assert loaded.is_duplicate("payments", WIDE + 5) and not loaded.is_duplicate("payments", 6)
    # Saving again replaces the snapshot; leftovers of an interrupted save are cleared.
    (tmp_path / "dedup.snap.next.tmp").write_bytes(b"half-written")
    loaded.is_duplicate_and_add("empty", 42)
    loaded.save(path)
    assert sorted(os.listdir(tmp_path)) == ["dedup.snap"]
    assert Deduplicator.load(path).is_duplicate("empty", 42)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_snapshot_raises_corrupt_ledger_error(tmp_path, data) -> None:
    path = tmp_path / "dedup.snap"
    if not path.exists():
        _filled().save(path)
    good = path.read_bytes()
    damaged = tmp_path / "damaged.snap"
    if data.draw(st.booleans(), label="truncate"):
        blob = good[:data.draw(st.integers(0, len(good) - 1), label="length")]
    else:
        where = data.draw(st.integers(0, len(good) - 1), label="offset")
        blob = good[:where] + bytes([good[where] ^ data.draw(st.integers(1, 255), label="xor")]) + good[where + 1:]
    damaged.write_bytes(blob)
    with pytest.raises(CorruptLedgerError) as info:
        Deduplicator.load(damaged)
    assert info.value.path == os.fspath(damaged) and 0 <= info.value.offset <= len(good)


def _forge(tmp_path, properties: dict, entries: list[bytes]) -> str:
    """A ledger whose CRCs are all valid but whose snapshot content is wrong."""
    return write_ledger(tmp_path, 1, properties, entries, file_name="forged.snap")


GOOD_PROPS = {"kind": "dedup-snapshot", "format": 1, "max_capacity": 4}


@pytest.mark.parametrize("properties, entries", [
    ({"kind": "bucket", "format": 1, "max_capacity": 4}, [msgpack.packb([])]),
    ({**GOOD_PROPS, "format": 2}, [msgpack.packb([])]),
    ({**GOOD_PROPS, "max_capacity": 1}, [msgpack.packb([])]),
    ({**GOOD_PROPS, "max_capacity": "4"}, [msgpack.packb([])]),
    (GOOD_PROPS, []),
    (GOOD_PROPS, [b"\xc1"]),
    (GOOD_PROPS, [msgpack.packb({"k": 1})]),
    (GOOD_PROPS, [msgpack.packb([["k", 32, 32]])]),
    (GOOD_PROPS, [msgpack.packb([["k", 32.0, 32]]), b"", b""]),
    (GOOD_PROPS, [msgpack.packb([[7, 32, 32]]), b"", b""]),
    (GOOD_PROPS, [msgpack.packb([["k", 32, 32], ["k", 32, 32]]), *[BitMap().serialize()] * 4]),
    (GOOD_PROPS, [msgpack.packb([["k", 32, 32]]), b"", b"junk"]),
    (GOOD_PROPS, [msgpack.packb([["k", 32, 64]]), b"\x00" * 3, b"\xff" * 40]),
    (GOOD_PROPS, [msgpack.packb([["k", 32, 32]]),
                  BitMap(range(3)).serialize(),
                  BitMap().serialize()]),
])
def test_valid_ledger_with_bad_content_is_corrupt(tmp_path, properties, entries) -> None:
    path = _forge(tmp_path, properties, entries)
    with pytest.raises(CorruptLedgerError) as info:
        Deduplicator.load(path)
    assert info.value.path == path


def test_missing_snapshot_is_file_not_found(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        Deduplicator.load(tmp_path / "absent.snap")
