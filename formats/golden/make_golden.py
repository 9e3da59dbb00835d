"""Write the golden ledger files and their expected content.

Run from the repository root::

    PYTHONPATH=. python formats/golden/make_golden.py

Each case is fixed data (random cases use a seeded generator), written with the
library's own writer as ``<name>.ledger``, and described in ``<name>.json`` by
the data it was built from: header, properties, entry 0 (per segment its
bounds, count and bitmaps as sorted entry-id lists) and every index. The JSON
is derived from the input columns, not read back from the file, so a test
that reads the file and compares it with the JSON checks the reader against
the writer's intent. ``tests/format/test_golden.py`` does that, and re-encodes every
JSON to the same bytes.

Running this again must reproduce the committed files exactly; a difference
means the encoding changed, which is a format-version question (see
``formats/bucket_snapshot.md``, "Versions").
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from bucketstore.format.segment_codec import FLAG_GROUPED, FLAG_ZLIB, FLAG_ZSTD, GROUPED_VERSION
from bucketstore.format.snapshot import build_bucket, cut_segments, encode_metadata, sort_indexes, write_bucket

HERE = os.path.dirname(os.path.abspath(__file__))
BASE_TS = 1_700_000_000_000  # 2023-11-14T22:13:20Z: a realistic epoch-ms magnitude


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    ledger_id: int
    start_ledger: int
    end_ledger: int
    rows: Callable[[], list[tuple[int, int, int]]]
    time_step_ms: int = 300_000
    max_indexes: int = 5_000
    compress: bool = True
    properties: dict | None = None
    version: int = 1

    @property
    def file_name(self) -> str:
        return self.name if self.version == 1 else f"v{self.version}_{self.name}"


def _fixed_delay() -> list[tuple[int, int, int]]:
    # Two ledgers written alternately, one index per ms: the constant-step shape.
    return [(BASE_TS + i, 3 + i % 2, i // 2) for i in range(40)]


def _time_cuts() -> list[tuple[int, int, int]]:
    # Three bursts 1 s apart with a 1 s time step: three segments, cut by time.
    rows = []
    for burst in range(3):
        for i in range(6):
            rows.append((BASE_TS + 1_000 * burst + 7 * i, 20, 6 * burst + i))
    return rows


def _count_cuts() -> list[tuple[int, int, int]]:
    # Twelve indexes share one timestamp, so a count cut of 5 splits equal
    # timestamps across segments: the only way two segments may touch.
    rows = [(BASE_TS + 5, 30, e) for e in range(12)]
    rows += [(BASE_TS + 9 + i, 31, i) for i in range(4)]
    return rows


def _several_ledgers() -> list[tuple[int, int, int]]:
    # Random delays over five ledgers: timestamps rise unevenly, ledger and
    # entry columns go up and down (DELTA_U and DELTA_Z columns).
    rng = random.Random(195)
    rows = []
    for ledger in range(100, 105):
        for entry in range(30):
            publish = BASE_TS + 10 * entry
            rows.append((publish + rng.randrange(600_000), ledger, entry * 3 + rng.randrange(3)))
    return rows


def _wide_entry_ids() -> list[tuple[int, int, int]]:
    # Entry ids past 2**32 need the 64-bit bitmap; ledger 8 stays 32-bit in the
    # same segment. The last rows sit at the top of the uint64 range.
    top = (1 << 64) - 1
    rows = [(BASE_TS + i, 7, (1 << 32) - 2 + i) for i in range(5)]
    rows += [(BASE_TS + i, 8, 1000 + i) for i in range(5)]
    rows += [(top - 1, 7, top - 1), (top, 7, top)]
    return rows


def _mixed_compression() -> list[tuple[int, int, int]]:
    # A 300-index segment whose planar deltas zlib shrinks, then a 3-index
    # segment too small to compress: one zlib segment and one raw in one file.
    rng = random.Random(2024)
    rows = []
    ts = BASE_TS
    for entry in range(300):
        ts += rng.choice((1, 1, 2, 3))
        rows.append((ts, 50, entry))
    rows += [(BASE_TS + 400_000 + i, 51, i) for i in range(3)]
    return rows


CASES_V1 = [
    Case("empty", "a bucket with zero indexes: entry 0 only, no segments", 1, 9, 9, lambda: []),
    Case("one_segment", "40 fixed-delay indexes on two ledgers: one segment, constant-step columns, "
         "nothing compressed", 2, 3, 4, _fixed_delay, compress=False,
         properties={"tracker": "sub-1"}),
    Case("time_cuts", "three bursts 1 s apart cut by a 1 s time step", 3, 20, 20, _time_cuts,
         time_step_ms=1_000),
    Case("count_cuts", "equal timestamps split by a count cut of 5", 4, 30, 31, _count_cuts,
         max_indexes=5),
    Case("several_ledgers", "random delays on five ledgers, cut by count (40) and time (300 s)", 5, 100, 104,
         _several_ledgers, max_indexes=40),
    Case("wide_entry_ids", "entry ids beyond 2**32 (64-bit bitmap) and values at 2**64-1", 6, 7, 8,
         _wide_entry_ids, time_step_ms=1 << 62),
    Case("mixed_compression", "one zlib-compressed segment, one uncompressed, compressed entry 0", 7, 50, 51,
         _mixed_compression, max_indexes=-1),
]
def _sparse_ledgers() -> list[tuple[int, int, int]]:
    # 1 % of the entries of 120 ledgers of 1,000 entries, random delays: bitmaps of a few
    # entry ids each, enough of them (over 4 KiB) for version 3's shuffled bitmap frames.
    rng = random.Random(28)
    rows = []
    for ledger in range(1000, 1120):
        for entry in sorted(rng.sample(range(1_000), 10)):
            rows.append((BASE_TS + 1_000 * (ledger - 1000) + entry + rng.randrange(600_000), ledger, entry))
    return rows


def _grouped_small() -> list[tuple[int, int, int]]:
    # Three ledgers 10 apart (too far apart for a packed ledger column) interleaved by random
    # delays: grouped by ledger, the segment needs no ledger column (version 6).
    return [(BASE_TS + t, ledger, entry) for t, ledger, entry in (
        (0, 10, 4), (3, 20, 1), (3, 30, 0), (5, 10, 2), (9, 30, 5), (12, 20, 3), (12, 20, 7), (20, 10, 9))]


def _merged_ledgers() -> list[tuple[int, int, int]]:
    # What a merge of four one-ledger buckets holds: 250 entries of each of 4 ledgers, random
    # delays within 60 s, so every segment interleaves the four ledgers row by row.
    rng = random.Random(34)
    return [(BASE_TS + entry + rng.randrange(60_000), ledger, entry) for ledger in range(40, 44)
            for entry in range(250)]


CASES = CASES_V1 + [replace(case, version=version, description=case.description.replace("zlib", "zstd"))
                    for version in (2, 3, 4, 5, 6) for case in CASES_V1] + [
    Case("grouped_small", "8 indexes of three ledgers interleaved by their delays: one segment grouped by "
         "ledger (directory, timestamp steps, entry ids), nothing compressed", 9, 10, 30, _grouped_small,
         compress=False, version=6),
    Case("merged_ledgers", "1,000 random-delay indexes of four ledgers, as a merge leaves them: segments of 300 "
         "grouped by ledger, zstd frames", 10, 40, 43, _merged_ledgers, max_indexes=300, version=6),
    Case("sparse_ledgers", "10 random entries of each of 120 ledgers, random delays: entry 0's shuffled "
         "bitmaps in frames of their own", 8, 1000, 1119, _sparse_ledgers, version=3),
    Case("sparse_ledgers", "10 random entries of each of 120 ledgers, random delays: entry 0's entry-id "
         "lists (three columns) in frames of their own", 8, 1000, 1119, _sparse_ledgers, version=4),
    Case("sparse_ledgers", "10 random entries of each of 120 ledgers, random delays: entry 0 lists the "
         "ledgers and their counts (two columns), their entry ids being the segments' rows", 8, 1000, 1119,
         _sparse_ledgers, version=5),
    Case("sparse_ledgers", "10 random entries of each of 120 ledgers, random delays: version 5's counts, and "
         "segments grouped by ledger", 8, 1000, 1119, _sparse_ledgers, version=6),
]


def _columns(rows: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not rows:
        empty = np.zeros(0, dtype=np.uint64)
        return empty, empty, empty
    ts, ledgers, entries = (np.array(col, dtype=np.uint64) for col in zip(*rows))
    return sort_indexes(ts, ledgers, entries)


def _bitmap_list(positions: list[tuple[int, int]]) -> list[dict]:
    by_ledger: dict[int, list[int]] = {}
    for ledger, entry in positions:
        by_ledger.setdefault(ledger, []).append(entry)
    return [{"ledger_id": ledger, "width": 64 if max(ids) >= 1 << 32 else 32, "entries": sorted(ids)}
            for ledger, ids in sorted(by_ledger.items())]


def _expected(case: Case, rows: list[tuple[int, int, int]], metadata_compressed: bool,
              segment_flags: list[int], properties: dict) -> dict:
    """The content the file must hold, from the sorted input rows alone (and, per segment, the
    writer's choices: compressed or not, and from version 6 grouped by ledger or not)."""
    ts = np.array([r[0] for r in rows], dtype=np.uint64)
    segments: list[dict] = []
    for (lo, hi), flags in zip(cut_segments(ts, case.time_step_ms, case.max_indexes), segment_flags):
        part = rows[lo:hi]
        segment = {"min_timestamp": part[0][0], "max_timestamp": part[-1][0], "count": len(part),
                   "compressed": bool(flags & (FLAG_ZLIB | FLAG_ZSTD))}
        if case.version >= GROUPED_VERSION:
            segment["grouped"] = bool(flags & FLAG_GROUPED)
        if case.version == 1:
            segment["bitmaps"] = _bitmap_list([(ledger, entry) for _, ledger, entry in part])
        segment["indexes"] = [list(r) for r in part]
        segments.append(segment)
    metadata = {"compressed": metadata_compressed, "snapshot_version": case.version, "start_ledger": case.start_ledger,
                "end_ledger": case.end_ledger, "count": len(rows)}
    if case.version >= 2:
        metadata["bitmaps"] = _bitmap_list([(ledger, entry) for _, ledger, entry in rows])
    metadata["segments"] = segments
    return {
        "file": f"{case.file_name}.ledger",
        "description": case.description,
        "segmenting": {"time_step_ms": case.time_step_ms, "max_indexes_per_segment": case.max_indexes},
        "header": {"ledger_id": case.ledger_id, "format_version": 1, "flags": 0},
        "properties": properties,
        "metadata": metadata,
    }


def write_case(case: Case, out_dir: str) -> None:
    """Write ``<name>.ledger`` and ``<name>.json`` for one case into ``out_dir``."""
    ts, ledgers, entries = _columns(case.rows())
    rows = list(zip(ts.tolist(), ledgers.tolist(), entries.tolist()))
    meta, payloads = build_bucket(case.start_ledger, case.end_ledger, ts, ledgers, entries,
                                  time_step_ms=case.time_step_ms, max_indexes_per_segment=case.max_indexes,
                                  compress=case.compress, version=case.version)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bucket(tmp, case.ledger_id, meta, payloads, case.properties, compress=case.compress)
        shutil.move(path, os.path.join(out_dir, f"{case.file_name}.ledger"))
    metadata_compressed = encode_metadata(meta, compress=case.compress)[0] != 0
    properties = dict(case.properties or {})
    properties.update(kind="bucket", bucket_key=meta.key, start_ledger=meta.start_ledger,
                      end_ledger=meta.end_ledger)
    doc = _expected(case, rows, metadata_compressed, [p[0] for p in payloads],
                    dict(sorted(properties.items())))
    # One index or one entry-id list per line: readable, and diffs stay local.
    text = re.sub(r"\[\s*([\d,\s]+?)\s*\]", lambda m: "[" + re.sub(r"\s+", "", m.group(1)) + "]",
                  json.dumps(doc, indent=1))
    with open(os.path.join(out_dir, f"{case.file_name}.json"), "w", encoding="utf-8") as f:
        f.write(text + "\n")


def main(argv: list[str]) -> int:
    out_dir = argv[1] if len(argv) > 1 else HERE
    for case in CASES:
        write_case(case, out_dir)
        print(f"wrote {case.file_name}.ledger")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
