"""Ledger files: round trips, the writer's discipline, and the spec's worked example."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketstore.errors import CorruptLedgerError
from bucketstore.format.ledger_file import LedgerReader, LedgerWriter, ledger_file_name, masked_crc32c, write_ledger
from bucketstore.format.snapshot import build_bucket, write_bucket


def crc32c_reference(data: bytes, crc: int = 0) -> int:
    """CRC-32C bit by bit from its definition (reflected polynomial 0x82F63B78)."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_crc_definition_matches_the_library() -> None:
    assert crc32c_reference(b"123456789") == 0xE3069283
    assert masked_crc32c(b"123456789") == mask(0xE3069283)


def test_worked_example_of_the_spec(tmp_path) -> None:
    u = lambda *v: np.array(v, dtype=np.uint64)  # noqa: E731
    # The example is a version-1 snapshot (bucket_snapshot.md's "Version 1" section decodes its entries).
    meta, segs = build_bucket(5, 5, u(1000, 1001, 1003), u(5, 5, 5), u(7, 8, 9), time_step_ms=300_000,
                              max_indexes_per_segment=5_000, compress=False, version=1)
    path = write_bucket(tmp_path, 42, meta, segs, compress=False)
    data = open(path, "rb").read()
    assert os.path.basename(path) == "00000000000000000042.ledger" and len(data) == 276
    # Every stored CRC, recomputed from formats/ledger_file.md with the bitwise CRC above.
    assert struct.unpack_from("<I", data, 0x6F)[0] == mask(crc32c_reference(data[:0x6F])) == 0xF92F97AE
    for entry_id, frame in enumerate((0x73, 0xA9)):
        length, stored = struct.unpack_from("<II", data, frame)
        covered = struct.pack("<QQ", 42, entry_id) + data[frame + 8:frame + 8 + length]
        assert stored == mask(crc32c_reference(covered))
    assert struct.unpack_from("<I", data, 0x104)[0] == mask(crc32c_reference(
        struct.pack("<Q", 42) + data[0xE4:0xF4] + struct.pack("<QQ", 0xE4, 2))) == 0x8CEFC67B
    assert data[0xB1:0xE4].hex() == ("0003000000" "01e803000000000000010102"
                                     "0005000000000000000000000000000000"
                                     "0007000000000000000100000000000000")


@settings(max_examples=60, deadline=None)
@given(entries=st.lists(st.binary(max_size=300), max_size=12),
       ledger_id=st.integers(0, (1 << 64) - 1),
       props=st.dictionaries(st.text(max_size=8), st.text(max_size=8) | st.integers(0, (1 << 64) - 1), max_size=4))
def test_round_trip(tmp_path_factory, entries, ledger_id, props) -> None:
    directory = tmp_path_factory.mktemp("rt")
    path = write_ledger(directory, ledger_id, props, entries)
    assert os.path.basename(path) == ledger_file_name(ledger_id)
    assert os.listdir(directory) == [os.path.basename(path)]  # no .tmp left behind
    with LedgerReader(path) as reader:
        assert (reader.ledger_id, reader.properties, reader.entry_count) == (ledger_id, props, len(entries))
        assert list(reader) == entries
        assert [reader.entry_size(k) for k in range(len(entries))] == [len(e) for e in entries]
        if entries:
            assert reader.read_entries(0, len(entries) - 1) == entries
            assert reader.read_entry(len(entries) - 1) == entries[-1]
            with pytest.raises(IndexError):
                reader.read_entry(len(entries))


def test_a_frame_moved_elsewhere_fails_its_crc(tmp_path) -> None:
    # Same payload at entries 1 and 2: swapping the frames keeps every byte
    # "valid" except the position the CRC covers.
    path = write_ledger(tmp_path, 3, {}, [b"a", b"same", b"same"])
    with LedgerReader(path) as reader:
        f1, f2 = reader.entry_offset(1), reader.entry_offset(2)
    data = bytearray(open(path, "rb").read())
    data[f1:f1 + 12], data[f2:f2 + 12] = data[f2:f2 + 12], data[f1:f1 + 12]
    open(path, "wb").write(data)
    with LedgerReader(path) as reader, pytest.raises(CorruptLedgerError, match="entry 1 CRC") as info:
        reader.read_entry(1)
    assert info.value.offset == f1


def test_same_bytes_under_another_ledger_id_fail(tmp_path) -> None:
    a = write_ledger(tmp_path, 1, {}, [b"x"])
    b = write_ledger(tmp_path, 2, {}, [b"x"])
    data_a, data_b = open(a, "rb").read(), open(b, "rb").read()
    # Entry frames are identical except for the CRC, which covers the ledger id.
    assert data_a[32:36] != data_b[32:36]


def test_writer_abort_and_exception_leave_nothing(tmp_path) -> None:
    with pytest.raises(RuntimeError):
        with LedgerWriter(tmp_path, 9) as writer:
            writer.append(b"half")
            raise RuntimeError("crash")
    with LedgerWriter(tmp_path, 10) as writer:
        writer.append(b"not sealed")
    assert os.listdir(tmp_path) == []


def test_sealed_ledger_is_never_replaced(tmp_path) -> None:
    write_ledger(tmp_path, 5, {}, [b"first"])
    with pytest.raises(FileExistsError):
        write_ledger(tmp_path, 5, {}, [b"second"])
    with LedgerReader(tmp_path / ledger_file_name(5)) as reader:
        assert reader.read_entry(0) == b"first"
    assert len(os.listdir(tmp_path)) == 1


@pytest.mark.parametrize("props, error", [({1: "x"}, TypeError), ({"k": 1.5}, TypeError), ({"k": True}, TypeError),
                                          ({"k": -1}, ValueError), ({"k": "x" * 70_000}, ValueError)])
def test_bad_properties_are_refused(tmp_path, props, error) -> None:
    with pytest.raises(error):
        LedgerWriter(tmp_path, 1, props)
    assert os.listdir(tmp_path) == []


def test_bad_ledger_ids_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError):
        LedgerWriter(tmp_path, 1 << 64)
    with pytest.raises(TypeError):
        LedgerWriter(tmp_path, "1")  # type: ignore[arg-type]


def test_missing_file_is_not_damage(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        LedgerReader(tmp_path / "nope.ledger")
