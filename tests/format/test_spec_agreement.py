"""What formats/*.md states in prose, checked against what the code writes.

The golden files and the damaged corpus pin bytes; these pin the rules a
reader in another language would take from the spec and that no single file
shows: the store's layout (store.md), the tracker config keys (catalog.md), the
FRAME/PACKED base and the zstd framing of a body (bucket_snapshot.md).
"""

from __future__ import annotations

import json
import os
import re
import struct

import numpy as np
import pytest
import zstandard

import bucketstore
from bucketstore.config import TrackerConfig
from bucketstore.engine.catalog.catalog import Catalog
from bucketstore.format.compression import compress
from bucketstore.format.segment_codec import KIND_FRAME, KIND_PACKED, encode_segment
from helpers import SMALL, FakeClock, fill_and_seal
from repo_paths import DAMAGED, FORMATS


def _spec(name: str) -> str:
    with open(os.path.join(FORMATS, name), encoding="utf-8") as f:
        return f.read()


def test_catalog_md_lists_exactly_the_config_keys_a_tracker_records(tmp_path) -> None:
    section = _spec("catalog.md").split("The tracker's `config`", 1)[1].split("\n\n", 2)[1]
    documented = re.findall(r"^\| `(\w+)` \|", section, re.M)
    with bucketstore.open(tmp_path / "s", "journal") as store:
        store.tracker("t", SMALL, FakeClock(0)).add_message(1, 1, 10_000)
    with Catalog(str(tmp_path / "s" / "catalog"), readonly=True) as catalog:
        recorded = catalog.tracker_state("t")["config"]
    assert documented == list(TrackerConfig.__dataclass_fields__) == list(recorded)


def test_a_store_holds_only_the_names_store_md_lists(tmp_path) -> None:
    """Every file a journal-mode store creates matches one of store.md's patterns."""
    layout = _spec("store.md").split("```", 2)[1]
    assert "ledgers/<ledger id, 20 digits>.ledger" in layout and "journal/<prefix>-<hash>/" in layout
    patterns = [r"LOCK", r"catalog/(data|lock)\.mdb", r"ledgers/\d{20}\.ledger(\.tmp)?",
                r"journal/[A-Za-z0-9._-]{1,48}-[0-9a-f]{16}/\d{20}\.journal(\.tmp)?"]
    path = tmp_path / "s"
    with bucketstore.open(path, "journal") as store:
        t = store.tracker("sub/é", SMALL, FakeClock(0))
        fill_and_seal(t, base=1000, ledgers=2)
    found = [os.path.relpath(os.path.join(root, f), path) for root, _, files in os.walk(path) for f in files]
    assert any(f.startswith("ledgers/") for f in found) and any(f.startswith("journal/") for f in found)
    for name in found:
        assert any(re.fullmatch(p, name) for p in patterns), name
    # The pid record in LOCK: ASCII decimal padded with spaces to 20 bytes.
    assert re.fullmatch(rb"\d+ *", (path / "LOCK").read_bytes()) and len((path / "LOCK").read_bytes()) == 20


def test_frame_and_packed_columns_use_the_column_minimum_as_base() -> None:
    n = 64
    rng = np.random.default_rng(7)
    ts = np.arange(n, dtype=np.uint64) + 1000
    ledgers = rng.integers(40, 43, n).astype(np.uint64)  # a few ledgers: PACKED
    entries = rng.integers(5000, 5000 + 300, n).astype(np.uint64)  # jumping about: FRAME
    payload = encode_segment(ts, ledgers, entries, compress=False)
    pos = 5 + 17  # after the prefix and the ARITH timestamp column
    kind, base, bits = struct.unpack_from("<BQB", payload, pos)
    assert (kind, base) == (KIND_PACKED, int(ledgers.min()))
    pos += 10 + (n * bits + 7) // 8
    kind, base, _ = struct.unpack_from("<BQB", payload, pos)
    assert (kind, base) == (KIND_FRAME, int(entries.min()))


def _frames(data: bytes) -> list[tuple[int, zstandard.FrameParameters]]:
    """(size, parameters) of each frame, found by decompressing one at a time."""
    out, pos = [], 0
    while pos < len(data):
        params = zstandard.get_frame_parameters(data[pos:])
        obj = zstandard.ZstdDecompressor().decompressobj()
        obj.decompress(data[pos:])
        end = len(data) - len(obj.unused_data)
        out.append((params.content_size, params))
        pos = end
    return out


def test_zstd_pieces_join_forward_and_a_short_end_is_a_frame_of_its_own() -> None:
    pieces = [bytes(100), b"a" * 3, b"b" * 10, bytes(70), b"c" * 5, b"d" * 7]
    frames = _frames(compress(pieces, "zstd"))
    # 100 alone; 3 + 10 + 70 = 83 (short pieces join the ones after them); the last 5 + 7 = 12
    # bytes are a frame of their own, not joined to the frame before.
    assert [size for size, _ in frames] == [100, 83, 12]
    for _, params in frames:  # the writer's frame header flags (bucket_snapshot.md, Compression)
        assert params.content_size >= 0 and not params.has_checksum and params.dict_id == 0


def _corpus(name: str) -> str:
    return os.path.join(DAMAGED, name + ".ledger")


def test_version_1_buckets_using_version_2_codecs_and_a_wrong_bucket_key_fail_where_the_spec_says() -> None:
    """bucket_snapshot.md: bucket_key [24]; in a version-1 bucket, zstd entry 0 at [0] of entry 0, a zstd
    segment at [0] of the segment, a FRAME/PACKED column at its kind byte."""
    from bucketstore import CorruptLedgerError
    from bucketstore.checking.ledger_check import check_file
    from bucketstore.format.ledger_file import LedgerReader
    from bucketstore.format.snapshot import BucketFile

    def payload_at(name: str, entry: int) -> int:
        with LedgerReader(_corpus(name)) as reader:
            return reader.entry_payload_offset(entry)

    size = os.path.getsize(_corpus("footer_reserved_not_zero"))
    expected = {
        "footer_reserved_not_zero": (size - 12, "reserved"),
        "bucket_key_disagrees": (24, "bucket_key"),
        "v1_entry0_zstd": (payload_at("v1_entry0_zstd", 0), "zstd"),
        "v1_zstd_segment": (payload_at("v1_zstd_segment", 1), "zstd"),
        "v1_packed_column": (payload_at("v1_packed_column", 1) + 5 + 17, "column kind 4"),  # after ARITH timestamps
    }
    for name, (offset, words) in expected.items():
        try:
            with BucketFile(_corpus(name)) as bucket:
                for number in range(1, bucket.segment_count + 1):
                    bucket.read_segment(number)
        except CorruptLedgerError as exc:
            assert (exc.offset, words in exc.reason) == (offset, True), (name, exc)
        else:
            raise AssertionError(f"{name} read as sound")
        findings = check_file(_corpus(name)).findings
        assert [(f.offset, words in f.message) for f in findings] == [(offset, True)], (name, findings)


def test_v3_entry0_is_the_table_then_the_shuffled_portable_bitmaps_in_frames_of_their_own() -> None:
    """bucket_snapshot.md, entry 0 (version 3): the bitmaps' portable serializations laid end to end in
    table order, even bytes then odd bytes, as the body's last element; from 4096 such bytes the
    msgpack before them and each half are zstd frames of their own."""
    import msgpack
    from pyroaring import BitMap

    from bucketstore.format.ledger_file import LedgerReader
    from repo_paths import GOLDEN

    with LedgerReader(os.path.join(GOLDEN, "v3_sparse_ledgers.ledger")) as reader:
        payload = bytes(reader.read_entry(0))
    flags, body_len = struct.unpack_from("<BI", payload)
    frames = _frames(payload[5:])
    body = b"".join(zstandard.ZstdDecompressor().decompress(payload[5:][start:end])
                    for start, end in _frame_extents(payload[5:]))
    assert flags == 2 and len(body) == body_len
    doc = msgpack.unpackb(body)
    assert doc[0] == 3 and len(doc) == 7
    table, shuffled = doc[5], doc[6]
    total = len(shuffled)
    assert total >= 4096 and body.endswith(shuffled)
    assert [size for size, _ in frames] == [body_len - total, (total + 1) // 2, total // 2]
    data = bytearray(total)
    data[0::2], data[1::2] = shuffled[:(total + 1) // 2], shuffled[(total + 1) // 2:]
    with open(os.path.join(GOLDEN, "v3_sparse_ledgers.json"), encoding="utf-8") as f:
        expected = json.load(f)["metadata"]["bitmaps"]
    pos = 0
    for (ledger, width, size), want in zip(zip(table[0::3], table[1::3], table[2::3]), expected, strict=True):
        bm = BitMap(want["entries"])
        bm.run_optimize()
        assert (ledger, width, bytes(data[pos:pos + size])) == (want["ledger_id"], 32, bm.serialize())
        pos += size
    assert pos == total


def _frame_extents(data: bytes) -> list[tuple[int, int]]:
    out, pos = [], 0
    while pos < len(data):
        obj = zstandard.ZstdDecompressor().decompressobj()
        obj.decompress(data[pos:])
        end = len(data) - len(obj.unused_data)
        out.append((pos, end))
        pos = end
    return out


def _spec_column(body: bytes, pos: int, n: int) -> tuple[list[int], int]:
    """bucket_snapshot.md's column, decoded as the spec words it (kinds 0..4), one value at a time."""
    kind = body[pos]
    if kind == 0:
        first, step = struct.unpack_from("<QQ", body, pos + 1)
        return [(first + j * step) % (1 << 64) for j in range(n)], pos + 17
    first, width = struct.unpack_from("<QB", body, pos + 1)
    pos += 10
    if kind == 4:
        per, size = 8 // width, -(-n * width // 8)
        raw = body[pos:pos + size]
        return [first + ((raw[j // per] >> ((j % per) * width)) & ((1 << width) - 1)) for j in range(n)], pos + size
    stored = n if kind == 3 else n - 1
    planes = [body[pos + k * stored:pos + (k + 1) * stored] for k in range(width)]
    values = [sum(planes[k][j] << (8 * k) for k in range(width)) for j in range(stored)]
    pos += width * stored
    if kind == 3:
        return [(first + v) % (1 << 64) for v in values], pos
    out = [first]
    for z in values:
        d = (z >> 1) ^ -(z & 1) if kind == 2 else z
        out.append((out[-1] + d) % (1 << 64))
    return out, pos


def test_v4_entry0_lists_are_three_columns_of_ledgers_counts_and_gaps() -> None:
    """bucket_snapshot.md, entry 0 (version 4): array-only ledgers leave the table; their ids are
    the body's last element, columns of ledger ids, counts and gaps (first id, then each id minus
    the one before it minus 1), each column's planes in zstd frames of their own."""
    import msgpack

    from bucketstore.format.ledger_file import LedgerReader
    from repo_paths import GOLDEN

    with LedgerReader(os.path.join(GOLDEN, "v4_sparse_ledgers.ledger")) as reader:
        payload = bytes(reader.read_entry(0))
    flags, body_len = struct.unpack_from("<BI", payload)
    body = b"".join(zstandard.ZstdDecompressor().decompress(payload[5:][start:end])
                    for start, end in _frame_extents(payload[5:]))
    assert flags == 2 and len(body) == body_len and len(_frames(payload[5:])) >= 3  # the head, each gap plane
    doc = msgpack.unpackb(body)
    assert doc[0] == 4 and len(doc) == 9 and doc[5] == [] and doc[6] == b""
    with open(os.path.join(GOLDEN, "v4_sparse_ledgers.json"), encoding="utf-8") as f:
        expected = json.load(f)["metadata"]["bitmaps"]
    lists = doc[8]
    assert doc[7] == len(expected) and body.endswith(lists)
    ledgers, pos = _spec_column(lists, 0, doc[7])
    counts, pos = _spec_column(lists, pos, doc[7])
    gaps, pos = _spec_column(lists, pos, sum(counts))
    assert pos == len(lists)
    got, at = [], 0
    for ledger, count in zip(ledgers, counts):
        ids = [gaps[at]]
        for gap in gaps[at + 1:at + count]:
            ids.append(ids[-1] + gap + 1)
        got.append({"ledger_id": ledger, "width": 32, "entries": ids})
        at += count
    assert got == expected


def _spec_varints(body: bytes, pos: int, k: int) -> tuple[list[int], int]:
    """bucket_snapshot.md's varints (unsigned LEB128), one byte at a time."""
    out = []
    for _ in range(k):
        value = shift = 0
        while True:
            byte = body[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        out.append(value)
    return out, pos


def _spec_grouped(payload: bytes) -> list[tuple[int, int, int]]:
    """A grouped segment (flag bit 2, version 6) decoded as the spec words it, one row at a time."""
    flags, n = struct.unpack_from("<BI", payload)
    assert flags & 4
    if flags & 2:
        body = b"".join(zstandard.ZstdDecompressor().decompress(payload[9:][start:end])
                        for start, end in _frame_extents(payload[9:]))
        assert len(body) == struct.unpack_from("<I", payload, 5)[0]
    else:
        body = payload[5:]
    (base, groups), pos = _spec_varints(body, 0, 2)
    directory, pos = _spec_varints(body, pos, 2 * groups - 1)
    ledgers = [directory[0]]
    for difference in directory[1:groups]:
        ledgers.append(ledgers[-1] + difference)
    sizes = directory[groups:] + [n - sum(directory[groups:])]
    steps, pos = _spec_column(body, pos, n)
    entries, pos = _spec_column(body, pos, n)
    assert pos == len(body)
    pairs, at = [], 0
    for ledger, size in zip(ledgers, sizes):
        ts = base
        for j in range(at, at + size):
            ts = (ts + steps[j]) % (1 << 64)  # from the base for a group's first, else from the one before
            pairs.append((ts, ledger))
        at += size
    return [(ts, ledger, entry) for (ts, ledger), entry in zip(sorted(pairs), entries)]  # entry ids in row order


def test_v6_grouped_segments_decode_as_the_spec_words_them() -> None:
    """bucket_snapshot.md, grouped segments (version 6): a directory of varints (base, groups,
    ledgers as differences, all groups' sizes but the last's), the timestamp steps ledger by
    ledger, then the entry ids in row order; sorted, the (timestamp, ledger) pairs and the entry
    ids make the rows."""
    from bucketstore.format.ledger_file import LedgerReader
    from repo_paths import GOLDEN

    grouped = 0
    for name in ("v6_grouped_small", "v6_merged_ledgers", "v6_one_segment"):
        with open(os.path.join(GOLDEN, f"{name}.json"), encoding="utf-8") as f:
            metadata = json.load(f)["metadata"]
        assert metadata["snapshot_version"] == 6
        segments = metadata["segments"]
        with LedgerReader(os.path.join(GOLDEN, f"{name}.ledger")) as reader:
            for number, segment in enumerate(segments, start=1):
                payload = bytes(reader.read_entry(number))
                assert bool(payload[0] & 4) == segment["grouped"]
                if segment["grouped"]:
                    grouped += 1
                    assert _spec_grouped(payload) == [tuple(row) for row in segment["indexes"]]
    assert grouped >= 4


@pytest.mark.parametrize("name, version", [("v5_sparse_ledgers", 5), ("v6_sparse_ledgers", 6),
                                           ("v6_grouped_small", 6)])
def test_entry0_lists_ledgers_and_counts_and_the_ids_are_the_segments_rows(name: str, version: int) -> None:
    """bucket_snapshot.md, entry 0 (versions 5 and 6): the lists are two columns, ledger ids and
    counts; each listed ledger's entry ids are those of the segments' rows on it, decoded here from
    the segments as the spec words them (a body as is or in zstd frames: three columns, or from
    version 6 grouped by ledger)."""
    import msgpack

    from bucketstore.format.ledger_file import LedgerReader
    from repo_paths import GOLDEN

    def unframe(data: bytes) -> bytes:
        return b"".join(zstandard.ZstdDecompressor().decompress(data[start:end])
                        for start, end in _frame_extents(data))

    with LedgerReader(os.path.join(GOLDEN, f"{name}.ledger")) as reader:
        payloads = [bytes(reader.read_entry(k)) for k in range(reader.entry_count)]
    flags, body_len = struct.unpack_from("<BI", payloads[0])
    body = unframe(payloads[0][5:]) if flags == 2 else payloads[0][5:]
    assert flags in (0, 2) and len(body) == body_len
    doc = msgpack.unpackb(body)
    assert doc[0] == version and len(doc) == 9 and doc[7] > 0 and body.endswith(doc[8])
    ledgers, pos = _spec_column(doc[8], 0, doc[7])
    counts, pos = _spec_column(doc[8], pos, doc[7])
    assert pos == len(doc[8])  # no third column
    rows: dict[int, list[int]] = {}
    for payload in payloads[1:]:
        flags, n = struct.unpack_from("<BI", payload)
        if flags & 4:
            assert version >= 6
            for _, ledger, entry in _spec_grouped(payload):
                rows.setdefault(ledger, []).append(entry)
            continue
        seg = unframe(payload[9:]) if flags == 2 else payload[5:]
        _, pos = _spec_column(seg, 0, n)
        seg_ledgers, pos = _spec_column(seg, pos, n)
        seg_entries, pos = _spec_column(seg, pos, n)
        assert pos == len(seg)
        for ledger, entry in zip(seg_ledgers, seg_entries):
            rows.setdefault(ledger, []).append(entry)
    assert set(ledgers) <= set(rows) and [len(rows[k]) for k in ledgers] == counts
    with open(os.path.join(GOLDEN, f"{name}.json"), encoding="utf-8") as f:
        expected = json.load(f)["metadata"]["bitmaps"]
    assert [{"ledger_id": k, "width": 32, "entries": sorted(rows[k])} for k in ledgers] == [
        b for b in expected if b["ledger_id"] in ledgers]
