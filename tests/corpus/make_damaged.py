"""Write the fixed corpus of damaged ledger files, ``tests/corpus/damaged/*.ledger``.

Run from the repository root::

    PYTHONPATH=.:tests python tests/corpus/make_damaged.py

Each file is a golden file (``formats/golden``) with one named kind of damage.
Where the damage sits behind a checksum, the file is re-framed with correct
CRCs so that the damage reaches the decoder it is aimed at. Every file here
must be rejected by ``BucketFile`` (plus reading its segments), by
``bucketstore verify`` and by ``bucketstore dump``; ``tests/format/test_fuzz.py`` and
``tests/cli/test_cli.py`` replay them on every run. The output is deterministic.

``*.summary`` files are the golden catalog summary (``formats/golden/summary_v2.bin``) with
one field wrong (``summary_damage.py``): each must be refused or disagree with the bucket
it describes (``tests/format/test_summary_damage.py``), and no bucket file is deleted on
the word of such a summary (``tests/engine/catalog/test_deletion_evidence.py``).
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from collections.abc import Callable

import zstandard
from crc32c import crc32c

from bucketstore.format.ledger_file import masked_crc32c
from bucketstore.format.segment_codec import decode_segment, encode_segment
from bucketstore.format.snapshot import decode_metadata, encode_metadata
from corpus.framing import frame_ledger, split_ledger, trailer
from corpus.summary_damage import SUMMARY_CASES

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, os.pardir, os.pardir, "formats", "golden")


def _golden(name: str) -> bytes:
    with open(os.path.join(GOLDEN, name + ".ledger"), "rb") as f:
        return f.read()


def _parts(name: str) -> tuple[int, dict, list[bytes]]:
    return split_ledger(os.path.join(GOLDEN, name + ".ledger"))


def _flip(data: bytes, offset: int, mask: int = 0x10) -> bytes:
    out = bytearray(data)
    out[offset] ^= mask
    return bytes(out)


def _header_size(data: bytes) -> int:
    return 28 + struct.unpack_from("<I", data, 20)[0]


def _forged_count() -> bytes:
    lid, props, payloads = _parts("several_ledgers")
    sound = frame_ledger(lid, props, payloads)
    body_end = len(sound) - 32 - 8 * len(payloads)
    return sound[:body_end] + trailer(lid, [], body_end, count=1 << 63)


def _frame_length() -> bytes:
    data = bytearray(_golden("time_cuts"))
    at = _header_size(data)
    struct.pack_into("<I", data, at, struct.unpack_from("<I", data, at)[0] - 1)
    return bytes(data)


def _with_entry0(name: str, entry0: bytes) -> bytes:
    lid, props, payloads = _parts(name)
    return frame_ledger(lid, props, [entry0, *payloads[1:]])


def _segment_dropped_from_entry0(name: str = "time_cuts") -> bytes:
    lid, props, payloads = _parts(name)
    meta = decode_metadata(payloads[0])
    gone = meta.segments.pop()
    meta.count -= gone.count
    return frame_ledger(lid, props, [encode_metadata(meta), *payloads[1:]])


def _segments_swapped(name: str = "time_cuts") -> bytes:
    lid, props, payloads = _parts(name)
    return frame_ledger(lid, props, [payloads[0], payloads[2], payloads[1], payloads[3]])


def _header_range() -> bytes:
    lid, props, payloads = _parts("count_cuts")
    return frame_ledger(lid, {**props, "start_ledger": 29}, payloads)


def _zlib_segment() -> bytes:
    lid, props, payloads = _parts("mixed_compression")
    seg = bytearray(payloads[1])
    seg[20] ^= 0x01  # inside the deflate stream of the 300-index segment
    return frame_ledger(lid, props, [payloads[0], bytes(seg), *payloads[2:]])


def _zstd_segment_frame() -> bytes:
    lid, props, payloads = _parts("v2_mixed_compression")
    seg = bytearray(payloads[1])
    assert seg[0] == 2  # a zstd segment
    seg[9] ^= 0x01  # the first frame's magic number
    return frame_ledger(lid, props, [payloads[0], bytes(seg), *payloads[2:]])


def _count_disagrees() -> bytes:
    lid, props, payloads = _parts("one_segment")
    seg = bytearray(payloads[1])
    struct.pack_into("<I", seg, 1, 39)
    return frame_ledger(lid, props, [payloads[0], bytes(seg)])


def _v1_segment_recoded(name: str, compress: bool) -> bytes:
    """A version-1 bucket whose segment 1 is re-encoded by the version-2 writer (FRAME/PACKED, zstd)."""
    lid, props, payloads = _parts(name)
    seg = decode_segment(payloads[1])
    recoded = encode_segment(seg.timestamps, seg.ledger_ids, seg.entry_ids, compress=compress, codec="zstd",
                             grouped=False)
    assert recoded[0] == (2 if compress else 0)
    assert compress or recoded[5 + 17] in (3, 4)  # the ledger column (after an ARITH timestamp column)
    return frame_ledger(lid, props, [payloads[0], recoded, *payloads[2:]])


def _v1_entry0_zstd() -> bytes:
    lid, props, payloads = _parts("several_ledgers")
    body = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(
        _decompressed_entry0(payloads[0]))
    return frame_ledger(lid, props, [struct.pack("<BI", 2, len(_decompressed_entry0(payloads[0]))) + body,
                                     *payloads[1:]])


def _decompressed_entry0(payload: bytes) -> bytes:
    flags, size = struct.unpack_from("<BI", payload)
    return zlib.decompress(payload[5:]) if flags == 1 else payload[5:]


def _v3_bitmap_sizes(shift: int) -> bytes:
    """The golden sparse v3 bucket with its first bitmap's size off by ``shift`` bytes; when
    ``shift`` is negative the next one's is off the other way (the sizes still add up, the cuts
    are wrong)."""
    import msgpack
    from bucketstore.format.compression import decompress_exact

    lid, props, payloads = _parts("v3_sparse_ledgers")
    flags, size = struct.unpack_from("<BI", payloads[0])
    doc = msgpack.unpackb(decompress_exact(payloads[0][5:], size, "zstd") if flags else payloads[0][5:])
    doc[5][2] += shift
    if shift < 0:
        doc[5][5] -= shift
    body = msgpack.packb(doc, use_bin_type=True)
    return frame_ledger(lid, props, [struct.pack("<BI", 0, len(body)) + body, *payloads[1:]])


def _v5_grouped_segment() -> bytes:
    """The golden v5 bucket of wide entry ids with its segments re-encoded by version 6's writer: the
    first one grouped, in a bucket whose entry 0 says version 5."""
    lid, props, payloads = _parts("v5_wide_entry_ids")
    segments = [decode_segment(p) for p in payloads[1:]]
    recoded = [encode_segment(s.timestamps, s.ledger_ids, s.entry_ids) for s in segments]
    assert any(p[0] & 4 for p in recoded)
    return frame_ledger(lid, props, [payloads[0], *recoded])


def _v6_grouped_ledgers_descend() -> bytes:
    """The golden small grouped segment with its second group's ledger difference 0 (ledger 10 twice)."""
    lid, props, payloads = _parts("v6_grouped_small")
    seg = bytearray(payloads[1])
    assert seg[0] == 4 and seg[11:15] == b"\x03\x0a\x0a\x0a"  # groups, then the three ledgers
    seg[13] = 0
    return frame_ledger(lid, props, [payloads[0], bytes(seg)])


CASES: dict[str, Callable[[], bytes]] = {
    "empty_file": lambda: b"",
    "truncated_footer": lambda: _golden("several_ledgers")[:-10],
    "truncated_half": lambda: _golden("several_ledgers")[:len(_golden("several_ledgers")) // 2],
    "bad_magic": lambda: b"\x89BKTLDX\n" + _golden("one_segment")[8:],
    "header_crc": lambda: _flip(_golden("one_segment"), 40),
    "version_2": lambda: frame_ledger(*_parts("one_segment"), version=2),
    "entry_crc": lambda: _flip(_golden("several_ledgers"), len(_golden("several_ledgers")) // 2),
    "trailer_crc": lambda: _flip(_golden("time_cuts"), len(_golden("time_cuts")) - 40),
    "forged_count": _forged_count,
    "frame_length": _frame_length,
    "entry0_msgpack_bomb": lambda: _with_entry0("one_segment", struct.pack("<BI", 0, 5) + b"\xdd\xff\xff\xff\xff"),
    "entry0_zlib_bomb": lambda: _with_entry0(
        "one_segment", struct.pack("<BI", 1, 100) + zlib.compress(bytes(1 << 20), 9)),
    "entry0_drops_a_segment": _segment_dropped_from_entry0,
    "segments_swapped": _segments_swapped,
    "header_range_disagrees": _header_range,
    "zlib_segment_damaged": _zlib_segment,
    "segment_count_disagrees": _count_disagrees,
    # The footer's reserved field (outside every CRC) must be 0, at file_size - 12.
    "footer_reserved_not_zero": lambda: _golden("one_segment")[:-12] + b"\x01" + _golden("one_segment")[-11:],
    # bucket_key is always written; one naming another range than entry 0 is damage.
    "bucket_key_disagrees": lambda: frame_ledger(
        *(lambda lid, props, payloads: (lid, {**props, "bucket_key": "#pulsar.internal.delayed.bucket_5_9"},
                                        payloads))(*_parts("one_segment"))),
    # A version-1 bucket using what only version 2 defines.
    "v1_packed_column": lambda: _v1_segment_recoded("one_segment", compress=False),
    "v1_zstd_segment": lambda: _v1_segment_recoded("mixed_compression", compress=True),
    "v1_entry0_zstd": _v1_entry0_zstd,
    # Format version 2 (bucket-wide bitmaps, zstd).
    "v2_entry0_drops_a_segment": lambda: _segment_dropped_from_entry0("v2_time_cuts"),
    "v2_segments_swapped": lambda: _segments_swapped("v2_time_cuts"),
    "v2_zstd_segment_frame_damaged": _zstd_segment_frame,
    "v2_entry0_zstd_bomb": lambda: _with_entry0(
        "v2_one_segment", struct.pack("<BI", 2, 100) + zstandard.ZstdCompressor(level=19).compress(bytes(1 << 20))),
    # Format version 3 (entry 0's bitmaps end to end, shuffled from 4 KiB).
    "v3_bitmap_sizes_do_not_add_up": lambda: _v3_bitmap_sizes(1),
    "v3_bitmap_sizes_cut_wrong": lambda: _v3_bitmap_sizes(-2),
    # Format version 6 (grouped segments): one in an older bucket, and a damaged directory.
    "v5_grouped_segment": _v5_grouped_segment,
    "v6_grouped_ledgers_descend": _v6_grouped_ledgers_descend,
}


def _journal(version: int = 2) -> bytes:
    with open(os.path.join(GOLDEN, f"journal_v{version}.journal"), "rb") as f:
        return f.read()


def _journal_header_size(data: bytes) -> int:
    return 24 if data[8] == 1 else 42 + struct.unpack_from("<H", data, 36)[0]


def _journal_reheadered(**fields: int) -> bytes:
    """The golden v2 journal with header fields changed and its header CRC made right again."""
    data = bytearray(_journal())
    for name, value in fields.items():
        struct.pack_into({"version": "<H", "reserved": "<H"}[name], data, {"version": 8, "reserved": 10}[name],
                         value)
    size = _journal_header_size(_journal())
    struct.pack_into("<I", data, size - 4, masked_crc32c(bytes(data[:size - 4])))
    return bytes(data)


def _journal_inserted(group: bytes) -> bytes:
    """The golden v2 journal (file number 0) with ``group`` inserted before its first group."""
    data = _journal()
    at = _journal_header_size(data)
    return data[:at] + group + data[at:]


#: Damaged journal files (``journal_*.journal``, file number 0, the newest file of its
#: journal) and the offset the reader must name; ``tests/format/test_journal_golden.py`` replays them.
JOURNAL_CASES: dict[str, tuple[Callable[[], bytes], int]] = {
    # A version this reader does not know is named at the version field, even with its CRC wrong.
    "journal_version_3": (lambda: b"".join([_journal()[:8], struct.pack("<H", 3), _journal()[10:]]), 8),
    "journal_version_3_crc_right": (lambda: _journal_reheadered(version=3), 8),
    "journal_reserved_not_zero": (lambda: _journal_reheadered(reserved=1), 10),
    # body_len 0 with the right CRC of an empty body, then the real groups.
    "journal_empty_group": (lambda: _journal_inserted(struct.pack("<II", 0, masked_crc32c(b"", crc32c(bytes(8))))),
                            _journal_header_size(_journal())),
    # An all-zero frame with groups after it: not a torn tail, even in the newest file.
    "journal_zero_frame_then_data": (lambda: _journal_inserted(bytes(8)), _journal_header_size(_journal())),
}


def main(argv: list[str]) -> int:
    out_dir = argv[1] if len(argv) > 1 else os.path.join(HERE, "damaged")
    os.makedirs(out_dir, exist_ok=True)
    for name, make in CASES.items():
        with open(os.path.join(out_dir, name + ".ledger"), "wb") as f:
            f.write(make())
        print(f"wrote {name}.ledger")
    for name, (make_journal, _) in JOURNAL_CASES.items():
        with open(os.path.join(out_dir, name + ".journal"), "wb") as f:
            f.write(make_journal())
        print(f"wrote {name}.journal")
    with open(os.path.join(GOLDEN, "summary_v2.bin"), "rb") as f:
        golden_summary = f.read()
    for name, change in SUMMARY_CASES.items():
        with open(os.path.join(out_dir, name + ".summary"), "wb") as f:
            f.write(change(golden_summary))
        print(f"wrote {name}.summary")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
