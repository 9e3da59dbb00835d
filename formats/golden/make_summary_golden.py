"""Write the catalog summary golden files: ``summary_v1.bin`` (what releases before the prefix
wrote) and ``summary_v2.bin`` (with the prefix), and ``summary.json``, what they decode to.

Run from the repository root: ``python formats/golden/make_summary_golden.py``. The bytes are
the format (``formats/catalog.md``); regenerate only for a deliberate format change, and say why.
"""

from __future__ import annotations

import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))

from bucketstore.format.bucket_summary import encode_summary  # noqa: E402
from bucketstore.format.snapshot import build_bucket  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def golden_bucket():
    """50 rows of ledgers 3 and 4, in segments of 40 and 10 (segment 1 longer than the prefix)."""
    n = 50
    ts = np.array([1_000 + 7 * (i // 2) for i in range(n)], dtype=np.uint64)  # pairs of equal times
    ledgers = np.array([3 + i % 2 for i in range(n)], dtype=np.uint64)
    entries = np.array([100 + i for i in range(n)], dtype=np.uint64)
    meta, _ = build_bucket(3, 4, ts, ledgers, entries, time_step_ms=10**6, max_indexes_per_segment=40)
    return meta, (ts, ledgers, entries)


def main() -> None:
    meta, rows = golden_bucket()
    v2 = encode_summary(meta, 5, 777, rows)
    segments = len(meta.segments)
    v1 = b"\x01" + v2[1:29 + 24 * segments]
    k = struct.unpack_from("<I", v2, 29 + 24 * segments)[0]
    with open(os.path.join(HERE, "summary_v2.bin"), "wb") as f:
        f.write(v2)
    with open(os.path.join(HERE, "summary_v1.bin"), "wb") as f:
        f.write(v1)
    doc = {"ledger_id": 5, "size": 777, "count": meta.count,
           "segments": [[s.min_timestamp, s.max_timestamp, s.count] for s in meta.segments],
           "prefix_rows": k, "prefix_next": int(rows[0][k]),
           "prefix": [[int(c[i]) for c in rows] for i in range(k)]}
    with open(os.path.join(HERE, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
