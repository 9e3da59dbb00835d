"""The catalog's records as bytes (format/catalog_codec.py), against formats/catalog.md."""

from __future__ import annotations

import msgpack
import pytest

from bucketstore.format.catalog_codec import (CatalogRecordError, bucket_record_key, decode_ledger_id, decode_state,
                                              decode_store_id, decode_u64, encode_ledger_id, encode_state,
                                              encode_u64, split_record_key, tracker_prefix, validate_tracker_name)

KEY = "#pulsar.internal.delayed.bucket_100_199"


def test_keys_are_tracker_name_nul_bucket_key() -> None:
    raw = bucket_record_key(tracker_prefix("sub-é"), KEY)
    assert raw == "sub-é".encode() + b"\x00" + KEY.encode()
    assert split_record_key(raw) == ("sub-é".encode(), KEY)


@pytest.mark.parametrize("name, error", [("", ValueError), ("a\x00b", ValueError), ("x" * 201, ValueError),
                                         (b"bytes", TypeError), (7, TypeError)])
def test_tracker_names_are_1_to_200_utf8_bytes_without_nul(name, error) -> None:
    with pytest.raises(error):
        validate_tracker_name(name)
    assert validate_tracker_name("é" * 100) == ("é" * 100).encode()  # 200 bytes


def test_values_round_trip_as_the_spec_says() -> None:
    assert encode_ledger_id(1234) == b"1234" and decode_ledger_id(b"1234") == 1234
    assert encode_u64(2**64 - 1) == b"\xff" * 8 and decode_u64(encode_u64(12)) == 12
    state = {"mark_delete": [3, 4], "config": {"tick_time_ms": 1000}}
    assert msgpack.unpackb(encode_state(state), raw=False) == state and decode_state(encode_state(state)) == state
    assert decode_store_id(b"0123456789abcdef" * 2) == "0123456789abcdef" * 2


@pytest.mark.parametrize("decode, raw", [
    (decode_ledger_id, b"-3"), (decode_ledger_id, b" 12"), (decode_ledger_id, b"+1"), (decode_ledger_id, b"1_0"),
    (decode_ledger_id, b""), (decode_ledger_id, b"\xff"), (decode_u64, b"\x00" * 7), (decode_state, b"\xc1"),
    (decode_state, msgpack.packb([1, 2])), (decode_store_id, b"ABCDEF" * 6), (decode_store_id, b"12")])
def test_damaged_values_are_refused(decode, raw) -> None:
    with pytest.raises(CatalogRecordError):
        decode(raw)
