"""Grouped segments (snapshot version 6): rows stored ledger by ledger, no ledger column.

The round trips over the whole uint64 range are ``test_segment_codec``'s (the writer groups any
segment of several ledgers when that is smaller); these pin the choice, the directory's checks
and the version rule. The bytes are ``formats/golden/v6_*`` and the spec's own reading of them
is ``test_spec_agreement``'s.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bucketstore.format import varints
from bucketstore.format.segment_codec import FLAG_GROUPED, FLAG_ZSTD, SegmentCodecError, decode_segment, encode_segment
from bucketstore.format.snapshot import sort_indexes

_U64 = np.uint64
BASE = 1_700_000_000_000


def _interleaved(n_ledgers: int = 4, per_ledger: int = 1_250, seed: int = 0):
    """One merged segment's rows: a few ledgers, random delays, interleaved row by row."""
    rng = np.random.default_rng(seed)
    ledgers = np.repeat(np.arange(10, 10 + n_ledgers, dtype=_U64), per_ledger)
    entries = np.tile(np.arange(per_ledger, dtype=_U64), n_ledgers) * _U64(3)
    return sort_indexes(BASE + rng.integers(0, 15_000, len(ledgers)).astype(_U64), ledgers, entries)


def test_an_interleaved_segment_is_grouped_and_smaller() -> None:
    ts, ledgers, entries = _interleaved()
    grouped, in_order = encode_segment(ts, ledgers, entries), encode_segment(ts, ledgers, entries, grouped=False)
    assert grouped[0] == FLAG_GROUPED | FLAG_ZSTD and in_order[0] == FLAG_ZSTD
    assert len(grouped) < len(in_order), (len(grouped), len(in_order))
    seg = decode_segment(grouped, len(ts), snapshot_version=6)
    assert np.array_equal(seg.timestamps, ts) and np.array_equal(seg.ledger_ids, ledgers)
    assert np.array_equal(seg.entry_ids, entries)


def test_a_one_ledger_segment_is_never_grouped() -> None:
    ts, _, entries = _interleaved(1)
    assert encode_segment(ts, np.full(len(ts), 7, _U64), entries)[0] == FLAG_ZSTD


@settings(max_examples=60, deadline=None)
@given(n_ledgers=st.integers(2, 40), per_ledger=st.integers(1, 60), seed=st.integers(0, 1 << 16),
       compress=st.booleans())
def test_the_writer_keeps_the_smaller_layout(n_ledgers, per_ledger, seed, compress) -> None:
    ts, ledgers, entries = _interleaved(n_ledgers, per_ledger, seed)
    chosen = encode_segment(ts, ledgers, entries, compress=compress)
    assert len(chosen) <= len(encode_segment(ts, ledgers, entries, compress=compress, grouped=False))
    seg = decode_segment(chosen, len(ts))
    assert np.array_equal(seg.timestamps, ts) and np.array_equal(seg.ledger_ids, ledgers)


def _small_grouped() -> bytes:
    """formats/golden/v6_grouped_small's segment: 8 rows of ledgers 10, 20, 30, uncompressed."""
    rows = [(0, 10, 4), (3, 20, 1), (3, 30, 0), (5, 10, 2), (9, 30, 5), (12, 20, 3), (12, 20, 7), (20, 10, 9)]
    ts, ledgers, entries = (np.array(c, dtype=_U64) for c in zip(*rows))
    payload = encode_segment(ts + _U64(BASE), ledgers, entries, compress=False)
    assert payload[0] == FLAG_GROUPED
    return payload


def _directory(payload: bytes) -> tuple[list[int], int]:
    """The directory's values and where the columns start (in the payload)."""
    (base, groups), pos = varints.decode(payload, 5, 2)
    rest, pos = varints.decode(payload, pos, 2 * int(groups) - 1)
    return [int(base), int(groups), *map(int, rest)], pos


def _with_directory(payload: bytes, values: list[int]) -> bytes:
    _, pos = _directory(payload)
    return payload[:5] + varints.encode(values) + payload[pos:]


def test_the_small_segment_reads_as_the_spec_example_says() -> None:
    payload = _small_grouped()
    assert _directory(payload)[0] == [BASE, 3, 10, 10, 10, 3, 3]
    assert payload.hex().endswith("04" + "00" * 8 + "04" + "503f0963" + "04" + "00" * 8 + "04" + "14203597")


@pytest.mark.parametrize("values, message", [
    ([BASE, 0, 10], "0 groups in a segment of 8 rows"),
    ([BASE, 9, *[1] * 17], "9 groups in a segment of 8 rows"),
    ([BASE, 3, 10, 0, 10, 3, 3], "ledgers are not strictly ascending"),
    ([BASE, 3, 10, 10, (1 << 64) - 15, 3, 3], "ledgers are not strictly ascending"),  # a wrap
    ([BASE, 3, 10, 10, 10, 3, 5], "sizes leave no row of the 8 for the last group"),
    ([BASE, 3, 10, 10, 10, 0, 3], "sizes leave no row"),
])
def test_a_damaged_directory_is_refused(values, message) -> None:
    with pytest.raises(SegmentCodecError, match=message):
        decode_segment(_with_directory(_small_grouped(), values), 8)


def test_truncated_and_overlong_varints_are_refused_at_their_offset() -> None:
    payload = _small_grouped()
    with pytest.raises(SegmentCodecError, match="varints are missing or truncated") as exc:
        decode_segment(payload[:5] + b"\x80\x80", 8)
    assert exc.value.offset == 5  # the base, whose two bytes both say that more follow
    with pytest.raises(SegmentCodecError, match="more than 10 bytes") as exc:
        decode_segment(payload[:5] + b"\x81" * 11 + b"\x01" + payload[11:], 8)
    assert exc.value.offset == 5
    with pytest.raises(SegmentCodecError, match="2\\*\\*64 or more"):
        decode_segment(payload[:5] + b"\xff" * 9 + b"\x02" + payload[11:], 8)


def test_rows_out_of_order_and_bytes_left_over_are_refused() -> None:
    payload = bytearray(_small_grouped())
    # The entries' packed nibbles, in row order: rows 5 and 6 (ledger 20 at timestamp 12) hold
    # entries 3 then 7; swapped, the rows are out of order.
    at = len(payload) - 4
    assert payload[at + 2] == 0x35 and payload[at + 3] == 0x97
    payload[at + 2], payload[at + 3] = 0x75, 0x93
    with pytest.raises(SegmentCodecError, match="out of \\(timestamp, ledger, entry\\) order at row 6"):
        decode_segment(bytes(payload), 8)
    with pytest.raises(SegmentCodecError, match="1 unexpected bytes after the columns"):
        decode_segment(_small_grouped() + b"\x00", 8)


def test_a_step_that_wraps_is_refused() -> None:
    payload = bytearray(_small_grouped())
    _, pos = _directory(bytes(payload))
    assert payload[pos] == 4 and payload[pos + 9] == 4  # steps: PACKED, 4 bits, base 0
    # Base 2**64 - 3 makes every step 3 less, modulo 2**64: ledger 20's last step, 0, wraps.
    payload[pos + 1:pos + 9] = ((1 << 64) - 3).to_bytes(8, "little")
    with pytest.raises(SegmentCodecError, match="timestamp 5 of the grouped body is before the one before it"):
        decode_segment(bytes(payload), 8)


def test_a_grouped_segment_needs_version_6() -> None:
    payload = _small_grouped()
    for version in (1, 2, 3, 4, 5):
        with pytest.raises(SegmentCodecError, match=f"grouped segment in a version-{version} bucket"):
            decode_segment(payload, 8, snapshot_version=version)
    assert len(decode_segment(payload, 8, snapshot_version=6)) == len(decode_segment(payload, 8)) == 8


def test_an_impossible_inflated_size_is_refused_before_inflating() -> None:
    ts, ledgers, entries = _interleaved()
    payload = encode_segment(ts, ledgers, entries)
    assert payload[0] & FLAG_GROUPED
    n = len(ts)
    bad = payload[:5] + struct.pack("<I", 10 * (2 * n + 1) + 2 * (10 + 8 * n) + 1) + payload[9:]
    with pytest.raises(SegmentCodecError, match="impossible"):
        decode_segment(bad, n)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, (1 << 64) - 1), max_size=20))
def test_varints_round_trip_in_their_shortest_form(values) -> None:
    data = varints.encode(values)
    got, end = varints.decode(data + b"\x80", 0, len(values))
    assert got.tolist() == values and end == len(data)
    assert len(data) == sum(max(1, -(-v.bit_length() // 7)) for v in values)


@settings(max_examples=200, deadline=None)
@given(data=st.lists(st.sampled_from([0x00, 0x01, 0x02, 0x7F, 0x80, 0x81, 0xFF]), max_size=13).map(bytes))
@example(data=b"\x80" * 10).via("ten bytes that all say more follows, then the end: truncated")
@example(data=b"\x80" * 11).via("eleven: too long")
@example(data=b"\xff" * 9 + b"\x02").via("2**64 and more")
def test_one_varint_reads_as_many_do(data) -> None:
    """``decode_one`` (the directory's first two values) agrees with the array reader, errors included."""
    try:
        want = varints.decode(data, 0, 1)
    except varints.VarintError as exc:
        with pytest.raises(varints.VarintError) as got:
            varints.decode_one(data, 0)
        assert (got.value.offset, got.value.reason) == (exc.offset, exc.reason)
    else:
        assert varints.decode_one(data, 0) == (int(want[0][0]), want[1])


def _column_pieces(body: bytes, pos: int, n: int) -> tuple[list[bytes], int]:
    """A column's pieces as the spec cuts them (its header, then each plane or its packed bits)."""
    kind = body[pos]
    if kind == 0:
        return [body[pos:pos + 17]], pos + 17
    width = body[pos + 9]
    pieces = [body[pos:pos + 10]]
    pos += 10
    if kind == 4:
        size = -(-n * width // 8)
        return pieces + [body[pos:pos + size]], pos + size
    plane = n if kind == 3 else n - 1
    for _ in range(width):
        pieces.append(body[pos:pos + plane])
        pos += plane
    return pieces, pos


@settings(max_examples=40, deadline=None)
@given(n_ledgers=st.integers(2, 12), per_ledger=st.integers(20, 400), seed=st.integers(0, 1 << 16))
def test_a_grouped_payload_is_its_pieces_compressed_as_the_spec_frames_them(n_ledgers, per_ledger, seed) -> None:
    """The writer compresses the entry-id column once for both layouts when both heads end a frame:
    the payload must still be exactly the spec's framing of the whole body (frames closed once they
    hold 64 bytes, steps planes with long matches only)."""
    from bucketstore.format.compression import Compressor, decompress_exact

    ts, ledgers, entries = _interleaved(n_ledgers, per_ledger, seed)
    payload = encode_segment(ts, ledgers, entries)
    if payload[0] != FLAG_GROUPED | FLAG_ZSTD:
        return
    n = len(ts)
    (raw_len,) = struct.unpack_from("<I", payload, 5)
    body = decompress_exact(payload[9:], raw_len, "zstd")
    _, pos = _directory(payload[:5] + body)
    pos -= 5
    steps, after = _column_pieces(body, pos, n)
    ids, end = _column_pieces(body, after, n)
    assert end == len(body)
    pieces = [body[:pos], *steps, *ids]
    differences = [False, *[True] * len(steps), *[ids[0][0] in (1, 2)] * len(ids)]
    assert payload[9:] == Compressor("zstd").compress(pieces, differences)
