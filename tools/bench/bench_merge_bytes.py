"""Where a merged bucket's bytes go, against the buckets it replaces (issue 28 item 3).

For each workload of ``bench_merge.py`` (A fixed delay, B random delays up to 10 min, S sparse),
four source buckets are cut from the rows at ledger boundaries as a tracker's seals cut them,
and the merged bucket is built from their union, all with the library's ``build_bucket`` and
the default segmentation (300 s, 5,000 indexes). Printed per workload, sources' total against
the merged bucket's: the file, entry 0 (its segment table and its bitmaps), the ledger
framing (8-byte frame and 8-byte trailer slot per entry, header, footer), and the segments
split by column, each column's byte planes compressed alone (so they add up to about, not
exactly, the segments' bytes) next to the planes' zero-order entropy, the floor of a
per-plane entropy coder. The columns are those of the rows in delivery order: a segment the
writer stores grouped by ledger (snapshot version 6, counted) has no ledger column and its
timestamps as steps within each ledger, which the segments' bytes show.

    PYTHONPATH=. python tools/bench/bench_merge_bytes.py [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import msgpack
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_seal import batches  # noqa: E402
from bucketstore.format.compression import ZSTD, Compressor  # noqa: E402
from bucketstore.format.segment_codec import _DIFFERENCE_KINDS, FLAG_GROUPED, _Columns  # noqa: E402
from bucketstore.format.snapshot import build_bucket, encode_metadata, sort_indexes, write_bucket  # noqa: E402

STEP_MS, MAX_INDEXES = 300_000, 5_000
Rows = tuple[np.ndarray, np.ndarray, np.ndarray]


def sources(shape: str, per_bucket: int, seed: int) -> list[Rows]:
    """Four buckets of whole ledgers, each closed once it holds ``per_bucket`` rows (a seal's cut)."""
    parts = list(zip(*batches(shape, per_bucket * 5, seed, ledger_size=per_bucket)))
    at, ledgers, entries = (np.concatenate(parts[i]) for i in (2, 0, 1))
    order = np.argsort(ledgers, kind="stable")
    at, ledgers, entries = at[order], ledgers[order], entries[order]
    out: list[Rows] = []
    lo = 0
    while lo < len(at) and len(out) < 4:
        hi = lo
        while hi < len(at) and hi - lo < per_bucket:
            hi = int(np.searchsorted(ledgers, ledgers[hi], side="right"))
        out.append(sort_indexes(at[lo:hi], ledgers[lo:hi], entries[lo:hi]))
        lo = hi
    return out


def entropy_bytes(plane: bytes) -> float:
    counts = np.bincount(np.frombuffer(plane, np.uint8), minlength=256)
    p = counts[counts > 0] / len(plane)
    return float(-(p * np.log2(p)).sum() * len(plane) / 8)


def breakdown(rows: Rows, directory: str) -> tuple[dict[str, float], str]:
    """The bucket's bytes by part, and its columns' kinds per segment (ARITH/DELTA_U/DELTA_Z/FRAME/PACKED)."""
    ts, ledgers, entries = rows
    meta, payloads = build_bucket(int(ledgers.min()), int(ledgers.max()), ts, ledgers, entries,
                                  time_step_ms=STEP_MS, max_indexes_per_segment=MAX_INDEXES)
    path = write_bucket(directory, 1, meta, payloads, {"tracker": "m"})
    out: dict[str, float] = {"file": os.path.getsize(path), "segments (count)": len(payloads),
                             "  grouped by ledger (count, version 6)": sum(bool(p[0] & FLAG_GROUPED) for p in payloads)}
    os.unlink(path)
    table = [v for s in meta.segments for v in (s.min_timestamp, s.max_timestamp, s.count)]
    squeeze = Compressor(ZSTD)
    out["entry 0"] = len(encode_metadata(meta))
    out["  segment table (alone, zstd)"] = len(squeeze.compress(msgpack.packb(table)))
    out["segment payloads"] = sum(map(len, payloads))
    out["ledger framing"] = out["file"] - out["entry 0"] - out["segment payloads"]
    starts = np.array([0, *np.cumsum([s.count for s in meta.segments])[:-1]], dtype=np.int64)
    counts = np.diff(starts, append=len(ts))
    kinds = []
    for name, column in (("ts", ts), ("ledger", ledgers), ("entry", entries)):
        cols = _Columns(column, starts, counts, True)
        kinds.append(f"{name} {'/'.join(map(str, np.bincount(cols.kind, minlength=5).tolist()))}")
        z = h = 0.0
        for pieces in cols.pieces():
            differences = [pieces[0][0] in _DIFFERENCE_KINDS]  # as the writer compresses this column's planes
            for plane in pieces[1:]:
                z += min(len(squeeze.compress([plane], differences)), len(plane))
                h += entropy_bytes(plane)
        out[f"  {name} column"] = z
        out[f"  {name} column, zero-order entropy"] = h
    return out, ", ".join(kinds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(f"$ PYTHONPATH=. python tools/bench/bench_merge_bytes.py --seed {args.seed}")
    with tempfile.TemporaryDirectory() as tmp:
        for shape, per_bucket in (("A", 50_000), ("B", 50_000), ("S", 20_000)):
            parts = sources(shape, per_bucket, args.seed)
            merged = sort_indexes(*(np.concatenate(c) for c in zip(*parts)))
            before = [breakdown(rows, tmp)[0] for rows in parts]
            after, kinds = breakdown(merged, tmp)
            print(f"\n{shape}: {len(parts)} sources of {', '.join(str(len(r[0])) for r in parts)} rows; "
                  f"merged/sources {after['file'] / sum(b['file'] for b in before):.4f}")
            print(f"  merged columns' kinds (segments ARITH/DELTA_U/DELTA_Z/FRAME/PACKED): {kinds}; "
                  f"first source's: {breakdown(parts[0], tmp)[1]}")
            print(f"  {'':58s} {'sources':>10s} {'merged':>10s} {'diff':>9s}")
            for key in after:
                total = sum(b[key] for b in before)
                print(f"  {key:58s} {total:>10,.0f} {after[key]:>10,.0f} {after[key] - total:>+9,.0f}")


if __name__ == "__main__":
    main()
