"""Write the fixed corpus of damaged ledger files, ``tests/corpus/damaged/*.ledger``.

Run from the repository root::

    PYTHONPATH=.:tests python tests/corpus/make_damaged.py

Each file is a golden file (``formats/golden``) with one named kind of damage.
Where the damage sits behind a checksum, the file is re-framed with correct
CRCs so that the damage reaches the decoder it is aimed at. Every file here
must be rejected by ``BucketFile`` (plus reading its segments), by
``bucketstore verify`` and by ``bucketstore dump``; ``tests/test_fuzz.py`` and
``tests/test_cli.py`` replay them on every run. The output is deterministic.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from collections.abc import Callable

import zstandard

from bucketstore.format.snapshot import decode_metadata, encode_metadata
from corpus.framing import frame_ledger, split_ledger, trailer

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
    # Format version 2 (bucket-wide bitmaps, zstd).
    "v2_entry0_drops_a_segment": lambda: _segment_dropped_from_entry0("v2_time_cuts"),
    "v2_segments_swapped": lambda: _segments_swapped("v2_time_cuts"),
    "v2_zstd_segment_frame_damaged": _zstd_segment_frame,
    "v2_entry0_zstd_bomb": lambda: _with_entry0(
        "v2_one_segment", struct.pack("<BI", 2, 100) + zstandard.ZstdCompressor(level=19).compress(bytes(1 << 20))),
}


def main(argv: list[str]) -> int:
    out_dir = argv[1] if len(argv) > 1 else os.path.join(HERE, "damaged")
    os.makedirs(out_dir, exist_ok=True)
    for name, make in CASES.items():
        with open(os.path.join(out_dir, name + ".ledger"), "wb") as f:
            f.write(make())
        print(f"wrote {name}.ledger")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
