"""Bytes per index and codec rates of bucket snapshots (the current version, and v1 for comparison), against Pulsar's layout.

Workloads of 50,000 indexes, publish times rising 1 ms a message, cut 5,000
indexes / 300,000 ms a segment:

* A, fixed delay: 2 ledgers of consecutive entry ids, deliver_at = publish + a constant;
* B, random delay: the same with deliver_at = publish + U[0, 10 min) (seeded);
* S, sparse: ledgers of 10,000 entries of which 1 % (chosen at random) are
  delayed by U[0, 10 min), so the bucket spans ~500 ledgers with ~100 indexes each;
* Sf, sparse with a fixed delay.

Encode is ``build_bucket`` (sort check, cuts, segments, bitmaps) plus entry 0;
decode is entry 0 plus every segment.

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

from bucketstore.format.segment_codec import decode_segment
from bucketstore.format.snapshot import (SNAPSHOT_VERSION, SegmentMetadata, build_bucket, cut_segments, decode_metadata,
                                         encode_metadata, sort_indexes, write_bucket)

TIME_STEP_MS = 300_000
MAX_PER_SEGMENT = 5_000
TARGETS = {"A": 0.05, "B": 3.5, "S": 4.0, "Sf": 4.0}
TARGET_ENCODE = 5.0  # M idx/s
TARGET_DECODE = 20.0
BASE_TS = 1_700_000_000_000


def workload(name: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted (timestamp, ledger, entry) columns of workload A, B, S or Sf."""
    rng = np.random.default_rng(seed)
    if name in ("S", "Sf"):
        per_ledger = 10_000
        chosen = np.flatnonzero(rng.random(int(n / 0.01) + per_ledger) < 0.01)[:n].astype(np.uint64)
        ledgers = np.uint64(1000) + chosen // np.uint64(per_ledger)
        entries = chosen % np.uint64(per_ledger)
        publish = np.uint64(BASE_TS) + chosen
        delay = np.uint64(60_000) if name == "Sf" else rng.integers(0, 600_000, len(chosen)).astype(np.uint64)
        return sort_indexes(publish + delay, ledgers, entries)
    i = np.arange(n, dtype=np.uint64)
    half = np.uint64((n + 1) // 2)
    ledgers = np.where(i < half, 1, 2).astype(np.uint64)
    entries = np.where(i < half, i, i - half).astype(np.uint64)
    publish = np.uint64(BASE_TS) + i
    if name == "A":
        return sort_indexes(publish + np.uint64(60_000), ledgers, entries)
    delay = rng.integers(0, 600_000, n).astype(np.uint64)
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
    start, end = int(ledgers.min()), int(ledgers.max())
    cuts = cut_segments(ts, TIME_STEP_MS, MAX_PER_SEGMENT)

    def encode(version: int) -> tuple[bytes, list[bytes]]:
        meta, payloads = build_bucket(start, end, ts, ledgers, entries, time_step_ms=TIME_STEP_MS,
                                      max_indexes_per_segment=MAX_PER_SEGMENT, version=version)
        return encode_metadata(meta), payloads

    def decode(entry0: bytes, payloads: list[bytes]) -> None:
        meta = decode_metadata(entry0)
        for payload, seg in zip(payloads, meta.segments):
            decode_segment(payload, seg.count)

    enc, (entry0, payloads) = best_of(repeat, lambda: encode(SNAPSHOT_VERSION))
    dec, _ = best_of(repeat, lambda: decode(entry0, payloads))
    meta = decode_metadata(entry0)
    v1_entry0, v1_payloads = encode(1)
    with tempfile.TemporaryDirectory() as tmp:
        file_size = os.path.getsize(write_bucket(tmp, 1, meta, payloads))
        v1_file = os.path.getsize(write_bucket(tmp, 2, decode_metadata(v1_entry0), v1_payloads))

    columns = (ts.tolist(), ledgers.tolist(), entries.tolist())
    v1_meta = decode_metadata(v1_entry0)
    pulsar_seg_enc, pulsar_segs = best_of(max(1, repeat // 2), lambda: [
        pulsar_segment(columns[0][a:b], columns[1][a:b], columns[2][a:b]) for a, b in cuts])
    pulsar_entry0 = pulsar_metadata(v1_meta.segments)
    return {
        "segments": len(cuts), "ledgers": len(meta.bitmaps),
        "file": file_size / n, "seg": sum(map(len, payloads)) / n, "entry0": len(entry0) / n,
        "enc": n / enc / 1e6, "dec": n / dec / 1e6,
        "v1_file": v1_file / n, "v1_seg": sum(map(len, v1_payloads)) / n, "v1_entry0": len(v1_entry0) / n,
        "p_total": (sum(map(len, pulsar_segs)) + len(pulsar_entry0)) / n,
        "p_seg": sum(map(len, pulsar_segs)) / n, "p_entry0": len(pulsar_entry0) / n,
        "p_seg_enc": n / pulsar_seg_enc / 1e6,
    }


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def report(name: str, n: int, r: dict[str, float]) -> list[str]:
    target = TARGETS[name]
    return [
        f"workload {name}: {n} indexes, {r['segments']} segments, {r['ledgers']} ledgers",
        f"  v{SNAPSHOT_VERSION} whole file {r['file']:7.3f} B/idx  (target <= {target})  {_mark(r['file'] <= target)}"
        f"   segments {r['seg']:.3f}  entry 0 {r['entry0']:.3f}",
        f"     encode {r['enc']:6.2f} M idx/s (target >= {TARGET_ENCODE}) {_mark(r['enc'] >= TARGET_ENCODE)}"
        f"   decode {r['dec']:6.2f} M idx/s (target >= {TARGET_DECODE}) {_mark(r['dec'] >= TARGET_DECODE)}",
        f"  v1 whole file {r['v1_file']:7.3f} B/idx   segments {r['v1_seg']:.3f}  entry 0 {r['v1_entry0']:.3f}",
        f"  pulsar total  {r['p_total']:7.3f} B/idx  ({r['p_total'] / r['file']:.0f}x v{SNAPSHOT_VERSION}'s file)"
        f"   segments {r['p_seg']:.3f}  entry 0 {r['p_entry0']:.3f}  (segment encode {r['p_seg_enc']:.2f} M idx/s, "
        "pure-Python protobuf)",
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
    for name in ("A", "B", "S", "Sf"):
        print("\n".join(report(name, args.indexes, measure(name, args.indexes, args.seed, args.repeat))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
