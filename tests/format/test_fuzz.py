"""Damaged and hostile ledger files: a typed error naming the file and offset, or a good read.

Every mutated file is read completely (``BucketFile``, its bitmaps and every segment) and
checked with ``verify.check_file``. The only acceptable outcomes are a
``CorruptLedgerError`` whose ``path`` is the file and whose ``offset`` lies in
``[0, size]``, or, when the mutation happens to leave a valid file, a
successful read. Any other exception fails the test, and so do a read that
takes more than a few seconds (an alarm) and a jump of the process's peak RSS.

Raise the number of examples with ``BUCKETSTORE_FUZZ_EXAMPLES`` (default 250
per property, about 2,500 cases in all).
"""

from __future__ import annotations

import glob
import os
import resource
import signal
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import msgpack
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bucketstore.errors import CorruptLedgerError
from bucketstore.format.snapshot import BucketFile
from bucketstore.checking.ledger_check import check_file
from corpus.framing import frame_ledger, split_ledger, trailer
from repo_paths import DAMAGED, GOLDEN

EXAMPLES = int(os.environ.get("BUCKETSTORE_FUZZ_EXAMPLES", "250"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
BASES = {os.path.basename(p): open(p, "rb").read() for p in sorted(glob.glob(os.path.join(GOLDEN, "*.ledger")))}
PARTS = {name: split_ledger(os.path.join(GOLDEN, name)) for name in BASES}
MAX_RSS_GROWTH_KB = 256 * 1024
READ_TIMEOUT_S = 10


@contextmanager
def _bounded() -> Iterator[None]:
    """Fail on a hang (SIGALRM) or on a peak-RSS jump while reading one file."""
    def _timeout(signum: int, frame: object) -> None:
        raise TimeoutError(f"reading took more than {READ_TIMEOUT_S} s")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(READ_TIMEOUT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < MAX_RSS_GROWTH_KB, f"peak RSS grew by {grown} KiB"


def check_damaged(path: str, data: bytes) -> bool:
    """Write ``data`` to ``path`` and read it as every reader does; True if it read cleanly."""
    with open(path, "wb") as f:
        f.write(data)
    size = len(data)
    ok = True
    with _bounded():
        try:
            with BucketFile(path) as bucket:
                # The bitmaps too: a version-5 entry 0's listed ledgers are gathered from the segments.
                dict(bucket.metadata.bitmaps.items())
                for number in range(1, bucket.segment_count + 1):
                    bucket.read_segment(number)
        except CorruptLedgerError as exc:
            assert exc.path == path
            assert type(exc.offset) is int and 0 <= exc.offset <= size, exc
            ok = False
        report = check_file(path)
    for finding in report.findings:
        assert finding.path == path
        assert finding.offset is None or 0 <= finding.offset <= size, finding
    if not ok:
        # What the engine's reader rejects, the full check must reject too.
        assert report.findings
    return ok


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("fuzz") / "case.ledger")


base_names = st.sampled_from(sorted(BASES))


# -- mutations of the bytes as stored --------------------------------------------------------------
@FUZZ
@given(name=base_names, data=st.data())
def test_truncation(target: str, name: str, data: st.DataObject) -> None:
    base = BASES[name]
    cut = data.draw(st.integers(0, len(base) - 1))
    assert not check_damaged(target, base[:cut])  # the footer is gone: never a valid file


@FUZZ
@given(name=base_names, data=st.data())
def test_bit_flips(target: str, name: str, data: st.DataObject) -> None:
    base = bytearray(BASES[name])
    for bit in data.draw(st.lists(st.integers(0, 8 * len(base) - 1), min_size=1, max_size=4, unique=True)):
        base[bit // 8] ^= 1 << (bit % 8)
    check_damaged(target, bytes(base))


@FUZZ
@given(name=base_names, data=st.data())
def test_overwritten_range(target: str, name: str, data: st.DataObject) -> None:
    base = bytearray(BASES[name])
    start = data.draw(st.integers(0, len(base) - 1))
    junk = data.draw(st.binary(min_size=1, max_size=64))
    base[start:start + len(junk)] = junk
    check_damaged(target, bytes(base[:len(BASES[name])]))


def _length_fields(name: str) -> list[tuple[int, str]]:
    """Every length / count / offset field of a base file: (file offset, struct format)."""
    base = BASES[name]
    lid, props, payloads = PARTS[name]
    (props_len,) = struct.unpack_from("<I", base, 20)
    fields = [(20, "<I"), (len(base) - 32, "<Q"), (len(base) - 24, "<Q")]
    at = 28 + props_len
    for payload in payloads:
        fields.append((at, "<I"))
        if payload:
            fields.append((at + 9, "<I"))  # entry 0's body_len, a segment's count
        at += 8 + len(payload)
    fields += [(at + 8 * k, "<Q") for k in range(len(payloads))]  # the trailer's offsets
    return fields


@FUZZ
@given(name=base_names, data=st.data())
def test_huge_length_fields(target: str, name: str, data: st.DataObject) -> None:
    base = bytearray(BASES[name])
    offset, fmt = data.draw(st.sampled_from(_length_fields(name)))
    bits = 8 * struct.calcsize(fmt)
    value = data.draw(st.sampled_from([(1 << bits) - 1, 1 << (bits - 1), (1 << (bits - 1)) - 1,
                                       (1 << bits) - 8, len(base), len(base) + 1]))
    struct.pack_into(fmt, base, offset, value)
    check_damaged(target, bytes(base))


@FUZZ
@given(name=base_names, data=st.data())
def test_forged_trailer_with_valid_crc(target: str, name: str, data: st.DataObject) -> None:
    lid, props, payloads = PARTS[name]
    sound = frame_ledger(lid, props, payloads)
    body_end = len(sound) - 32 - 8 * len(payloads)
    u64 = st.integers(0, (1 << 64) - 1)
    near = st.integers(0, 2 * len(sound))
    offsets = data.draw(st.lists(st.one_of(u64, near), max_size=len(payloads) + 2))
    trailer_offset = data.draw(st.one_of(u64, near, st.just(body_end)))
    count = data.draw(st.one_of(st.none(), u64, st.integers(0, len(payloads) + 2)))
    forged = sound[:body_end] + trailer(lid, offsets, trailer_offset, count)
    check_damaged(target, forged)


# -- hostile payloads inside a valid frame ---------------------------------------------------------
@FUZZ
@given(name=base_names, data=st.data())
def test_damaged_payload_with_valid_crc(target: str, name: str, data: st.DataObject) -> None:
    lid, props, payloads = PARTS[name]
    k = data.draw(st.integers(0, len(payloads) - 1))
    payload = bytearray(payloads[k])
    how = data.draw(st.sampled_from(["flip", "overwrite", "truncate", "extend"]))
    if how == "flip" and payload:
        bit = data.draw(st.integers(0, 8 * len(payload) - 1))
        payload[bit // 8] ^= 1 << (bit % 8)
    elif how == "overwrite" and payload:
        start = data.draw(st.integers(0, len(payload) - 1))
        junk = data.draw(st.binary(min_size=1, max_size=16))
        payload[start:start + len(junk)] = junk
    elif how == "truncate":
        del payload[data.draw(st.integers(0, max(len(payload) - 1, 0))):]
    else:
        payload += data.draw(st.binary(min_size=1, max_size=16))
    check_damaged(target, frame_ledger(lid, props, [*payloads[:k], bytes(payload), *payloads[k + 1:]]))


@FUZZ
@given(name=base_names, body=st.recursive(
    st.integers(-(1 << 63), (1 << 64) - 1) | st.binary(max_size=8) | st.text(max_size=4) | st.booleans()
    | st.none() | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=5), max_leaves=20))
def test_wrong_shaped_metadata_with_valid_crc(target: str, name: str, body: object) -> None:
    lid, props, payloads = PARTS[name]
    packed = msgpack.packb(body, use_bin_type=True)
    entry0 = struct.pack("<BI", 0, len(packed)) + packed
    assert not check_damaged(target, frame_ledger(lid, props, [entry0, *payloads[1:]]))


@FUZZ
@given(name=base_names, data=st.data())
def test_random_properties_with_valid_crc(target: str, name: str, data: st.DataObject) -> None:
    lid, props, payloads = PARTS[name]
    raw = data.draw(st.binary(max_size=64) | st.just(msgpack.packb({"kind": "bucket", "start_ledger": -1})))
    check_damaged(target, frame_ledger(lid, raw, payloads))


def _entry0(body: bytes, compressed: bytes | None = None, claimed: int | None = None, flag: int = 1) -> bytes:
    if compressed is None:
        return struct.pack("<BI", 0, len(body) if claimed is None else claimed) + body
    return struct.pack("<BI", flag, len(body) if claimed is None else claimed) + compressed


def _segment(count: int, compressed: bytes, raw_len: int, flag: int = 1) -> bytes:
    return struct.pack("<BII", flag, count, raw_len) + compressed


def _zstd(data: bytes, content_size: bool = True) -> bytes:
    return zstandard.ZstdCompressor(level=19, write_content_size=content_size).compress(data)


_ZSTD_ZEROS = _zstd(bytes(50_000_000))  # a few KB that inflate to 50 MB
_V2_BODY = msgpack.packb([2, 3, 4, 1, [1, 1, 1], [3, 32, b"junk"]])


# Crafted hostile entries, each framed with correct CRCs so it reaches a decoder.
_ZEROS = zlib.compress(bytes(50_000_000), 9)  # ~49 KB that inflates to 50 MB
HOSTILE_ENTRY0 = {
    "array32 of 2**32-1": _entry0(b"\xdd\xff\xff\xff\xff"),
    "map32 of 2**32-1": _entry0(b"\xdf\xff\xff\xff\xff"),
    "bin32 of 2**32-1": _entry0(b"\x95\x01\x00\x00\x00\x91\x94\x00\x00\x01\x93\x00\x20\xc6\xff\xff\xff\xff"),
    "str32 of 2**32-1": _entry0(b"\xdb\xff\xff\xff\xff"),
    "nesting 100000 deep": _entry0(b"\x91" * 100_000 + b"\x00"),
    "100000 segments claimed": _entry0(b"\x95\x01\x00\x00\x00\xdd\x00\x01\x86\xa0"),
    "body_len 2**32-1, tiny stream": _entry0(b"", zlib.compress(b"\x90"), (1 << 32) - 1),
    "zlib bomb, honest size": _entry0(bytes(50_000_000), _ZEROS),
    "zlib bomb, size understated": _entry0(bytes(1000), _ZEROS),
    "zlib stream with trailing bytes": _entry0(b"\x90", zlib.compress(b"\x90") + b"junk"),
    "zstd bomb, honest size": _entry0(bytes(50_000_000), _ZSTD_ZEROS, flag=2),
    "zstd bomb, size understated": _entry0(bytes(1000), _ZSTD_ZEROS, flag=2),
    "zstd frame with trailing bytes": _entry0(b"\x90" * 100, _zstd(b"\x90" * 100) + b"junk", flag=2),
    "zstd frame without a content size": _entry0(b"\x90" * 100, _zstd(b"\x90" * 100, False), flag=2),
    "zstd frame, size overstated": _entry0(b"\x90" * 100, _zstd(b"\x90" * 100), 101, flag=2),
    "zlib and zstd flags together": _entry0(b"\x90" * 100, _zstd(b"\x90" * 100), flag=3),
    "v2: bitmap that is not roaring": _entry0(_V2_BODY),
    "v2: 100000 segments claimed": _entry0(b"\x96\x02\x00\x00\x00\xdd\x00\x01\x86\xa0"),
    "v2: 2**32-1 bitmaps claimed": _entry0(b"\x96\x02\x00\x00\x00\x90\xdd\xff\xff\xff\xff"),
}
HOSTILE_SEGMENT = {
    "count 2**32-1": struct.pack("<BI", 0, (1 << 32) - 1) + bytes(51),
    "zlib bomb, raw_len at its cap": _segment(1, _ZEROS, 3 * 10 + 51),
    "zlib bomb, raw_len 2**32-1": _segment(2, _ZEROS, (1 << 32) - 1),
    "raw_len larger than the stream": _segment(1, zlib.compress(bytes(51)), 60),
    "zstd bomb, raw_len at its cap": _segment(1, _ZSTD_ZEROS, 3 * 10 + 51, flag=2),
    "zstd bomb, raw_len 2**32-1": _segment(2, _ZSTD_ZEROS, (1 << 32) - 1, flag=2),
    "zstd frame with trailing bytes": _segment(1, _zstd(bytes(51)) + b"x", 51, flag=2),
    "zstd frame truncated": _segment(1, _zstd(bytes(range(51)))[:-2], 51, flag=2),
    "width 3": struct.pack("<BI", 0, 2) + b"\x01" + bytes(8) + b"\x03" + bytes(3) + bytes(34),
    "unknown kind 7": struct.pack("<BI", 0, 1) + b"\x07" + bytes(16) + bytes(34),
}


@pytest.mark.parametrize("base", ["one_segment.ledger", "v2_one_segment.ledger"])
@pytest.mark.parametrize("label", sorted(HOSTILE_ENTRY0))
def test_hostile_entry0(target: str, label: str, base: str) -> None:
    lid, props, payloads = PARTS[base]
    assert not check_damaged(target, frame_ledger(lid, props, [HOSTILE_ENTRY0[label], *payloads[1:]]))


@pytest.mark.parametrize("base", ["one_segment.ledger", "v2_one_segment.ledger"])
@pytest.mark.parametrize("label", sorted(HOSTILE_SEGMENT))
def test_hostile_segment(target: str, label: str, base: str) -> None:
    lid, props, payloads = PARTS[base]
    assert not check_damaged(target, frame_ledger(lid, props, [payloads[0], HOSTILE_SEGMENT[label]]))


def test_wrong_magic_and_newer_version(target: str) -> None:
    lid, props, payloads = PARTS["one_segment.ledger"]
    sound = frame_ledger(lid, props, payloads)
    assert not check_damaged(target, b"\x89BKTLDX\n" + sound[8:])
    # A version-2 file with every CRC right is refused by name, not read as v1.
    newer = frame_ledger(lid, props, payloads, version=2)
    with pytest.raises(CorruptLedgerError, match="version 2 is not supported") as info:
        with open(target, "wb") as f:
            f.write(newer)
        BucketFile(target)
    assert info.value.offset == 8
    assert not check_damaged(target, frame_ledger(lid, props, payloads, flags=1))


def test_damaged_corpus_is_rejected(tmp_path) -> None:
    corpus = sorted(glob.glob(os.path.join(DAMAGED, "*.ledger")))
    assert len(corpus) >= 10
    for path in corpus:
        with open(path, "rb") as f:
            data = f.read()
        assert not check_damaged(str(tmp_path / os.path.basename(path)), data), path
