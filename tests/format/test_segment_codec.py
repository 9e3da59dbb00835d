"""Segment encoding: exact round trips over the whole uint64 range, and the writer's choices."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketstore.format.segment_codec import (FLAG_ZLIB, FLAG_ZSTD, KIND_ARITH, KIND_DELTA_U, KIND_DELTA_Z, KIND_FRAME,
                                              KIND_PACKED, MAX_SEGMENT_INDEXES,
                                       SegmentCodecError, decode_segment, encode_segment, encode_segments)
from bucketstore.format import segment_codec

U64 = st.integers(0, (1 << 64) - 1)
EDGE = st.sampled_from([0, 1, (1 << 32) - 1, 1 << 32, (1 << 63), (1 << 64) - 2, (1 << 64) - 1])


def _sorted_rows(rows: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = sorted(set(rows))
    return tuple(np.array(col, dtype=np.uint64) for col in zip(*rows))  # type: ignore[return-value]


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(U64 | EDGE, U64 | EDGE | st.integers(0, 20), U64 | EDGE | st.integers(0, 300)),
                     min_size=1, max_size=60),
       compress=st.booleans(), codec=st.sampled_from(["zlib", "zstd"]))
def test_round_trip_any_uint64(rows, compress, codec) -> None:
    ts, ledgers, entries = _sorted_rows(rows)
    payload = encode_segment(ts, ledgers, entries, compress=compress, codec=codec)
    seg = decode_segment(payload, len(ts))
    for got, want in ((seg.timestamps, ts), (seg.ledger_ids, ledgers), (seg.entry_ids, entries)):
        assert got.dtype == np.uint64 and np.array_equal(got, want)
    if not compress:
        assert payload[0] & FLAG_ZLIB == 0


@settings(max_examples=100, deadline=None)
@given(start=U64, step=U64, n=st.integers(1, 500))
def test_constant_step_columns_cost_17_bytes_even_when_wrapping(start, step, n) -> None:
    col = (np.uint64(start) + np.arange(n, dtype=np.uint64) * np.uint64(step))
    ts = np.arange(n, dtype=np.uint64)  # sorted, distinct: any ledger/entry column is allowed
    payload = encode_segment(ts, col, col, compress=False, grouped=False)  # (grouped, no ledger column)
    assert len(payload) == 5 + 3 * 17
    assert payload[5 + 17] == KIND_ARITH
    assert np.array_equal(decode_segment(payload).ledger_ids, col)


def _column_kinds(payload: bytes, n: int) -> list[tuple[int, int]]:
    """(kind, width) of the three columns of an uncompressed payload."""
    pos, out = 5, []
    for _ in range(3):
        kind = payload[pos]
        if kind == KIND_ARITH:
            out.append((kind, 0))
            pos += 17
        elif kind == KIND_PACKED:
            bits = payload[pos + 9]
            out.append((kind, bits))
            pos += 10 + -(-n * bits // 8)
        else:
            width = payload[pos + 9]
            out.append((kind, width))
            pos += 10 + width * (n if kind == KIND_FRAME else n - 1)
    assert pos == len(payload)
    return out


def test_writer_picks_kind_and_narrowest_width() -> None:
    ts = np.array([10, 11, 13, 300, 70_000], dtype=np.uint64)  # rising, largest delta 69,700: width 4
    ledgers = np.array([1, 2, 1, 2, 1], dtype=np.uint64)  # goes down: zigzag, width 1
    entries = np.array([5, 5, 6, 6, 1 << 40], dtype=np.uint64)  # rising, huge last delta: width 8
    assert _column_kinds(encode_segment(ts, ledgers, entries, compress=False, codec="zlib"), 5) == [
        (KIND_DELTA_U, 4), (KIND_DELTA_Z, 1), (KIND_DELTA_U, 8)]
    # Version 2: the ledger column jumps within [1, 2]: bit-packed offsets, 1 bit each.
    assert _column_kinds(encode_segment(ts, ledgers, entries, compress=False, grouped=False), 5) == [
        (KIND_DELTA_U, 4), (KIND_PACKED, 1), (KIND_DELTA_U, 8)]


def test_v2_frame_and_packed_columns() -> None:
    n = 1000
    rng = np.random.default_rng(5)
    ts = np.arange(n, dtype=np.uint64) * np.uint64(3)
    ledgers = rng.integers(100, 110, n).astype(np.uint64)  # offsets 0..9: 4 bits packed
    entries = rng.integers(5_000, 60_000, n).astype(np.uint64)  # offsets < 2**16, differences not
    payload = encode_segment(ts, ledgers, entries, compress=False)
    assert _column_kinds(payload, n) == [(KIND_ARITH, 0), (KIND_PACKED, 4), (KIND_FRAME, 2)]
    seg = decode_segment(payload, n)
    assert np.array_equal(seg.ledger_ids, ledgers) and np.array_equal(seg.entry_ids, entries)
    packed = encode_segment(ts, ledgers, entries)
    assert packed[0] == FLAG_ZSTD and len(packed) < len(payload)
    assert np.array_equal(decode_segment(packed, n).entry_ids, entries)


def test_byte_planar_layout() -> None:
    ts = np.arange(4, dtype=np.uint64)
    payload = encode_segment(ts, ts, np.array([100, 99, 356, 357], dtype=np.uint64), compress=False, codec="zlib")
    # The example of formats/bucket_snapshot.md: deltas -1, 257, 1 zigzag to 1, 514, 2.
    assert payload[-16:].hex(" ") == "02 64 00 00 00 00 00 00 00 02 01 02 02 00 02 00"


@pytest.mark.parametrize("codec, flag", [("zlib", FLAG_ZLIB), ("zstd", FLAG_ZSTD)])
def test_compression_is_used_only_when_smaller(codec, flag) -> None:
    rng = np.random.default_rng(7)
    ts = np.sort(rng.integers(0, 10**6, 2000).astype(np.uint64)) + np.arange(2000, dtype=np.uint64)
    zeros = np.zeros(2000, dtype=np.uint64)
    compressed = encode_segment(ts, zeros, np.arange(2000, dtype=np.uint64), codec=codec)
    plain = encode_segment(ts, zeros, np.arange(2000, dtype=np.uint64), compress=False)
    assert compressed[0] == flag and len(compressed) < len(plain)
    back = decode_segment(compressed, 2000)
    assert np.array_equal(back.timestamps, ts) and np.array_equal(back.entry_ids, np.arange(2000, dtype=np.uint64))
    tiny = encode_segment(np.array([1], np.uint64), zeros[:1], zeros[:1], codec=codec)
    assert tiny[0] == 0  # 56 bytes: not worth a header


def test_zstd_frame_must_end_at_the_payload_end_and_record_its_size() -> None:
    ts = np.arange(0, 4000, 2, dtype=np.uint64) ** 2
    zeros = np.zeros(len(ts), dtype=np.uint64)
    payload = encode_segment(ts, zeros, np.arange(len(ts), dtype=np.uint64), codec="zstd")
    assert payload[0] == FLAG_ZSTD
    with pytest.raises(SegmentCodecError, match="no zstd frame at byte") as info:
        decode_segment(payload + b"\x00", len(ts))
    assert info.value.offset == 9
    wrong_size = payload[:5] + (int.from_bytes(payload[5:9], "little") - 1).to_bytes(4, "little") + payload[9:]
    with pytest.raises(SegmentCodecError, match="recorded"):
        decode_segment(wrong_size, len(ts))
    with pytest.raises(SegmentCodecError):
        decode_segment(bytes([FLAG_ZLIB | FLAG_ZSTD]) + payload[1:], len(ts))


@pytest.mark.parametrize("ts, ledgers, entries", [
    ([], [], []), ([1, 2], [1], [1, 2]), ([2, 1], [1, 1], [1, 1]), ([1, 1], [1, 1], [4, 4])])
def test_encoder_refuses_bad_input(ts, ledgers, entries) -> None:
    with pytest.raises(ValueError):
        encode_segment(np.array(ts, np.uint64), np.array(ledgers, np.uint64), np.array(entries, np.uint64))


def test_decoder_checks_count_and_order() -> None:
    one = np.ones(3, dtype=np.uint64)
    payload = encode_segment(np.arange(3, dtype=np.uint64), one, one, compress=False)
    with pytest.raises(SegmentCodecError, match="metadata says 4") as info:
        decode_segment(payload, 4)
    assert info.value.offset == 1
    # Timestamps 2, 1, 0 via a zigzag column: decodes, but is out of order.
    backwards = bytearray(payload[:5]) + b"\x02" + (2).to_bytes(8, "little") + b"\x01\x01\x01" + payload[5 + 17:]
    with pytest.raises(SegmentCodecError, match="order"):
        decode_segment(bytes(backwards))
    assert len(decode_segment(bytes(backwards), check_order=False)) == 3
    with pytest.raises(SegmentCodecError):
        decode_segment(b"\x00" + (MAX_SEGMENT_INDEXES + 1).to_bytes(4, "little"))


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=80))
def test_decoder_raises_only_its_own_error_on_garbage(payload) -> None:
    try:
        decode_segment(payload)
    except SegmentCodecError as exc:
        assert 0 <= exc.offset <= max(len(payload), 9)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 2_000) | U64, st.integers(0, 6) | U64, st.integers(0, 300) | U64),
                     min_size=1, max_size=120),
       cuts=st.lists(st.integers(1, 119), max_size=30), block=st.sampled_from([1, 3, 16, 1 << 15]),
       compress=st.booleans(), codec=st.sampled_from(["zlib", "zstd"]))
def test_encoding_segments_together_equals_encoding_each_alone(rows, cuts, block, compress, codec) -> None:
    """encode_segments makes every choice with array operations across segments (reductions
    between neighbouring segments, blocks of segments, one compressor): each payload must
    still be exactly what the segment alone encodes to."""
    ts, ledgers, entries = _sorted_rows(rows)
    starts = np.array(sorted({0, *(c for c in cuts if c < len(ts))}), dtype=np.int64)
    bounds = list(zip(starts.tolist(), [*starts[1:].tolist(), len(ts)]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(segment_codec, "_BLOCK_ROWS", block)
        together = encode_segments(ts, ledgers, entries, starts, compress=compress, codec=codec)
    alone = [encode_segment(ts[lo:hi], ledgers[lo:hi], entries[lo:hi], compress=compress, codec=codec)
             for lo, hi in bounds]
    assert together == alone
    for payload, (lo, hi) in zip(together, bounds):
        seg = decode_segment(payload, hi - lo)
        assert np.array_equal(seg.timestamps, ts[lo:hi]) and np.array_equal(seg.entry_ids, entries[lo:hi])


def test_encode_segments_refuses_bad_starts() -> None:
    col = np.arange(4, dtype=np.uint64)
    for starts in ([1], [0, 0], [0, 4], []):
        with pytest.raises(ValueError, match="segment starts"):
            encode_segments(col, col, col, np.array(starts, dtype=np.int64))
    with pytest.raises(ValueError, match="strictly increasing"):
        encode_segments(col[::-1].copy(), col, col, np.array([0, 2], dtype=np.int64))


def _sparse_fixed_delay_segment() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """5,000 rows of a sparse bucket under a fixed delay: 1 % of the entries of 10,000-entry
    ledgers, so in time order the entry ids climb ledger by ledger (a FRAME column whose high
    bytes repeat in short runs) and the timestamps' differences are small (DELTA_U)."""
    rng = np.random.default_rng(11)
    chosen = np.flatnonzero(rng.random(600_000) < 0.01)[:5_000].astype(np.uint64)
    return chosen + np.uint64(60_000), chosen // np.uint64(10_000), chosen % np.uint64(10_000)


def test_only_planes_of_differences_look_for_long_matches_only(monkeypatch) -> None:
    """Planes of differences are compressed with a shortest match of 7 (compression._ZSTD_MIN_MATCH),
    which takes bytes off small random differences; planes of offsets keep level 1's own, with which
    a climbing entry column's repeated high bytes compress better. Each choice, swapped, costs bytes."""
    rows = _sparse_fixed_delay_segment()
    mine = len(encode_segment(*rows))
    monkeypatch.setattr(segment_codec, "_DIFFERENCE_KINDS", (KIND_DELTA_U, KIND_DELTA_Z, KIND_FRAME))
    offsets_too = len(encode_segment(*rows))
    monkeypatch.setattr(segment_codec, "_DIFFERENCE_KINDS", ())
    none = len(encode_segment(*rows))
    assert mine < offsets_too and mine <= none
    seg = decode_segment(encode_segment(*rows), 5_000)
    assert np.array_equal(seg.entry_ids, rows[2])
