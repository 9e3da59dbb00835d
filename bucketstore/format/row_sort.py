"""Sorting delayed-index rows by (timestamp, ledger, entry), fast.

``np.lexsort`` over three uint64 columns makes three stable passes and then
gathers every column through the permutation: about 0.24 s for a million
rows. But the rows a bucket holds usually span a narrow range in each column
(a few hours of timestamps, a few ledgers, entry ids below a few million), so
the three offsets from each column's minimum fit together in one 64-bit key.
Sorting those keys is one call to numpy's vectorised sort (AVX-512 where the
CPU has it), and the columns come back out of the keys with shifts and masks,
without a gather. When the ranges are too wide for 64 bits, lexsort it is.
"""

from __future__ import annotations

import numpy as np

__all__ = ["sort_rows"]

_U64 = np.dtype("<u8")


def _bits(span: int) -> int:
    return int(span).bit_length()


def sort_rows(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows sorted by (timestamp, ledger, entry), as three new uint64 columns.

    Equal rows stay (callers that must drop them use ``drop_repeats``).
    """
    ts = np.asarray(ts, dtype=_U64)
    ledgers = np.asarray(ledgers, dtype=_U64)
    entries = np.asarray(entries, dtype=_U64)
    n = len(ts)
    if n < 2:
        return ts.copy(), ledgers.copy(), entries.copy()
    t0, l0, e0 = ts.min(), ledgers.min(), entries.min()
    tb = _bits(int(ts.max()) - int(t0))
    lb = _bits(int(ledgers.max()) - int(l0))
    eb = _bits(int(entries.max()) - int(e0))
    if tb + lb + eb > 64:
        order = np.lexsort((entries, ledgers, ts))
        return ts[order], ledgers[order], entries[order]
    # key = (ts - t0) << (lb + eb) | (ledger - l0) << eb | (entry - e0): ordering the keys
    # orders the rows exactly as (ts, ledger, entry) does, since every part is unsigned
    # and fits its field.
    key = ts - t0
    if lb + eb:
        key <<= np.uint64(lb + eb)
    scratch = np.empty(n, dtype=_U64)
    if lb:
        np.subtract(ledgers, l0, out=scratch)
        scratch <<= np.uint64(eb)
        key |= scratch
    if eb:
        np.subtract(entries, e0, out=scratch)
        key |= scratch
    key.sort()
    # Unpack in place where possible: each new column is computed into its own buffer.
    if eb:
        out_e = np.bitwise_and(key, np.uint64((1 << eb) - 1), out=scratch)
        out_e += e0
    else:
        out_e = np.full(n, e0, dtype=_U64)
    if lb:
        out_l = np.right_shift(key, np.uint64(eb))
        out_l &= np.uint64((1 << lb) - 1)
        out_l += l0
    else:
        out_l = np.full(n, l0, dtype=_U64)
    # (When tb is 0, lb + eb may be 64, a shift numpy does not define: the column is constant.)
    if not tb:
        out_t = np.full(n, t0, dtype=_U64)
    else:
        if lb + eb:
            key >>= np.uint64(lb + eb)
        key += t0
        out_t = key
    return out_t, out_l, out_e
