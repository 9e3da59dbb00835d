"""Bytes per index and codec rates of bucket snapshots, against Pulsar's protobuf layout.

Two workloads of 50,000 indexes over 2 ledgers of consecutive entry ids,
publish times rising 1 ms a message, cut 5,000 indexes / 300,000 ms a segment:

* A, fixed delay: deliver_at = publish time + a constant;
* B, random delay: deliver_at = publish time + U[0, 10 min) (seeded), sorted.

For each: the whole sealed file on disk (header, entry 0, segments, framing,
trailer), segments and entry 0 separately, and the encode/decode rates of each
in M idx/s; then the same content in Pulsar's layout (``SnapshotSegment`` of
``DelayedIndex`` protobufs, ``SnapshotMetadata`` with run-optimised 32-bit
portable roaring bitmaps, as 3.x writes them), computed exactly by a small
protobuf encoder below that produces the real bytes. BookKeeper's own entry
framing is not counted for Pulsar, so the comparison favours it slightly.

    PYTHONPATH=. python tools/bench/bench_codec.py [--indexes 50000] [--seed 195] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
from pyroaring import BitMap

from bucketstore.format.segment_codec import decode_segment, encode_segment
from bucketstore.format.snapshot import (BucketMetadata, SegmentMetadata, cut_segments, decode_metadata, encode_metadata,
                                  segment_bitmaps, sort_indexes, write_bucket)

TIME_STEP_MS = 300_000
MAX_PER_SEGMENT = 5_000
TARGETS = {"A": 0.5, "B": 6.0}
TARGET_RATE = 5.0  # M idx/s, encode and decode
BASE_TS = 1_700_000_000_000


def workload(name: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted (timestamp, ledger, entry) columns of workload A or B."""
    i = np.arange(n, dtype=np.uint64)
    half = np.uint64((n + 1) // 2)
    ledgers = np.where(i < half, 1, 2).astype(np.uint64)
    entries = np.where(i < half, i, i - half).astype(np.uint64)
    publish = np.uint64(BASE_TS) + i
    if name == "A":
        return sort_indexes(publish + np.uint64(60_000), ledgers, entries)
    delay = np.random.default_rng(seed).integers(0, 600_000, n).astype(np.uint64)
    return sort_indexes(publish + delay, ledgers, entries)


# -- Pulsar's layout: a minimal exact protobuf encoder ----------------------------------------------
def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _field_bytes(tag: int, payload: bytes | bytearray, out: bytearray) -> None:
    out.append(tag)
    _varint(len(payload), out)
    out += payload


def pulsar_segment(ts: list[int], ledgers: list[int], entries: list[int]) -> bytes:
    """``SnapshotSegment { repeated DelayedIndex indexes = 1 }``, every index's three fields present."""
    out = bytearray()
    msg = bytearray()
    for t, ledger, entry in zip(ts, ledgers, entries):
        msg.clear()
        msg.append(0x08)  # timestamp = 1, varint
        _varint(t, msg)
        msg.append(0x10)  # ledger_id = 2
        _varint(ledger, msg)
        msg.append(0x18)  # entry_id = 3
        _varint(entry, msg)
        _field_bytes(0x0A, msg, out)
    return bytes(out)


def pulsar_metadata(segments: list[SegmentMetadata]) -> bytes:
    """``SnapshotMetadata { repeated SnapshotSegmentMetadata metadata_list = 1 }``."""
    out = bytearray()
    for seg in segments:
        msg = bytearray()
        for ledger, bm in sorted(seg.bitmaps.items()):
            pulsar_bm = BitMap(bm)
            pulsar_bm.run_optimize()
            entry = bytearray([0x08])  # map entry: key = 1 (uint64), value = 2 (bytes)
            _varint(ledger, entry)
            _field_bytes(0x12, pulsar_bm.serialize(), entry)
            _field_bytes(0x0A, entry, msg)  # delayed_index_bit_map = 1
        msg.append(0x10)  # max_schedule_timestamp = 2
        _varint(seg.max_timestamp, msg)
        msg.append(0x18)  # min_schedule_timestamp = 3
        _varint(seg.min_timestamp, msg)
        _field_bytes(0x0A, msg, out)
    return bytes(out)


# -- measuring ---------------------------------------------------------------------------------------
def best_of(repeat: int, fn: Callable[[], object]) -> tuple[float, object]:
    """Fastest of ``repeat`` runs (seconds) and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def measure(name: str, n: int, seed: int, repeat: int) -> dict[str, float]:
    ts, ledgers, entries = workload(name, n, seed)
    cuts = cut_segments(ts, TIME_STEP_MS, MAX_PER_SEGMENT)

    def encode_segments() -> list[bytes]:
        return [encode_segment(ts[a:b], ledgers[a:b], entries[a:b]) for a, b in cuts]

    def encode_entry0() -> bytes:
        metas = [SegmentMetadata(int(ts[a]), int(ts[b - 1]), b - a, segment_bitmaps(ledgers[a:b], entries[a:b]))
                 for a, b in cuts]
        return encode_metadata(BucketMetadata(1, 2, n, metas))

    seg_enc, payloads = best_of(repeat, encode_segments)
    meta_enc, entry0 = best_of(repeat, encode_entry0)
    seg_dec, _ = best_of(repeat, lambda: [decode_segment(p, b - a) for p, (a, b) in zip(payloads, cuts)])
    meta_dec, meta = best_of(repeat, lambda: decode_metadata(entry0))
    with tempfile.TemporaryDirectory() as tmp:
        file_size = os.path.getsize(write_bucket(tmp, 1, meta, payloads))

    columns = (ts.tolist(), ledgers.tolist(), entries.tolist())
    pulsar_seg_enc, pulsar_segs = best_of(max(1, repeat // 2), lambda: [
        pulsar_segment(columns[0][a:b], columns[1][a:b], columns[2][a:b]) for a, b in cuts])
    pulsar_meta_enc, pulsar_entry0 = best_of(repeat, lambda: pulsar_metadata(meta.segments))
    return {
        "segments": len(cuts),
        "file": file_size / n, "seg": sum(map(len, payloads)) / n, "entry0": len(entry0) / n,
        "seg_enc": n / seg_enc / 1e6, "seg_dec": n / seg_dec / 1e6,
        "meta_enc": n / meta_enc / 1e6, "meta_dec": n / meta_dec / 1e6,
        "p_total": (sum(map(len, pulsar_segs)) + len(pulsar_entry0)) / n,
        "p_seg": sum(map(len, pulsar_segs)) / n, "p_entry0": len(pulsar_entry0) / n,
        "p_seg_enc": n / pulsar_seg_enc / 1e6, "p_meta_enc": n / pulsar_meta_enc / 1e6,
    }


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def report(name: str, n: int, r: dict[str, float]) -> list[str]:
    target = TARGETS[name]
    rate_ok = min(r["seg_enc"], r["seg_dec"]) >= TARGET_RATE
    return [
        f"workload {name}: {n} indexes, {r['segments']} segments",
        f"  bucketstore  whole file {r['file']:7.3f} B/idx  (target <= {target})  {_mark(r['file'] <= target)}",
        f"               segments   {r['seg']:7.3f} B/idx  encode {r['seg_enc']:6.2f}  decode {r['seg_dec']:6.2f} "
        f"M idx/s  (target >= {TARGET_RATE})  {_mark(rate_ok)}",
        f"               entry 0    {r['entry0']:7.3f} B/idx  encode {r['meta_enc']:6.2f}  decode {r['meta_dec']:6.2f} "
        f"M idx/s",
        f"  pulsar       total      {r['p_total']:7.3f} B/idx  ({r['p_total'] / r['file']:.0f}x bucketstore's file)",
        f"               segments   {r['p_seg']:7.3f} B/idx  encode {r['p_seg_enc']:6.2f} M idx/s (pure-Python protobuf)",
        f"               entry 0    {r['p_entry0']:7.3f} B/idx  encode {r['p_meta_enc']:6.2f} M idx/s (from built bitmaps)",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--indexes", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=195)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"$ PYTHONPATH=. python tools/bench/bench_codec.py --indexes {args.indexes} --seed {args.seed} "
          f"--repeat {args.repeat}")
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}; rates are the best of {args.repeat} runs")
    for name in ("A", "B"):
        print("\n".join(report(name, args.indexes, measure(name, args.indexes, args.seed, args.repeat))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
