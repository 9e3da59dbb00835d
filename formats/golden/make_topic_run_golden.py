"""Write the golden topic run (``topic_run.run``) and its content (``topic_run.json``).

Run from the repository root::

    PYTHONPATH=. python formats/golden/make_topic_run_golden.py

The run holds 9,000 rows of topic 7, run 3 (two segments: 8,192 and 808 rows): three ledgers,
one of them with entry ids past 2**32 (a 64-bit bitmap), delivery times spread over an hour,
several rows at one time, and seqs out of entry order. ``tests/format/test_topic_run.py`` reads
it back as the JSON says (its rows by digest) and encodes the same rows again byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOPIC, RUN = 7, 3


def golden_rows() -> np.ndarray:
    """The rows, (n, 4) uint64 in delivery order: deliver_at, ledger, entry, seq."""
    n = 9_000
    i = np.arange(n, dtype=np.uint64)
    ledgers = np.where(i < 4_000, 10, np.where(i < 8_000, 11, 12)).astype(np.uint64)
    entries = np.where(ledgers == 12, (1 << 32) + i, i % 4_000).astype(np.uint64)
    seqs = i * np.uint64(3) % np.uint64(n + 7) + np.uint64(100)
    ts = np.uint64(1_700_000_000_000) + (i * np.uint64(7_919)) % np.uint64(3_600_000) // np.uint64(5) * np.uint64(5)
    rows = np.stack([ts, ledgers, entries, seqs], axis=1)
    return rows[np.lexsort((rows[:, 3], rows[:, 2], rows[:, 1], rows[:, 0]))]


def main() -> None:
    from bucketstore.format.topic_run import encode_run
    rows = golden_rows()
    data = encode_run(TOPIC, RUN, rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])
    with open(os.path.join(HERE, "topic_run.run"), "wb") as f:
        f.write(data)
    with open(os.path.join(HERE, "topic_run.json"), "w", encoding="utf-8") as f:
        json.dump(describe(rows), f, indent=1)
        f.write("\n")


def describe(rows: np.ndarray) -> dict:
    """The run's content in brief: its ids, its rows' count, digest (SHA-256 of the (n, 4)
    little-endian u64 array) and first and last rows, and its segments' rows and times."""
    from bucketstore.format.topic_run import SEGMENT_ROWS
    segments = [{"rows": len(rows[lo:lo + SEGMENT_ROWS]), "first_ts": int(rows[lo, 0]),
                 "last_ts": int(rows[min(lo + SEGMENT_ROWS, len(rows)) - 1, 0])}
                for lo in range(0, len(rows), SEGMENT_ROWS)]
    return {"topic_id": TOPIC, "run_id": RUN, "rows": len(rows),
            "sha256": hashlib.sha256(np.ascontiguousarray(rows, dtype="<u8").tobytes()).hexdigest(),
            "first_rows": rows[:3].tolist(), "last_rows": rows[-3:].tolist(), "segments": segments}


if __name__ == "__main__":
    main()
